package protocol_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/mlsched/mlsched/shared/protocol"
)

// outcomeSeeds are the fuzz seeds of FuzzDecodeOutcome, and the table of
// TestDecodeOutcomeMatchesJSON: what workers send, and the corners of
// encoding/json's rules (null, duplicates, case folding, escapes, bad
// UTF-8, numbers, nesting, trailing data).
var outcomeSeeds = []string{
	`{"task_id":"t-1","type":"echo","attempt":1,"model":"m1","node":"n1","status":"success","output":{"x":[1,2.5,"y",null,true]},"latency_ms":0.125}`,
	`{"task_id":"t-1","type":"echo","attempt":2,"model":"m1","node":"n1","status":"model_error","error":"boom \"quoted\"\n","latency_ms":3,"task":{"id":"t-1","type":"echo","payload":"p"}}`,
	`{"task_id":"t-1","type":"echo","attempt":1,"model":"m1","node":"n1","status":"timeout","error":"late","latency_ms":41.5,"batch_wait_ms":30.25,"deadline_left_ms":-2.5}`,
	`{"batch_wait_ms":"1"}`, `{"deadline_left_ms":null}`, `{"batch_wait_ms":1e400}`,
	``, ` `, `null`, ` null `, `nul`, `{}`, `[]`, `"x"`, `1`, `true`, `{"task_id":"a"} {}`, `{"task_id":"a"}x`, `{"task_id":"a",}`,
	`{"task_id":null,"attempt":null,"latency_ms":null,"output":null,"task":null}`,
	`{"task_id":"a","task_id":null}`, `{"task_id":"a","task_id":"b"}`, `{"output":1,"output":[2]}`,
	`{"TASK_ID":"a","Type":"t","ATTEMPT":3}`, "{\"tas\u212a_id\":\"kelvin\"}", "{\"task_\u0131d\":\"dotless\"}", "{\"\u017ftatus\":\"success\"}",
	`{"task_\u0069d":"escaped key"}`, `{"task_id":"\u00e9\ud83d\ude00\ud800x\udc00\u0000\/\b\f\n\r\t"}`,
	"{\"task_id\":\"\xff\xfe bad utf-8 \xed\xa0\x80\"}", "{\"task_id\":\"tab\tin string\"}", "{\"task_id\":\"a\\x\"}",
	`{"attempt":1.0}`, `{"attempt":1e2}`, `{"attempt":-0}`, `{"attempt":-12}`, `{"attempt":9223372036854775807}`,
	`{"attempt":9223372036854775808}`, `{"attempt":-9223372036854775808}`, `{"attempt":0123}`, `{"attempt":"1"}`,
	`{"latency_ms":1e400}`, `{"latency_ms":-1e-400}`, `{"latency_ms":1.5E+3}`, `{"latency_ms":.5}`, `{"latency_ms":1.}`,
	`{"latency_ms":-}`, `{"latency_ms":true}`, `{"status":1}`, `{"status":"lost"}`, `{"status":"succes\u0073"}`,
	`{"status":{"a":1}}`, `{"error":["x"]}`, `{"model":false}`, `{"unknown":{"deep":[{"a":[]}]},"node":"n"}`,
	`{"output":"\ud83d"}`, `{"task":{"id":"a","payload":[1,{"b":"c"}]}}`, "\t{ \"node\" :\r\n\"n\" }\n",
	`{"a":[1,2,]}`, `{"a":{"b"}}`, `{"a":tru}`, `{"a":nulll}`, `{"a" 1}`, `{1:2}`, `{"a":1`, `{"a":"unterminated`,
	`{"a":"\u12"}`, `{"a":"\u12g4"}`, `{"output":[[[[[[[[[[]]]]]]]]]]}`, `"\u0000"`,
}

func FuzzDecodeOutcome(f *testing.F) {
	for _, s := range outcomeSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) { checkOutcomeDecode(t, data) })
}

// TestDecodeOutcomeMatchesJSON runs the fuzz seeds and a few shapes too
// big for them (nesting at encoding/json's depth limit).
func TestDecodeOutcomeMatchesJSON(t *testing.T) {
	for _, s := range outcomeSeeds {
		checkOutcomeDecode(t, []byte(s))
	}
	for _, depth := range []int{9999, 10000, 10001} {
		deep := `{"output":` + strings.Repeat("[", depth-1) + strings.Repeat("]", depth-1) + `}`
		checkOutcomeDecode(t, []byte(deep))
		deep = `{"x":` + strings.Repeat(`{"a":`, depth-1) + "1" + strings.Repeat("}", depth-1) + `}`
		checkOutcomeDecode(t, []byte(deep))
	}
	if _, err := protocol.DecodeOutcome([]byte(`{"attempt":1.5}`)); err == nil || !strings.Contains(err.Error(), "attempt") {
		t.Errorf("a type error names the field: %v", err)
	}
	var je *json.SyntaxError
	if _, err := protocol.DecodeOutcome([]byte(`{"a":x}`)); !errors.As(err, &je) || je.Offset != 6 {
		t.Errorf("a syntax error carries its offset: %v", err)
	}
}

// checkOutcomeDecode holds DecodeOutcome to json.Unmarshal: the same
// inputs refused, the same fields decoded.
func checkOutcomeDecode(t *testing.T, data []byte) {
	t.Helper()
	var want protocol.Outcome
	werr := json.Unmarshal(data, &want)
	got, err := protocol.DecodeOutcome(data)
	if (werr == nil) != (err == nil) {
		t.Fatalf("%q: encoding/json says %v, DecodeOutcome says %v", data, werr, err)
	}
	if werr != nil {
		return
	}
	if got.TaskID != want.TaskID || got.Type != want.Type || got.Attempt != want.Attempt || got.Model != want.Model ||
		got.Node != want.Node || got.Status != want.Status || got.Error != want.Error ||
		math.Float64bits(got.LatencyMs) != math.Float64bits(want.LatencyMs) ||
		math.Float64bits(got.BatchWaitMs) != math.Float64bits(want.BatchWaitMs) ||
		math.Float64bits(got.DeadlineLeftMs) != math.Float64bits(want.DeadlineLeftMs) ||
		!sameRaw(got.Output, want.Output) || !sameRaw(got.Task, want.Task) {
		t.Fatalf("%q:\n got  %+v\n want %+v", data, got, want)
	}
}

func sameRaw(a, b json.RawMessage) bool { return (a == nil) == (b == nil) && bytes.Equal(a, b) }

// The raw members alias the message and cannot be appended into it.
func TestDecodeOutcomeAliases(t *testing.T) {
	data := []byte(`{"output":[1],"task":{"id":"a"},"status":"success"}`)
	o, err := protocol.DecodeOutcome(data)
	if err != nil {
		t.Fatal(err)
	}
	_ = append(o.Output, 'x')
	if string(data) != `{"output":[1],"task":{"id":"a"},"status":"success"}` {
		t.Fatalf("an append to Output wrote into the message: %s", data)
	}
	if o.Status != protocol.OutcomeSuccess || string(o.Task) != `{"id":"a"}` {
		t.Fatalf("decoded %+v", o)
	}
}

// FuzzDecodeTaskHead holds DecodeTaskHead to json.Unmarshal into the
// fields it reads.
func FuzzDecodeTaskHead(f *testing.F) {
	for _, s := range outcomeSeeds {
		f.Add([]byte(s))
	}
	for _, s := range []string{`{"id":"a1","type":"echo","payload":{"x":[1,2,{"y":null}]},"models":["m1"],"timeout_ms":100}`,
		`{"ID":"a","TYPE":"b","Payload":"p"}`, `{"id":1}`, `{"id":"a","priority":5,"tenant":"t1"}`, `{"priority":"5"}`,
		`{"priority":1.5}`, `{"tenant":null,"priority":null}`, `{"payload":null}`, `{"id":"a","id":"b","payload":1,"payload":[2]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var want struct {
			ID       string          `json:"id"`
			Type     string          `json:"type"`
			Payload  json.RawMessage `json:"payload"`
			Priority int             `json:"priority"`
			Tenant   string          `json:"tenant"`
		}
		werr := json.Unmarshal(data, &want)
		h, err := protocol.DecodeTaskHead(data)
		if (werr == nil) != (err == nil) {
			t.Fatalf("%q: encoding/json says %v, DecodeTaskHead says %v", data, werr, err)
		}
		if werr == nil && (h.ID != want.ID || h.Type != want.Type || !sameRaw(h.Payload, want.Payload) ||
			h.Priority != want.Priority || h.Tenant != want.Tenant) {
			t.Fatalf("%q: got %+v, want %+v", data, h, want)
		}
	})
}

var resultSeeds = []string{
	`{"id":"t-1","type":"echo","status":"succeeded","model":"m1","node":"n1","attempts":1,"output":{"x":[1,"y"]},"latency_ms":7.5,"history":[{"attempt":1,"model":"m1","node":"n1","status":"success","latency_ms":3.2}],"finished_at":"2026-12-01T08:00:00.123456789Z"}`,
	`{"id":"t-2","type":"echo","status":"failed","attempts":3,"error":"all failed","error_code":"attempts_exhausted","latency_ms":12,"history":[{"attempt":1,"model":"a","node":"n","status":"timeout","error":"slow","latency_ms":5},{"attempt":2},null],"finished_at":"2026-12-01T08:00:00+01:00"}`,
	`{"history":[{"attempt":1,"status":"expired","latency_ms":0,"batch_wait_ms":12.5,"deadline_left_ms":20}]}`, `{"history":[{"batch_wait_ms":[]}]}`,
	`{"history":null}`, `{"history":[]}`, `{"history":{}}`, `{"history":[1]}`, `{"history":[{"attempt":"1"}]}`, `{"history":[{"x":[{}]}]}`,
	`{"history":[{"error":"a"},{"error":"b"}],"history":[{}],"history":[{},{}]}`, `{"history":[{"error":"a"}],"history":[]}`,
	`{"finished_at":null}`, `{"finished_at":"x"}`, `{"finished_at":1}`, `{"finished_at":{}}`, `{"finished_at":"2026-12-01T08:00:00Z","finished_at":null}`,
	`{"finished_at":"2026-13-01T08:00:00Z"}`, `{"finished_at":"2026-12-01T08:00:00\u005a"}`, `{"STATUS":"failed","Error_Code":"x"}`,
	`{"attempts":1.5}`, `{"output":null}`, `null`, `[]`, `{"id":"a"} x`,
}

// FuzzDecodeResult holds DecodeResult to json.Unmarshal into a Result.
func FuzzDecodeResult(f *testing.F) {
	for _, s := range append(resultSeeds, outcomeSeeds...) {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) { checkResultDecode(t, data) })
}

func TestDecodeResultMatchesJSON(t *testing.T) {
	for _, s := range append(resultSeeds, outcomeSeeds...) {
		checkResultDecode(t, []byte(s))
	}
	deep := `{"history":[{"x":` + strings.Repeat("[", 9996) + strings.Repeat("]", 9996) + `}]}`
	checkResultDecode(t, []byte(deep))
	deep = `{"history":[{"x":` + strings.Repeat("[", 9997) + strings.Repeat("]", 9997) + `}]}`
	checkResultDecode(t, []byte(deep))
}

func checkResultDecode(t *testing.T, data []byte) {
	t.Helper()
	var want protocol.Result
	werr := json.Unmarshal(data, &want)
	got, err := protocol.DecodeResult(data)
	if (werr == nil) != (err == nil) {
		t.Fatalf("%q: encoding/json says %v, DecodeResult says %v", data, werr, err)
	}
	if werr != nil {
		return
	}
	if !got.FinishedAt.Equal(want.FinishedAt) || got.FinishedAt.Location().String() != want.FinishedAt.Location().String() {
		t.Fatalf("%q: finished_at %v, want %v", data, got.FinishedAt, want.FinishedAt)
	}
	got.FinishedAt, want.FinishedAt = time.Time{}, time.Time{}
	if !reflect.DeepEqual(got, want) || (got.History == nil) != (want.History == nil) {
		t.Fatalf("%q:\n got  %#v\n want %#v", data, got, want)
	}
}

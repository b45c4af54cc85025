package protocol_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/mlsched/mlsched/shared/protocol"
)

func models(n int) string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf(`"m%d"`, i)
	}
	return "[" + strings.Join(names, ",") + "]"
}

// TestDecodeTaskBadInput feeds DecodeTask every kind of bad input and checks
// the specific code, and whether the rejection can still be keyed by id.
func TestDecodeTaskBadInput(t *testing.T) {
	t.Parallel()
	small := protocol.Limits{MaxPayloadBytes: 64}
	cases := []struct {
		name   string
		in     string
		lim    protocol.Limits
		code   protocol.Code // "" means accepted
		wantID string        // the id a rejected result can be keyed by ("" = unkeyable)
	}{
		// Not JSON, or not an object.
		{"empty", ``, protocol.Limits{}, protocol.CodeMalformedJSON, ""},
		{"white space", " \n\t ", protocol.Limits{}, protocol.CodeMalformedJSON, ""},
		{"garbage", `hello`, protocol.Limits{}, protocol.CodeMalformedJSON, ""},
		{"truncated object", `{"id":"a1","type":"echo"`, protocol.Limits{}, protocol.CodeMalformedJSON, "a1"},
		{"trailing garbage", `{"id":"a1","type":"echo"} x`, protocol.Limits{}, protocol.CodeMalformedJSON, "a1"},
		{"two objects", `{"id":"a1","type":"echo"}{}`, protocol.Limits{}, protocol.CodeMalformedJSON, "a1"},
		{"array", `[{"id":"a1","type":"echo"}]`, protocol.Limits{}, protocol.CodeNotObject, ""},
		{"string", `"a1"`, protocol.Limits{}, protocol.CodeNotObject, ""},
		{"number", `42`, protocol.Limits{}, protocol.CodeNotObject, ""},
		{"null", `null`, protocol.Limits{}, protocol.CodeNotObject, ""},
		{"bool", `true`, protocol.Limits{}, protocol.CodeNotObject, ""},
		{"bad array", `[1,`, protocol.Limits{}, protocol.CodeMalformedJSON, ""},
		{"BOM", "\uFEFF{\"id\":\"a1\",\"type\":\"echo\"}", protocol.Limits{}, protocol.CodeMalformedJSON, ""},

		// Encoding.
		{"invalid UTF-8 in payload", "{\"id\":\"a1\",\"type\":\"echo\",\"payload\":\"\xff\"}", protocol.Limits{}, protocol.CodeInvalidUTF8, "a1"},
		{"invalid UTF-8 in id", "{\"id\":\"a\xff\",\"type\":\"echo\"}", protocol.Limits{}, protocol.CodeInvalidUTF8, ""},
		{"invalid UTF-8, not JSON", "\xc3\x28", protocol.Limits{}, protocol.CodeInvalidUTF8, ""},

		// The id.
		{"missing id", `{"type":"echo"}`, protocol.Limits{}, protocol.CodeMissingID, ""},
		{"empty id", `{"id":"","type":"echo"}`, protocol.Limits{}, protocol.CodeMissingID, ""},
		{"null id", `{"id":null,"type":"echo"}`, protocol.Limits{}, protocol.CodeMissingID, ""},
		{"id star", `{"id":"a*","type":"echo"}`, protocol.Limits{}, protocol.CodeInvalidID, ""},
		{"id gt", `{"id":">","type":"echo"}`, protocol.Limits{}, protocol.CodeInvalidID, ""},
		{"id dot", `{"id":"a.b","type":"echo"}`, protocol.Limits{}, protocol.CodeInvalidID, ""},
		{"id space", `{"id":"a b","type":"echo"}`, protocol.Limits{}, protocol.CodeInvalidID, ""},
		{"id tab", `{"id":"a\tb","type":"echo"}`, protocol.Limits{}, protocol.CodeInvalidID, ""},
		{"id newline", `{"id":"a\nb","type":"echo"}`, protocol.Limits{}, protocol.CodeInvalidID, ""},
		{"id NUL", `{"id":"a\u0000b","type":"echo"}`, protocol.Limits{}, protocol.CodeInvalidID, ""},
		{"id non-ASCII", `{"id":"café","type":"echo"}`, protocol.Limits{}, protocol.CodeInvalidID, ""},
		{"id too long", `{"id":"` + strings.Repeat("x", 129) + `","type":"echo"}`, protocol.Limits{}, protocol.CodeInvalidID, ""},
		{"id at the limit", `{"id":"` + strings.Repeat("x", 128) + `","type":"echo"}`, protocol.Limits{}, "", strings.Repeat("x", 128)},
		{"id longer limit", `{"id":"` + strings.Repeat("x", 200) + `","type":"echo"}`, protocol.Limits{MaxIDLen: 256}, "", strings.Repeat("x", 200)},

		// The type.
		{"missing type", `{"id":"a1"}`, protocol.Limits{}, protocol.CodeMissingType, "a1"},
		{"empty type", `{"id":"a1","type":""}`, protocol.Limits{}, protocol.CodeMissingType, "a1"},
		{"type with dot", `{"id":"a1","type":"a.b"}`, protocol.Limits{}, protocol.CodeInvalidType, "a1"},
		{"type wildcard", `{"id":"a1","type":"*"}`, protocol.Limits{}, protocol.CodeInvalidType, "a1"},
		{"type too long", `{"id":"a1","type":"` + strings.Repeat("t", 65) + `"}`, protocol.Limits{}, protocol.CodeInvalidType, "a1"},

		// Size.
		{"payload over the limit", `{"id":"big","type":"echo","payload":"` + strings.Repeat("x", 64) + `"}`, small, protocol.CodePayloadTooLarge, "big"},
		{"over the limit, unkeyable", `{"type":"echo","payload":"` + strings.Repeat("x", 64) + `"}`, small, protocol.CodePayloadTooLarge, ""},
		{"over the limit, not JSON", strings.Repeat("x", 65), small, protocol.CodePayloadTooLarge, ""},
		{"over the limit, long id allowed", `{"id":"` + strings.Repeat("i", 150) + `","payload":"` + strings.Repeat("x", 64) + `"}`,
			protocol.Limits{MaxPayloadBytes: 200, MaxIDLen: 160}, protocol.CodePayloadTooLarge, strings.Repeat("i", 150)},
		{"over the limit, id over a smaller limit", `{"id":"` + strings.Repeat("i", 40) + `","payload":"` + strings.Repeat("x", 64) + `"}`,
			protocol.Limits{MaxPayloadBytes: 100, MaxIDLen: 16}, protocol.CodePayloadTooLarge, ""},
		{"just at the limit", `{"id":"a1","type":"echo","payload":"` + strings.Repeat("x", 26) + `"}`, small, "", "a1"},
		{"default limit", `{"id":"a1","type":"echo","payload":"` + strings.Repeat("x", 1<<20) + `"}`, protocol.Limits{}, protocol.CodePayloadTooLarge, "a1"},

		// Numbers.
		{"negative timeout", `{"id":"a1","type":"echo","timeout_ms":-1}`, protocol.Limits{}, protocol.CodeInvalidTimeout, "a1"},
		{"timeout too large", `{"id":"a1","type":"echo","timeout_ms":3600001}`, protocol.Limits{}, protocol.CodeInvalidTimeout, "a1"},
		{"negative max_attempts", `{"id":"a1","type":"echo","max_attempts":-2}`, protocol.Limits{}, protocol.CodeInvalidMaxAttempts, "a1"},
		{"max_attempts too large", `{"id":"a1","type":"echo","max_attempts":11}`, protocol.Limits{}, protocol.CodeInvalidMaxAttempts, "a1"},
		{"negative max_latency_ms", `{"id":"a1","type":"echo","max_latency_ms":-5}`, protocol.Limits{}, protocol.CodeInvalidField, "a1"},
		{"min_success_rate above 1", `{"id":"a1","type":"echo","min_success_rate":1.5}`, protocol.Limits{}, protocol.CodeInvalidField, "a1"},
		{"min_success_rate negative", `{"id":"a1","type":"echo","min_success_rate":-0.1}`, protocol.Limits{}, protocol.CodeInvalidField, "a1"},

		// The allow-list.
		{"10k models", `{"id":"a1","type":"echo","models":` + models(10_000) + `}`, protocol.Limits{}, protocol.CodeTooManyModels, "a1"},
		{"64 models", `{"id":"a1","type":"echo","models":` + models(64) + `}`, protocol.Limits{}, "", "a1"},
		{"empty model name", `{"id":"a1","type":"echo","models":["m1",""]}`, protocol.Limits{}, protocol.CodeUnknownModel, "a1"},
		{"model with wildcard", `{"id":"a1","type":"echo","models":["m.*"]}`, protocol.Limits{}, protocol.CodeUnknownModel, "a1"},

		// Fields of the wrong JSON type.
		{"id is a number", `{"id":7,"type":"echo"}`, protocol.Limits{}, protocol.CodeInvalidID, ""},
		{"id is an object", `{"id":{"x":1},"type":"echo"}`, protocol.Limits{}, protocol.CodeInvalidID, ""},
		{"type is a number", `{"id":"a1","type":3}`, protocol.Limits{}, protocol.CodeInvalidField, "a1"},
		{"timeout is a string", `{"id":"a1","type":"echo","timeout_ms":"100"}`, protocol.Limits{}, protocol.CodeInvalidField, "a1"},
		{"timeout is a float", `{"id":"a1","type":"echo","timeout_ms":1.5}`, protocol.Limits{}, protocol.CodeInvalidField, "a1"},
		{"timeout overflows", `{"id":"a1","type":"echo","timeout_ms":1e30}`, protocol.Limits{}, protocol.CodeInvalidField, "a1"},
		{"max_attempts is a bool", `{"id":"a1","type":"echo","max_attempts":true}`, protocol.Limits{}, protocol.CodeInvalidField, "a1"},
		{"models is a string", `{"id":"a1","type":"echo","models":"m1"}`, protocol.Limits{}, protocol.CodeInvalidField, "a1"},
		{"models has a number", `{"id":"a1","type":"echo","models":["m1",2]}`, protocol.Limits{}, protocol.CodeInvalidField, "a1"},
		{"min_success_rate is a string", `{"id":"a1","type":"echo","min_success_rate":"high"}`, protocol.Limits{}, protocol.CodeInvalidField, "a1"},

		// Flow control (docs/policies.md, "Flow control").
		{"priority too high", `{"id":"a1","type":"echo","priority":11}`, protocol.Limits{}, protocol.CodeInvalidPriority, "a1"},
		{"priority too low", `{"id":"a1","type":"echo","priority":-11}`, protocol.Limits{}, protocol.CodeInvalidPriority, "a1"},
		{"priority is a string", `{"id":"a1","type":"echo","priority":"high"}`, protocol.Limits{}, protocol.CodeInvalidField, "a1"},
		{"priority is a float", `{"id":"a1","type":"echo","priority":1.5}`, protocol.Limits{}, protocol.CodeInvalidField, "a1"},
		{"tenant with a dot", `{"id":"a1","type":"echo","tenant":"a.b"}`, protocol.Limits{}, protocol.CodeInvalidTenant, "a1"},
		{"tenant with a space", `{"id":"a1","type":"echo","tenant":"a b"}`, protocol.Limits{}, protocol.CodeInvalidTenant, "a1"},
		{"tenant too long", `{"id":"a1","type":"echo","tenant":"` + strings.Repeat("t", 65) + `"}`, protocol.Limits{}, protocol.CodeInvalidTenant, "a1"},
		{"tenant is a number", `{"id":"a1","type":"echo","tenant":3}`, protocol.Limits{}, protocol.CodeInvalidField, "a1"},
		{"negative deadline", `{"id":"a1","type":"echo","deadline_ms":-1}`, protocol.Limits{}, protocol.CodeInvalidDeadline, "a1"},
		{"deadline past a day", `{"id":"a1","type":"echo","deadline_ms":86400001}`, protocol.Limits{}, protocol.CodeInvalidDeadline, "a1"},
		{"deadline is a string", `{"id":"a1","type":"echo","deadline_ms":"5s"}`, protocol.Limits{}, protocol.CodeInvalidField, "a1"},
		{"negative size", `{"id":"a1","type":"echo","size":-1}`, protocol.Limits{}, protocol.CodeInvalidField, "a1"},
		{"size past the limit", `{"id":"a1","type":"echo","size":2e12}`, protocol.Limits{}, protocol.CodeInvalidField, "a1"},
		{"size is a string", `{"id":"a1","type":"echo","size":"12"}`, protocol.Limits{}, protocol.CodeInvalidField, "a1"},
		{"size accepted", `{"id":"a1","type":"echo","size":1536.5}`, protocol.Limits{}, "", "a1"},
		{"flow control accepted", `{"id":"a1","type":"echo","priority":-10,"tenant":"acme-1","deadline_ms":5000}`, protocol.Limits{}, "", "a1"},
		{"priority 10 accepted", `{"id":"a1","type":"echo","priority":10}`, protocol.Limits{}, "", "a1"},

		// Accepted.
		{"minimal", `{"id":"a1","type":"echo"}`, protocol.Limits{}, "", "a1"},
		{"surrounding white space", " \n{\"id\":\"a1\",\"type\":\"echo\"}\n", protocol.Limits{}, "", "a1"},
		{"full", `{"id":"a-1_B:2","type":"ocr","payload":{"url":"s3://x","pages":[1,2]},"models":["m1","m2"],
			"timeout_ms":3600000,"max_attempts":10,"max_latency_ms":250,"min_success_rate":0.9}`, protocol.Limits{}, "", "a-1_B:2"},
		{"unknown fields ignored", `{"id":"a1","type":"echo","prio":"high","extra":{"deep":[1,2]},"v":2}`, protocol.Limits{}, "", "a1"},
		{"null optional fields", `{"id":"a1","type":"echo","payload":null,"models":null,"timeout_ms":null}`, protocol.Limits{}, "", "a1"},
		{"zero values", `{"id":"a1","type":"echo","timeout_ms":0,"max_attempts":0,"models":[]}`, protocol.Limits{}, "", "a1"},
		{"payload string", `{"id":"a1","type":"echo","payload":"just text"}`, protocol.Limits{}, "", "a1"},
		{"unicode payload", `{"id":"a1","type":"echo","payload":"żółw 🐢"}`, protocol.Limits{}, "", "a1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			task, err := protocol.DecodeTask([]byte(tc.in), tc.lim)
			if tc.code == "" {
				if err != nil {
					t.Fatalf("rejected a valid task: %v", err)
				}
			} else {
				var pe *protocol.Error
				if !errors.As(err, &pe) {
					t.Fatalf("err = %v (%T), want *protocol.Error %s", err, err, tc.code)
				}
				if pe.Code != tc.code {
					t.Fatalf("code = %s (%v), want %s", pe.Code, err, tc.code)
				}
				if pe.Msg == "" || len(pe.Error()) > 1024 {
					t.Errorf("unhelpful or unbounded message: %q", pe.Error())
				}
				if !errors.Is(err, &protocol.Error{Code: tc.code}) {
					t.Errorf("errors.Is does not match the code")
				}
			}
			if task.ID != tc.wantID {
				t.Errorf("ID = %q, want %q", task.ID, tc.wantID)
			}
		})
	}
}

// TestDecodeTaskRecoversIDAndType: a message that cannot be decoded whole
// keeps the id and type readable before the break, so that its rejection
// is a result under that id, of the type the producer sent (issue 40: the
// truncated task below went only to the dead-letter stream, which a
// producer cannot read, and rejected results came back with "type":"").
func TestDecodeTaskRecoversIDAndType(t *testing.T) {
	t.Parallel()
	small := protocol.Limits{MaxPayloadBytes: 64}
	cases := []struct {
		name, in         string
		lim              protocol.Limits
		code             protocol.Code
		wantID, wantType string
	}{
		{"truncated at the payload", `{"id":"bad-1","type":"classify","payload":`, protocol.Limits{}, protocol.CodeMalformedJSON, "bad-1", "classify"},
		{"truncated in the payload", `{"id":"bad-2","type":"classify","payload":{"text":"hi`, protocol.Limits{}, protocol.CodeMalformedJSON, "bad-2", "classify"},
		{"type after the break", `{"id":"bad-3","payload":{,"type":"classify"}`, protocol.Limits{}, protocol.CodeMalformedJSON, "bad-3", ""},
		{"id after the break", `{"type":"classify","payload":nope,"id":"bad-4"}`, protocol.Limits{}, protocol.CodeMalformedJSON, "", ""},
		{"nested id is not the task's", `{"payload":{"id":"inner"},"type":"classify"`, protocol.Limits{}, protocol.CodeMalformedJSON, "", ""},
		{"last id counts", `{"id":"first","id":"second","type":"classify"`, protocol.Limits{}, protocol.CodeMalformedJSON, "second", "classify"},
		{"id is an array", `{"id":["a"],"type":"classify"`, protocol.Limits{}, protocol.CodeMalformedJSON, "", ""},
		{"unusable type", `{"id":"bad-5","type":"a.b"`, protocol.Limits{}, protocol.CodeMalformedJSON, "bad-5", ""},
		{"type is an object", `{"id":"bad-6","type":{"a":"b"},"timeout_ms":"x"}`, protocol.Limits{}, protocol.CodeInvalidField, "bad-6", ""},
		{"wrong field type", `{"id":"bad-7","type":"classify","timeout_ms":"100"}`, protocol.Limits{}, protocol.CodeInvalidField, "bad-7", "classify"},
		{"invalid UTF-8", "{\"id\":\"bad-8\",\"type\":\"classify\",\"payload\":\"\xff\"}", protocol.Limits{}, protocol.CodeInvalidUTF8, "bad-8", "classify"},
		{"too large", `{"id":"bad-9","type":"classify","payload":"` + strings.Repeat("x", 64) + `"}`, small, protocol.CodePayloadTooLarge, "bad-9", "classify"},
		{"id is a number", `{"id":42,"type":"classify","payload":{}}`, protocol.Limits{}, protocol.CodeInvalidID, "", ""},
		{"id is a number, another field wrong first", `{"timeout_ms":"x","id":42,"type":"classify"}`, protocol.Limits{}, protocol.CodeInvalidField, "", ""},
		{"rejected by Validate keeps its type", `{"id":"bad-10","type":"classify","timeout_ms":-1}`, protocol.Limits{}, protocol.CodeInvalidTimeout, "bad-10", "classify"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			task, err := protocol.DecodeTask([]byte(tc.in), tc.lim)
			if got := protocol.CodeOf(err); got != tc.code {
				t.Fatalf("code = %q (%v), want %q", got, err, tc.code)
			}
			if task.ID != tc.wantID || task.Type != tc.wantType {
				t.Errorf("id, type = %q, %q, want %q, %q", task.ID, task.Type, tc.wantID, tc.wantType)
			}
		})
	}
}

func TestDecodeTaskFields(t *testing.T) {
	t.Parallel()
	task, err := protocol.DecodeTask([]byte(`{"id":"a1","type":"ocr","payload":{"k":[1,2]},"models":["m1","m2"],
		"timeout_ms":500,"max_attempts":3,"max_latency_ms":250,"min_success_rate":0.9,"ignored":1,
		"priority":-3,"tenant":"acme","deadline_ms":5000}`), protocol.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	want := protocol.Task{ID: "a1", Type: "ocr", Payload: json.RawMessage(`{"k":[1,2]}`), Models: []string{"m1", "m2"},
		TimeoutMs: 500, MaxAttempts: 3, MaxLatencyMs: 250, MinSuccessRate: 0.9, Priority: -3, Tenant: "acme", DeadlineMs: 5000}
	if fmt.Sprint(task) != fmt.Sprint(want) {
		t.Fatalf("got %+v\nwant %+v", task, want)
	}
}

func TestValidateKeepsOrClearsID(t *testing.T) {
	t.Parallel()
	bad := protocol.Task{ID: "x.y", Type: "echo"}
	if err := bad.Validate(protocol.Limits{}); protocol.CodeOf(err) != protocol.CodeInvalidID || bad.ID != "" {
		t.Fatalf("invalid id: err %v, ID %q (want cleared)", err, bad.ID)
	}
	keyable := protocol.Task{ID: "x", Type: "echo", TimeoutMs: -1}
	if err := keyable.Validate(protocol.Limits{}); protocol.CodeOf(err) != protocol.CodeInvalidTimeout || keyable.ID != "x" {
		t.Fatalf("bad timeout: err %v, ID %q (want kept)", err, keyable.ID)
	}
}

func TestValidToken(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"a", "A-b_c:1", "~!@#$%^&()+=", strings.Repeat("z", 8)} {
		if err := protocol.ValidToken(s, 8+4); err != nil {
			t.Errorf("%q: %v", s, err)
		}
	}
	for _, s := range []string{"", "a.b", "*", ">", "a b", "a\x7f", "é", strings.Repeat("z", 13)} {
		if err := protocol.ValidToken(s, 12); err == nil {
			t.Errorf("%q accepted", s)
		}
	}
}

func TestErrorMatching(t *testing.T) {
	t.Parallel()
	err := fmt.Errorf("wrapped: %w", protocol.Errorf(protocol.CodeMissingID, "task has no id"))
	if !errors.Is(err, protocol.ErrMissingID) || errors.Is(err, protocol.ErrInvalidID) {
		t.Fatal("errors.Is does not match on the code")
	}
	if protocol.CodeOf(err) != protocol.CodeMissingID || protocol.CodeOf(errors.New("x")) != "" {
		t.Fatal("CodeOf")
	}
}

package protocol_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/mlsched/mlsched/shared/protocol"
)

// FuzzDecodeTask checks DecodeTask's contract on arbitrary bytes: it never
// panics; a rejection is a *protocol.Error with a code, and any id it still
// carries can key a result subject; an accepted task re-validates and
// survives a marshal/decode round trip unchanged.
// Seeds: the f.Add calls below and testdata/fuzz/FuzzDecodeTask.
func FuzzDecodeTask(f *testing.F) {
	for _, s := range []string{
		``, `null`, `[]`, `"x"`, `{}`, `{"id":"a1"}`, `{"id":"a1","type":"echo"}`,
		`{"id":"a1","type":"echo","payload":{"x":[1,2,{"y":null}]},"models":["m1","m2"],"timeout_ms":100,"max_attempts":3}`,
		`{"id":"a1","type":"echo","max_latency_ms":5,"min_success_rate":0.5,"unknown":true}`,
		`{"id":"a.b","type":"echo"}`, `{"id":"a1","type":"*"}`, `{"id":7,"type":"echo"}`,
		`{"id":"a1","type":"echo","timeout_ms":-1}`, `{"id":"a1","type":"echo","models":"m"}`,
		"{\"id\":\"a1\",\"type\":\"echo\",\"payload\":\"\xff\"}", `{"id":"a1","type":"echo","payload":"<&>\u2028"}`,
		`{"ID":"a1","TYPE":"echo"}`, `{"id":"a1","id":"a2","type":"echo"}`, `{"id":"a1","type":"echo"} {}`,
		// the single pass's edges (decodeTaskFast)
		` {"id" : "a1" , "type":"echo", "payload" : [ 1 , -0.5e+3, "\u00e9\n", {"k":[]}, {} , true, false, null] } `,
		`{"id":"a1","type":"echo","payload":null}`, `{"id":"a1","type":"echo","models":[]}`, `{"id":"a1","type":"echo","models":null}`,
		`{"id":"a1","type":"echo","timeout_ms":1.0}`, `{"id":"a1","type":"echo","timeout_ms":1e3}`, `{"id":"a1","type":"echo","max_attempts":01}`,
		`{"id":"a1","type":"echo","timeout_ms":99999999999999999999}`, `{"id":"a1","type":"echo","min_success_rate":1e999}`,
		`{"id":"a\u0031","type":"echo"}`, `{"Id":"a1","type":"echo"}`, `{"id":"a1","type":"echo","payload":"é"}`,
		`{"id":"a1","type":"echo","payload":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]`,
		`{"id":"a1","type":"echo","payload":{"a":1,}}`, `{"id":"a1","type":"echo","payload":[1,]}`, `{"id":"a1","type":"echo","x":"\q"}`,
		`{"id":"a1","type":"echo","priority":9,"tenant":"acme","deadline_ms":5000}`, `{"id":"a1","type":"echo","priority":-11}`,
		`{"id":"a1","type":"echo","priority":1e1}`, `{"id":"a1","type":"echo","tenant":"a\u0062"}`, `{"id":"a1","type":"echo","tenant":null}`,
		`{"id":"a1","type":"echo","deadline_ms":-5,"Priority":3}`, `{"id":"a1","type":"echo","priority":99999999999999999999}`,
		`{"id":"a1","type":"echo","models":["m1","m2"],"models":[null]}`, `{"id":"a1","type":"echo","models":["m1"],"models":null,"models":["m2",null]}`,
		`{"id":"a1","type":"echo","models":[1]}`, `{"id":"a1","type":"echo","models":["m1",]}`, `{"id":"a1","type":"echo","payload":{"a":"\u00e9"},"PAYLOAD":[1]}`,
		`{"id":"a1","type":"echo",}`, `{"id":"a1" "type":"echo"}`, `{"id":"a1","type":"echo","payload":tru}`, `{"id":"a1","type":"echo","payload":-}`,
		// what only encoding/json may answer (codec.go): member names through
		// the long s and the Kelvin sign, raw and escaped
		"{\"id\":\"a1\",\"type\":\"echo\",\"max_attempt\u017f\":2}", `{"id":"a1","type":"echo","max_attempt\u017F":2,"tenant":"\u212a"}`,
		"{\"id\":\"a1\",\"type\":\"echo\",\"tenant\":\"\u212a\",\"deadline_m\u017f\":9}",
	} {
		f.Add([]byte(s))
	}
	small := protocol.Limits{MaxPayloadBytes: 96, MaxIDLen: 24, MaxModels: 4}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, lim := range []protocol.Limits{{}, small} {
			checkDecode(t, data, lim)
		}
	})
}

func checkDecode(t *testing.T, data []byte, lim protocol.Limits) {
	maxID := lim.MaxIDLen
	if maxID == 0 {
		maxID = protocol.DefaultLimits.MaxIDLen
	}
	task, err := protocol.DecodeTask(data, lim)
	// The fast decoder (decodeTaskFast, codec.go) must agree with
	// encoding/json, in the task and in the error, and accept only valid
	// JSON.
	ref, refErr := protocol.DecodeTaskReflect(data, lim)
	if !reflect.DeepEqual(task, ref) || fmt.Sprint(err) != fmt.Sprint(refErr) {
		t.Fatalf("DecodeTask and encoding/json disagree on %q:\n %+v, %v\n %+v, %v", data, task, err, ref, refErr)
	}
	if _, ok := protocol.DecodeTaskFast(data); ok && (!json.Valid(data) || !utf8.Valid(data)) {
		t.Fatalf("the single pass accepted invalid input %q", data)
	}
	if task.ID != "" {
		if verr := protocol.ValidToken(task.ID, maxID); verr != nil {
			t.Fatalf("returned an id that cannot key a result: %q: %v (err %v)", task.ID, verr, err)
		}
	}
	if err != nil {
		var pe *protocol.Error
		if !errors.As(err, &pe) || pe.Code == "" || pe.Msg == "" {
			t.Fatalf("error %v (%T) is not a *protocol.Error with a code and a message", err, err)
		}
		return
	}
	again := task
	if err := again.Validate(lim); err != nil {
		t.Fatalf("accepted task does not re-validate: %v", err)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(task); err != nil {
		t.Fatalf("accepted task does not marshal: %v", err)
	}
	back, err := protocol.DecodeTask(buf.Bytes(), protocol.Limits{MaxPayloadBytes: 1 << 30, MaxIDLen: lim.MaxIDLen, MaxModels: lim.MaxModels})
	if err != nil {
		t.Fatalf("re-marshalled task %s is rejected: %v", buf.Bytes(), err)
	}
	var want bytes.Buffer
	if len(task.Payload) > 0 {
		if err := json.Compact(&want, task.Payload); err != nil {
			t.Fatalf("accepted payload is not JSON: %v", err)
		}
	}
	if back.ID != task.ID || back.Type != task.Type || back.TimeoutMs != task.TimeoutMs || back.MaxAttempts != task.MaxAttempts ||
		back.MaxLatencyMs != task.MaxLatencyMs || back.MinSuccessRate != task.MinSuccessRate ||
		len(back.Models) != len(task.Models) || !bytes.Equal(back.Payload, want.Bytes()) {
		t.Fatalf("round trip changed the task:\n in  %+v\n out %+v", task, back)
	}
	for i := range task.Models {
		if back.Models[i] != task.Models[i] {
			t.Fatalf("round trip changed models %v -> %v", task.Models, back.Models)
		}
	}
}

// TestDecodeTaskNestingLimit: a payload nested past encoding/json's limit
// is refused as encoding/json refuses it, one within it accepted.
func TestDecodeTaskNestingLimit(t *testing.T) {
	for _, depth := range []int{9998, 9999, 10000} {
		data := []byte(`{"id":"a1","type":"echo","payload":` + strings.Repeat("[", depth) + strings.Repeat("]", depth) + `}`)
		checkDecode(t, data, protocol.Limits{})
	}
}

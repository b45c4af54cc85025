package protocol_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"

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

package protocol_test

import (
	"bytes"
	"encoding/json"
	"math"
	"testing"
	"time"

	"github.com/mlsched/mlsched/shared/protocol"
)

// FuzzAppendJSON holds Outcome.AppendJSON and Result.AppendJSON to
// json.Marshal: the same bytes, or both an error.
func FuzzAppendJSON(f *testing.F) {
	f.Add("t-1", "echo", 1, "m1", "n1", "success", "", 0.125, []byte(`{"x":[1,2.5,"y",null,true]}`), []byte(nil), int64(1_800_000_000), int64(123_456_789), 0)
	f.Add("t-<&>", "e\u2028\u2029", -3, "m\x00\x1f\"\\", "n\xff\xfe", "model_error", "boom\n\t\b\f\r", 1e21,
		[]byte(" [ 1 , \"a b <&> \u2028\" ,{ } ] "), []byte(`{"id":"t","s":"\"\\<"}`), int64(-62135596801), int64(0), 3600)
	f.Add("", "", 0, "", "", "", "", 1e-7, []byte(`nul`), []byte(`{"a":}`), int64(0), int64(0), -5400)
	f.Add("a", "b", math.MaxInt, "c", "d", "lost", "e", math.Inf(1), []byte(`1`), []byte(`"x"`), int64(253402300800), int64(5), 59)
	f.Add("a", "b", 1, "c", "d", "timeout", "", -0.0, []byte(`1e400`), []byte(`-0.0e-0`), int64(1), int64(-1), 86400)
	f.Fuzz(func(t *testing.T, id, typ string, attempt int, model, node, status, errStr string, latency float64,
		output, task []byte, unixSec, nsec int64, zoneSec int) {
		o := protocol.Outcome{TaskID: id, Type: typ, Attempt: attempt, Model: model, Node: node,
			Status: protocol.OutcomeStatus(status), Output: output, Error: errStr, LatencyMs: latency, Task: task}
		want, werr := json.Marshal(o)
		got, err := o.AppendJSON([]byte("prefix"))
		same(t, "outcome", got, err, want, werr)

		r := protocol.Result{ID: id, Type: typ, Status: protocol.Status(status), Model: model, Node: node, Attempts: attempt,
			Output: output, Error: errStr, ErrorCode: protocol.Code(node), LatencyMs: latency,
			FinishedAt: time.Unix(unixSec, nsec).In(time.FixedZone("z", zoneSec%100000))}
		if len(task) > 0 {
			r.History = []protocol.Attempt{{Attempt: attempt, Model: model, Node: node, Status: protocol.OutcomeStatus(typ),
				Error: string(task), LatencyMs: latency / 3}, {Attempt: 2}}
		}
		want, werr = json.Marshal(r)
		got, err = r.AppendJSON([]byte("prefix"))
		same(t, "result", got, err, want, werr)
	})
}

func same(t *testing.T, what string, got []byte, err error, want []byte, werr error) {
	t.Helper()
	if (err == nil) != (werr == nil) {
		t.Fatalf("%s: json.Marshal says %v, AppendJSON says %v", what, werr, err)
	}
	if err == nil && !bytes.Equal(got, append([]byte("prefix"), want...)) {
		t.Fatalf("%s:\n got  %s\n want prefix%s", what, got, want)
	}
}

// BenchmarkEncodeOutcome compares what a worker pays to encode an outcome
// (and the dispatcher a result): json.Marshal against AppendJSON.
func BenchmarkEncodeOutcome(b *testing.B) {
	o := protocol.Outcome{TaskID: "task-000123", Type: "classify", Attempt: 1, Model: "bert-v2", Node: "node-3",
		Status: protocol.OutcomeSuccess, Output: json.RawMessage(`{"label":"spam","score":0.97,"text":"is this spam?"}`), LatencyMs: 3.217}
	r := protocol.Result{ID: o.TaskID, Type: o.Type, Status: protocol.StatusSucceeded, Model: o.Model, Node: o.Node,
		Attempts: 1, Output: o.Output, LatencyMs: 7.5, FinishedAt: time.Now().UTC(),
		History: []protocol.Attempt{{Attempt: 1, Model: o.Model, Node: o.Node, Status: o.Status, LatencyMs: o.LatencyMs}}}
	b.Run("outcome/json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(o); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("outcome/AppendJSON", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := o.AppendJSON(make([]byte, 0, 256)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("result/json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("result/AppendJSON", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := r.AppendJSON(make([]byte, 0, 384)); err != nil {
				b.Fatal(err)
			}
		}
	})
}

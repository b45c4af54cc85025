package protocol_test

import (
	"testing"
	"time"

	"github.com/mlsched/mlsched/shared/protocol"
)

func TestSealSurvivesHeadersAndCatchesEdits(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	d := protocol.Dispatch{TaskID: "t1", Type: "x", Model: "m", Node: "n1", Attempt: 2, MaxAttempts: 3,
		Deadline: time.Now().Add(time.Minute), Timeout: 1500 * time.Millisecond, Submitted: time.Now(), Submission: "42",
		History: []protocol.Attempt{{Attempt: 1, Model: "m0", Node: "n0", Status: protocol.OutcomeTimeout, LatencyMs: 12.345}},
		TaskSum: protocol.TaskSum([]byte(`{"id":"t1"}`))}
	d.Seal = d.ComputeSeal(key)
	back, err := protocol.ParseDispatch(protocol.OutcomeHeader(d.Header(), "n1"))
	if err != nil {
		t.Fatal(err)
	}
	if !back.SealValid(key) {
		t.Fatal("a sealed dispatch does not verify after its headers round trip")
	}
	if back.SealValid([]byte("another key")) {
		t.Fatal("verifies under another key")
	}
	for _, edit := range []func(*protocol.Dispatch){
		func(d *protocol.Dispatch) { d.TaskID = "t2" },
		func(d *protocol.Dispatch) { d.Node = "n2" },
		func(d *protocol.Dispatch) { d.Model = "m2" },
		func(d *protocol.Dispatch) { d.Attempt = 3 },
		func(d *protocol.Dispatch) { d.Submission = "43" },
		func(d *protocol.Dispatch) { d.TaskSum = protocol.TaskSum([]byte("x")) },
		func(d *protocol.Dispatch) { d.History = nil },
		func(d *protocol.Dispatch) { d.Seal = "zz" },
	} {
		c := back
		edit(&c)
		if c.SealValid(key) {
			t.Errorf("an edited dispatch verifies: %+v", c)
		}
	}
}

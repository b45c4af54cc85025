package bench

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/mlsched/mlsched/shared/natstest"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// TestPublisher submits a paced phase to a real server: every task is
// stored once, valid, of the requested payload size, with its id as
// Nats-Msg-Id, and the pacing spreads the submissions over the phase.
func TestPublisher(t *testing.T) {
	t.Parallel()
	srv := natstest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := topology.Ensure(ctx, srv.JS, topology.Config{}); err != nil {
		t.Fatal(err)
	}
	const n, rate, payload = 50, 500, 100
	tr := newTracker("p-", n, 0)
	if err := newPublisher(srv.JS, payload).run(ctx, tr, rate); err != nil {
		t.Fatal(err)
	}
	first, last, _ := tr.span()
	// Task 49 may not leave before 49/500 s after task 0.
	if d := time.Duration(last - first); d < 90*time.Millisecond {
		t.Errorf("50 tasks at 500/s were submitted within %v", d)
	}

	s, err := srv.JS.Stream(ctx, topology.StreamTasks)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != n {
		t.Fatalf("stream holds %d tasks, want %d", info.State.Msgs, n)
	}
	for seq := uint64(1); seq <= n; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		task, err := protocol.DecodeTask(m.Data, protocol.Limits{})
		if err != nil {
			t.Fatalf("task %d: %v", seq, err)
		}
		if task.ID != tr.id(int(seq-1)) || task.Type != taskType || m.Header.Get(protocol.HdrMsgID) != task.ID {
			t.Errorf("task %d: id %q type %q msg-id %q", seq, task.ID, task.Type, m.Header.Get(protocol.HdrMsgID))
		}
		if len(task.Payload) != payload || !json.Valid(task.Payload) {
			t.Errorf("task %d: payload %d bytes (valid JSON: %v), want %d", seq, len(task.Payload), json.Valid(task.Payload), payload)
		}
	}

	// A second run of the same ids is deduplicated by the stream.
	if err := newPublisher(srv.JS, payload).run(ctx, newTracker("p-", n, 0), 0); err != nil {
		t.Fatal(err)
	}
	if info, err = s.Info(ctx); err != nil {
		t.Fatal(err)
	} else if info.State.Msgs != n {
		t.Errorf("after republishing the same ids the stream holds %d tasks, want %d", info.State.Msgs, n)
	}
}

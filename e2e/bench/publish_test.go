package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
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
	for _, grouped := range []bool{false, true} {
		t.Run(fmt.Sprint("group_commit=", grouped), func(t *testing.T) {
			t.Parallel()
			testPublisher(t, grouped)
		})
	}
}

// testPublisher is TestPublisher through the group commit when grouped:
// each task is then stored once, in whatever order its batch took.
func testPublisher(t *testing.T, grouped bool) {
	srv := natstest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := topology.Ensure(ctx, srv.JS, topology.Config{}); err != nil {
		t.Fatal(err)
	}
	const n, rate, payload = 50, 500, 100
	publisher := func() *publisher {
		p := newPublisher(srv.JS, payload)
		if grouped {
			stop, err := p.groupCommit(ctx, srv.NC)
			if err != nil {
				t.Fatal(err)
			}
			if p.group == nil {
				t.Fatal("no group commit on a file task stream that takes atomic batches")
			}
			t.Cleanup(stop)
		}
		return p
	}
	tr := newTracker("p-", n, 0)
	if err := publisher().run(ctx, tr, rate); err != nil {
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
	seen := map[string]bool{}
	for seq := uint64(1); seq <= n; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		task, err := protocol.DecodeTask(m.Data, protocol.Limits{})
		if err != nil {
			t.Fatalf("task %d: %v", seq, err)
		}
		want := tr.id(int(seq - 1))
		if grouped {
			want = task.ID
			if seen[task.ID] || !strings.HasPrefix(task.ID, "p-") {
				t.Errorf("task %d: id %q stored twice or not ours", seq, task.ID)
			}
			seen[task.ID] = true
		}
		if task.ID != want || task.Type != taskType || m.Header.Get(protocol.HdrMsgID) != task.ID {
			t.Errorf("task %d: id %q type %q msg-id %q", seq, task.ID, task.Type, m.Header.Get(protocol.HdrMsgID))
		}
		if len(task.Payload) != payload || !json.Valid(task.Payload) {
			t.Errorf("task %d: payload %d bytes (valid JSON: %v), want %d", seq, len(task.Payload), json.Valid(task.Payload), payload)
		}
	}

	// A second run of the same ids is deduplicated by the stream.
	if err := publisher().run(ctx, newTracker("p-", n, 0), 0); err != nil {
		t.Fatal(err)
	}
	if info, err = s.Info(ctx); err != nil {
		t.Fatal(err)
	} else if info.State.Msgs != n {
		t.Errorf("after republishing the same ids the stream holds %d tasks, want %d", info.State.Msgs, n)
	}
}

// The bench group-commits as an operator would: in durable mode (sync_interval
// always), not in fast mode; MLSCHED_GROUP_COMMIT in DispatcherEnv decides.
func TestGroupCommitFollowsTheMode(t *testing.T) {
	for _, c := range []struct {
		sync string
		env  map[string]string
		want bool
	}{
		{"", nil, true},
		{"always", nil, true},
		{"2m", nil, false},
		{"2m", map[string]string{"MLSCHED_GROUP_COMMIT": "true"}, true},
		{"always", map[string]string{"MLSCHED_GROUP_COMMIT": "false"}, false},
		{"always", map[string]string{"MLSCHED_GROUP_COMMIT": "bogus"}, false},
	} {
		if got := (Options{SyncInterval: c.sync, DispatcherEnv: c.env}).groupCommit(); got != c.want {
			t.Errorf("sync %q env %v: group commit %v, want %v", c.sync, c.env, got, c.want)
		}
	}
}

package dispatcher_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/shared/natstest"
	"github.com/mlsched/mlsched/shared/topology"
)

// A task stream created by an older version, without size limits, gets
// the configured ones when a dispatcher starts (MaxBytes, MaxMsgSize,
// DiscardNew; a stream update that keeps its messages); other roles, which
// may not update streams, leave it as it is, and so does the dispatcher
// with a limit an operator set on a stream mlsched does not bound.
func TestExistingTaskStreamGetsLimits(t *testing.T) {
	t.Parallel()
	ns := natstest.New(t)
	ctx := t.Context()
	old := topology.Streams(topology.Config{})[0]
	if old.Name != topology.StreamTasks {
		t.Fatalf("first stream is %s", old.Name)
	}
	old.MaxBytes, old.MaxMsgSize, old.Discard = 0, 0, jetstream.DiscardOld
	if _, err := ns.JS.CreateStream(ctx, old); err != nil {
		t.Fatal(err)
	}
	// an operator's own limit on a stream mlsched does not bound stays
	outcomes := topology.Streams(topology.Config{})[2]
	if outcomes.Name != topology.StreamOutcomes {
		t.Fatalf("third stream is %s", outcomes.Name)
	}
	outcomes.MaxBytes = 32 << 20
	if _, err := ns.JS.CreateStream(ctx, outcomes); err != nil {
		t.Fatal(err)
	}

	// what a worker or a producer does at start: check, not update
	if err := topology.Ensure(ctx, ns.JS, topology.Config{}); err != nil {
		t.Fatal(err)
	}
	info := func() jetstream.StreamConfig {
		t.Helper()
		s, err := ns.JS.Stream(ctx, topology.StreamTasks)
		if err != nil {
			t.Fatal(err)
		}
		return s.CachedInfo().Config
	}
	if c := info(); c.MaxBytes != -1 || c.MaxMsgSize != -1 || c.Discard != jetstream.DiscardOld {
		t.Fatalf("a non-owner changed the limits: %d %d %v", c.MaxBytes, c.MaxMsgSize, c.Discard)
	}
	// a task of a type nobody serves stays in the stream meanwhile
	if _, err := ns.JS.Publish(ctx, topology.TaskSubject("nobody"), []byte(`{"id":"kept","type":"nobody"}`)); err != nil {
		t.Fatal(err)
	}

	cfg := testConfig(ns.URL)
	cfg.NoNodeWait = time.Minute
	cfg.TasksMaxBytes = 64 << 20 // MLSCHED_TASKS_MAX_BYTES
	runDispatcher(t, cfg)
	deadline := time.Now().Add(20 * time.Second)
	for c := info(); c.MaxBytes != 64<<20 || c.MaxMsgSize != 4<<20 || c.Discard != jetstream.DiscardNew; c = info() {
		if time.Now().After(deadline) {
			t.Fatalf("limits not applied: max_bytes=%d max_msg_size=%d discard=%v", c.MaxBytes, c.MaxMsgSize, c.Discard)
		}
		time.Sleep(10 * time.Millisecond)
	}
	s, err := ns.JS.Stream(ctx, topology.StreamTasks)
	if err != nil {
		t.Fatal(err)
	}
	if si, err := s.Info(ctx); err != nil || si.State.Msgs != 1 {
		t.Fatalf("stream state after the update: %+v, %v; want the waiting task kept", si, err)
	}
	// the empty outcome stream moves to memory (the attempt streams'
	// default storage), re-created with the operator's limit
	for {
		ost, err := ns.JS.Stream(ctx, topology.StreamOutcomes)
		if err == nil && ost.CachedInfo().Config.Storage == jetstream.MemoryStorage {
			if c := ost.CachedInfo().Config; c.MaxBytes != 32<<20 {
				t.Fatalf("outcomes stream re-created with max_bytes=%d; want the operator's 32 MiB kept", c.MaxBytes)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("outcomes stream not moved to memory: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// the results stream, which mlsched bounds, has the dispatcher's bounds
	rs, err := ns.JS.Stream(ctx, topology.StreamResults)
	if c := rs.CachedInfo().Config; err != nil || c.MaxMsgs != cfg.ResultsMaxMsgs || c.MaxBytes != cfg.ResultsMaxBytes {
		t.Fatalf("results stream: %+v, %v; want max_msgs=%d max_bytes=%d", c, err, cfg.ResultsMaxMsgs, cfg.ResultsMaxBytes)
	}
	_, err = ns.JS.Publish(ctx, topology.TaskSubject("t"), bytes.Repeat([]byte("y"), 5<<20))
	if err == nil || !strings.Contains(strings.ToLower(err.Error()), "message size exceeds") {
		t.Fatalf("a 5 MiB task after the update: %v, want a message size error", err)
	}
}

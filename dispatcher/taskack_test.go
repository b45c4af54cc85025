package dispatcher_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/dispatcher"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// The task stays in MLSCHED_TASKS, unacknowledged, while its attempt runs,
// and leaves it once its result is stored; the attempt streams are in
// memory by default.
func TestTaskStaysUntilItsResult(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, name := range []string{topology.StreamDispatch, topology.StreamOutcomes} {
		s, err := e.ns.JS.Stream(e.ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if st := s.CachedInfo().Config.Storage; st != jetstream.MemoryStorage {
			t.Errorf("%s on %v storage, want memory", name, st)
		}
	}
	release := make(chan struct{})
	n := e.startNode("n1", []string{"slow"}, map[string]behavior{"m": func(protocol.Task, int) (protocol.OutcomeStatus, string) {
		<-release
		return protocol.OutcomeSuccess, ""
	}})
	e.submit(protocol.Task{ID: "kept1", Type: "slow"})
	e.waitFor("the attempt to start", func() bool { return len(n.attempts()) == 1 })
	if w := e.waiting(); w != 1 {
		t.Fatalf("%d messages in the task stream while the attempt runs, want 1 (the task)", w)
	}
	n.mu.Lock()
	pd, err := protocol.ParseDispatch(n.headers[0])
	n.mu.Unlock()
	if err != nil || pd.TaskAck == "" {
		t.Fatalf("dispatch %+v (%v): no task ack subject", pd, err)
	}
	close(release)
	if res := e.result("kept1"); res.Status != protocol.StatusSucceeded {
		t.Fatalf("result = %+v", res)
	}
	e.waitFor("the task acked once its result is stored", func() bool { return e.waiting() == 0 })
}

// A crash that loses the in-memory attempt streams (here: deleted, as a
// restart of a single nats-server does) loses no task: the dispatcher
// re-creates them, the unacknowledged task is redelivered and dispatched
// again, and it gets exactly one result.
func TestLostAttemptStreamsAreRecoveredFromTheTask(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *dispatcher.Config) { c.AckWait = 2 * time.Second })
	n := e.startNode("n1", []string{"rec"}, map[string]behavior{"m": succeed})
	n.silent.Store(true) // the attempt is lost: never answered
	e.submit(protocol.Task{ID: "rec1", Type: "rec"})
	e.waitFor("the attempt to reach the node", func() bool { return len(n.attempts()) == 1 })
	for _, name := range []string{topology.StreamDispatch, topology.StreamOutcomes} {
		if err := e.ns.JS.DeleteStream(e.ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	e.waitFor("the dispatcher to re-create the attempt streams", func() bool {
		_, err1 := e.ns.JS.Stream(e.ctx, topology.StreamDispatch)
		_, err2 := e.ns.JS.Stream(e.ctx, topology.StreamOutcomes)
		return err1 == nil && err2 == nil
	})
	// The node's consumer went with its stream: the node comes back, healthy.
	again := e.startNode("n1", []string{"rec"}, map[string]behavior{"m": succeed})
	res := e.result("rec1")
	if res.Status != protocol.StatusSucceeded {
		t.Fatalf("result = %+v", res)
	}
	if a := again.attempts(); len(a) != 1 || a[0] != "rec1/1/m" {
		t.Errorf("the node's attempts after the loss: %v, want the task dispatched again once", a)
	}
	e.waitFor("the task acked once its result is stored", func() bool { return e.waiting() == 0 })
	e.waitFor("the result counted", func() bool { return e.resultCount("rec1") > 0 })
	if c := e.resultCount("rec1"); c != 1 {
		t.Errorf("rec1 has %d results", c)
	}
}

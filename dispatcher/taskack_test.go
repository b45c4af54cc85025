package dispatcher_test

import (
	"strings"
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
// again, and it gets exactly one result. Nor does it lose the task's
// attempts (issue 39): the lost attempt is in the result's history, and the
// task goes on at attempt 2, so that max_attempts still bounds its runs.
func TestLostAttemptStreamsAreRecoveredFromTheTask(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *dispatcher.Config) { c.AckWait = 2 * time.Second })
	n := e.startNode("n1", []string{"rec"}, map[string]behavior{"m": succeed})
	n.silent.Store(true) // the attempt is lost: never answered
	e.submit(protocol.Task{ID: "rec1", Type: "rec"})
	e.waitFor("the attempt to reach the node", func() bool { return len(n.attempts()) == 1 })
	loseAttemptStreams(t, e)
	// The node's consumer went with its stream: the node comes back, healthy.
	again := e.startNode("n1", []string{"rec"}, map[string]behavior{"m": succeed})
	res := e.result("rec1")
	if res.Status != protocol.StatusSucceeded || res.Attempts != 2 || len(res.History) != 2 ||
		res.History[0].Status != protocol.OutcomeLost || !strings.Contains(res.History[0].Error, "attempt streams") {
		t.Fatalf("result = %+v, want success at attempt 2 after attempt 1 lost with the attempt streams", res)
	}
	if a := again.attempts(); len(a) != 1 || a[0] != "rec1/2/m" {
		t.Errorf("the node's attempts after the loss: %v, want the task dispatched again once, as attempt 2", a)
	}
	e.waitFor("the task acked once its result is stored", func() bool { return e.waiting() == 0 })
	e.waitFor("the result counted", func() bool { return e.resultCount("rec1") > 0 })
	if c := e.resultCount("rec1"); c != 1 {
		t.Errorf("rec1 has %d results", c)
	}
}

// loseAttemptStreams deletes the attempt streams, as a restart of a single
// nats-server loses them (memory storage), and waits until the dispatcher
// has re-created them.
func loseAttemptStreams(t *testing.T, e *env) {
	t.Helper()
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
}

// A task whose last attempt was lost with the attempt streams does not run
// again (issue 39: max_attempts holds through a server restart): it ends
// attempts_exhausted, with the lost attempt in its history and its dead
// letter, and the node never sees it again.
func TestLostAttemptStreamsKeepMaxAttempts(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *dispatcher.Config) { c.AckWait = 2 * time.Second })
	n := e.startNode("n1", []string{"rec"}, map[string]behavior{"m": succeed})
	n.silent.Store(true)
	e.submit(protocol.Task{ID: "once", Type: "rec", MaxAttempts: 1})
	e.waitFor("the attempt to reach the node", func() bool { return len(n.attempts()) == 1 })
	loseAttemptStreams(t, e)
	again := e.startNode("n1", []string{"rec"}, map[string]behavior{"m": succeed})
	res := e.result("once")
	if res.Status != protocol.StatusFailed || res.ErrorCode != protocol.CodeAttemptsExhausted || res.Attempts != 1 ||
		len(res.History) != 1 || res.History[0].Status != protocol.OutcomeLost {
		t.Fatalf("result = %+v, want attempts_exhausted after its one attempt, lost", res)
	}
	e.waitFor("the task acked once its result is stored", func() bool { return e.waiting() == 0 })
	if a := again.attempts(); len(a) != 0 {
		t.Errorf("the node ran %v after the loss, want nothing: the task had no attempt left", a)
	}
}

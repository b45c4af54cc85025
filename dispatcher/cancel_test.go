package dispatcher_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mlsched/mlsched/dispatcher"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// cancel sends a cancel request the way `mlsched cancel` does.
func (e *env) cancel(id string) protocol.CancelReply {
	e.t.Helper()
	data, _ := json.Marshal(protocol.CancelRequest{ID: id, Reason: "test"})
	var m *nats.Msg
	var err error
	e.waitFor("a dispatcher answering cancel requests", func() bool {
		m, err = e.ns.NC.Request(protocol.SubjectAdminCancel, data, 30*time.Second)
		return !errors.Is(err, nats.ErrNoResponders)
	})
	if err != nil {
		e.t.Fatalf("cancel %s: %v", id, err)
	}
	var r protocol.CancelReply
	if err := json.Unmarshal(m.Data, &r); err != nil {
		e.t.Fatalf("cancel reply %q: %v", m.Data, err)
	}
	return r
}

// A running attempt of a cancelled task is ignored as late when it ends, even
// when it fails (no retry), and the cancelled result stays the only one.
func TestCancelRunningTask(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	release := make(chan struct{})
	n := e.startNode("n1", []string{"slow"}, map[string]behavior{"m": func(protocol.Task, int) (protocol.OutcomeStatus, string) {
		<-release
		return protocol.OutcomeModelError, "failed after the cancel"
	}})
	e.submit(protocol.Task{ID: "run1", Type: "slow", MaxAttempts: 3})
	e.waitFor("the attempt to start", func() bool { return len(n.attempts()) == 1 })

	r := e.cancel("run1")
	if r.Outcome != protocol.CancelDone || r.Status != protocol.StatusCancelled || len(r.Where) != 1 || r.Where[0] != "dispatched" {
		t.Fatalf("cancel reply = %+v", r)
	}
	res := e.result("run1")
	if res.Status != protocol.StatusCancelled || res.ErrorCode != protocol.CodeCancelled || res.Type != "slow" {
		t.Fatalf("result = %+v", res)
	}
	close(release)
	e.waitFor("the outcome counted as late", func() bool { return e.d.Counters().Late.Load() == 1 })
	// Not dispatched again: a later task on the same node is the next attempt it sees.
	e.submit(protocol.Task{ID: "run2", Type: "slow", MaxAttempts: 1})
	e.result("run2")
	if got := n.attempts(); len(got) != 2 || got[1][:5] != "run2/" {
		t.Fatalf("node saw %v, want run1 once then run2", got)
	}
	if c := e.resultCount("run1"); c != 1 {
		t.Fatalf("run1 has %d results", c)
	}
	if again := e.cancel("run1"); again.Outcome != protocol.CancelFinished || again.Status != protocol.StatusCancelled {
		t.Fatalf("second cancel = %+v", again)
	}
	fams, _ := scrape(t, baseURL(t, e.d))
	if v, _ := value(fams, "mlsched_results_total", "type=slow", "status=cancelled"); v != 1 {
		t.Errorf("mlsched_results_total{type=slow,status=cancelled} = %v, want 1", v)
	}
	if v, _ := value(fams, "mlsched_dispatcher_events_total", "event=cancelled"); v != 1 {
		t.Errorf("mlsched_dispatcher_events_total{event=cancelled} = %v, want 1", v)
	}
}

// A task still waiting for a node is removed from the backlog and never runs.
func TestCancelWaitingTask(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *dispatcher.Config) { c.NoNodeWait = time.Minute })
	e.submit(protocol.Task{ID: "wait1", Type: "later"})
	e.waitFor("the task in the backlog", func() bool { return e.waiting() == 1 })
	r := e.cancel("wait1")
	if r.Outcome != protocol.CancelDone || len(r.Where) != 1 || r.Where[0] != "waiting" {
		t.Fatalf("cancel reply = %+v", r)
	}
	if res := e.result("wait1"); res.Status != protocol.StatusCancelled {
		t.Fatalf("result = %+v", res)
	}
	e.waitFor("an empty backlog", func() bool { return e.waiting() == 0 })
	n := e.startNode("n1", []string{"later"}, map[string]behavior{"m": succeed})
	e.submit(protocol.Task{ID: "wait2", Type: "later"})
	e.result("wait2")
	if got := n.attempts(); len(got) != 1 || got[0][:6] != "wait2/" {
		t.Fatalf("node saw %v, want only wait2", got)
	}
}

func TestCancelUnknownFinishedAndInvalid(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.startNode("n1", []string{"echo"}, map[string]behavior{"m": succeed})
	e.submit(protocol.Task{ID: "done1", Type: "echo"})
	e.result("done1")
	if r := e.cancel("done1"); r.Outcome != protocol.CancelFinished || r.Status != protocol.StatusSucceeded {
		t.Fatalf("cancel of a finished task = %+v", r)
	}
	if r := e.cancel("never-submitted"); r.Outcome != protocol.CancelUnknown {
		t.Fatalf("cancel of an unknown task = %+v", r)
	}
	if r := e.cancel("bad.id"); r.Outcome != protocol.CancelInvalid || r.Error == "" {
		t.Fatalf("cancel of an invalid id = %+v", r)
	}
	if c := e.resultCount("done1"); c != 1 {
		t.Fatalf("done1 has %d results", c)
	}
}

// waiting counts the messages in the task stream.
func (e *env) waiting() uint64 {
	return e.streamState(topology.StreamTasks).Msgs
}

package dispatcher_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/mlsched/mlsched/dispatcher"
	"github.com/mlsched/mlsched/shared/protocol"
)

// A node whose queue cannot be started before the deadline is not sent
// anything: the task is held back, counted, and fails with code saturated
// after its own deadline (timeout plus slack), dead-lettered for replay.
// Once the queue drains, a held task is dispatched.
func TestSaturatedTaskIsHeldThenFails(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.queued = 100_000 // on 8 slots: hours of work, from the node's first heartbeat
	busy := e.startNode("busy", []string{"s"}, map[string]behavior{"m": succeed})
	e.submit(protocol.Task{ID: "sat1", Type: "s", TimeoutMs: 200})
	res := e.result("sat1")
	if res.Status != protocol.StatusFailed || res.ErrorCode != protocol.CodeSaturated || res.Attempts != 0 {
		t.Fatalf("result = %+v, want failed with %s after 0 attempts", res, protocol.CodeSaturated)
	}
	if len(busy.attempts()) != 0 {
		t.Fatalf("the saturated node got %v", busy.attempts())
	}
	if n := e.d.Counters().Saturated.Load(); n != 1 {
		t.Fatalf("saturated counter = %d, want 1", n)
	}
	if r := e.d.Report(); r.Counters["saturated"] != 1 {
		t.Fatalf("stats report counters %v, want saturated=1", r.Counters)
	}
	e.waitFor("the dead letter", func() bool {
		for _, dl := range e.deadLetters() {
			if dl.TaskID == "sat1" && dl.Code == protocol.CodeSaturated {
				return true
			}
		}
		return false
	})

	// held, then dispatched once the queue is gone
	e.submit(protocol.Task{ID: "sat2", Type: "s", TimeoutMs: 10_000})
	e.waitFor("sat2 held", func() bool { return e.d.Report().Held == 1 })
	busy.queued.Store(0)
	busy.beat()
	res = e.result("sat2")
	if res.Status != protocol.StatusSucceeded || res.Attempts != 1 {
		t.Fatalf("result = %+v, want success at the first attempt", res)
	}
}

// A task cancelled while it is held is dropped from the hold room: once the
// node has room again it runs only what was not cancelled.
func TestCancelHeldTask(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.queued = 100_000 // on 8 slots: hours of work, from the node's first heartbeat
	busy := e.startNode("busy", []string{"s"}, map[string]behavior{"m": succeed})
	e.submit(protocol.Task{ID: "held1", Type: "s", TimeoutMs: 60_000})
	e.waitFor("held1 held", func() bool { return e.d.Report().Held == 1 })
	if r := e.cancel("held1"); r.Outcome != protocol.CancelDone {
		t.Fatalf("cancel reply = %+v", r)
	}
	if res := e.result("held1"); res.Status != protocol.StatusCancelled {
		t.Fatalf("result = %+v, want cancelled", res)
	}
	e.waitFor("the hold room empty", func() bool { return e.d.Report().Held == 0 })
	busy.queued.Store(0)
	busy.beat()
	e.submit(protocol.Task{ID: "held2", Type: "s", TimeoutMs: 10_000})
	if res := e.result("held2"); res.Status != protocol.StatusSucceeded {
		t.Fatalf("held2 result = %+v", res)
	}
	if got := busy.attempts(); len(got) != 1 || got[0][:6] != "held2/" {
		t.Fatalf("node saw %v, want only held2", got)
	}
	if c := e.resultCount("held1"); c != 1 {
		t.Fatalf("held1 has %d results", c)
	}
}

// The decision table follows a node joining at once, not at the next
// statistics refresh: a burst of tasks right after the node joined (a
// producer that waited for it, a bench) is dispatched, not parked or turned
// away as "no node serves this type". The refresh interval here is an
// hour, so only the membership signal can bring the node in.
func TestTableFollowsJoiningNodeAtOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *dispatcher.Config) { c.SnapshotInterval = time.Hour })
	e.waitFor("the dispatcher started, its first table built", func() bool { return e.d.Ready(e.ctx).Ready() })
	e.startNode("n1", []string{"burst"}, map[string]behavior{"m": succeed})
	const n = 20
	for i := range n {
		e.submit(protocol.Task{ID: fmt.Sprintf("burst%d", i), Type: "burst"})
	}
	for i := range n {
		if res := e.result(fmt.Sprintf("burst%d", i)); res.Status != protocol.StatusSucceeded {
			t.Fatalf("burst%d: %+v", i, res)
		}
	}
}

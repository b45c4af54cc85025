package dispatcher_test

import (
	"testing"

	"github.com/mlsched/mlsched/shared/protocol"
)

// Sheddable work goes first: when a task that may not be shed (priority
// >= 0) runs out of its deadline in the hold, the sheddable tasks of its
// type held with it are shed first (they would have been served after it),
// and no shedding inversion is counted.
func TestShedSheddableBeforeNonSheddableExpires(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.queued = 100_000 // on 8 slots: hours of work, everything is held
	busy := e.startNode("busy", []string{"x"}, map[string]behavior{"m": succeed})
	// the sheddable task's own deadline is far: without the rule it
	// would wait there for a minute after the other one expired
	e.submit(protocol.Task{ID: "low", Type: "x", Priority: -5, TimeoutMs: 60_000, DeadlineMs: 60_000})
	e.waitFor("the sheddable task held", func() bool { return e.d.Report().Held == 1 })
	e.submit(protocol.Task{ID: "normal", Type: "x", Priority: 0, TimeoutMs: 60_000, DeadlineMs: 500})
	if res := e.result("normal"); res.Status != protocol.StatusFailed || res.ErrorCode != protocol.CodeExpired {
		t.Fatalf("normal: %+v, want expired", res)
	}
	res := e.result("low")
	if res.Status != protocol.StatusFailed || res.ErrorCode != protocol.CodeShed || res.RetryAfterMs <= 0 {
		t.Fatalf("low: %+v, want shed with a retry_after_ms", res)
	}
	if got := busy.attempts(); len(got) != 0 {
		t.Fatalf("the node got %v", got)
	}
	if n := e.d.Counters().ShedInversions.Load(); n != 0 {
		t.Fatalf("shed inversions = %d, want 0", n)
	}
	if r := e.d.Report(); r.Held != 0 || r.Counters["shed_inversions"] != 0 || r.Counters["shed_sheddable"] != 1 {
		t.Fatalf("report: held %d, counters %v", r.Held, r.Counters)
	}
}

// The same when the task that may not be shed is found expired at intake
// (its deadline passed in the stream): the hold ends it at its next pass,
// after the sheddable ones of its type.
func TestShedSheddableBeforeExpiredAtIntake(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.queued = 100_000
	e.startNode("busy", []string{"y"}, map[string]behavior{"m": succeed})
	e.submit(protocol.Task{ID: "low", Type: "y", Priority: -3, TimeoutMs: 60_000, DeadlineMs: 60_000})
	e.waitFor("the sheddable task held", func() bool { return e.d.Report().Held == 1 })
	e.submit(protocol.Task{ID: "late", Type: "y", Priority: 2, TimeoutMs: 60_000, DeadlineMs: 1})
	if res := e.result("late"); res.Status != protocol.StatusFailed || res.ErrorCode != protocol.CodeExpired {
		t.Fatalf("late: %+v, want expired", res)
	}
	if res := e.result("low"); res.ErrorCode != protocol.CodeShed {
		t.Fatalf("low: %+v, want shed", res)
	}
	// late reaches intake expired (handed to the hold, not counted as
	// held for capacity) or, when intake comes within its 1 ms, held as
	// saturated and expired by the pass: either way after low is shed.
	if r := e.d.Report(); r.Counters["shed_inversions"] != 0 || r.Counters["saturated"] < 1 || r.Counters["saturated"] > 2 {
		t.Fatalf("counters %v: want 0 shed inversions, and low (and at most late) counted as held for capacity", r.Counters)
	}
}

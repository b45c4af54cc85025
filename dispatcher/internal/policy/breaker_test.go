package policy

import (
	"testing"
	"time"

	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/shared/protocol"
)

// apply writes transitions into the snapshot the way the dispatcher writes
// them into the store: compare-and-set on From.
func apply(t *testing.T, snap *stats.Snapshot, trs []Transition) {
	t.Helper()
	for _, tr := range trs {
		ms := snap.Models[tr.Key.Model]
		s := &ms.Series
		if tr.Key.Node != "" {
			s = ms.Nodes[tr.Key.Node]
		}
		if s.Breaker != tr.From {
			t.Fatalf("transition %+v from a stale state %+v", tr, s.Breaker)
		}
		s.Breaker = tr.To
	}
}

func only(t *testing.T, trs []Transition, key stats.BreakerKey, from, to stats.BreakerState) {
	t.Helper()
	if len(trs) != 1 || trs[0].Key != key || trs[0].From.State != from || trs[0].To.State != to {
		t.Fatalf("transitions %+v, want only %v %s -> %s", trs, key, from, to)
	}
}

func TestBreakerLifecycle(t *testing.T) {
	t.Parallel()
	e := engine(t, Config{ExploreShare: -1, Breaker: BreakerConfig{ConsecutiveFailures: 3, Cooldown: 10 * time.Second, HalfOpenProbes: 2}})
	key := stats.BreakerKey{Model: "shaky"}
	snap := snapshot(map[string]stats.Series{
		"shaky":  series(500, 0, time.Millisecond, 0),
		"steady": series(400, 20, time.Millisecond, time.Millisecond),
	})
	hbs := []protocol.Heartbeat{hb("n1", "t", 100, "shaky", "steady")}
	s := &snap.Models["shaky"].Series
	now := t0

	// two consecutive failures: still closed
	s.ModelErrors, s.ConsecutiveFailures = 2, 2
	if trs := e.Transitions(snap, now); len(trs) != 0 {
		t.Fatalf("opened early: %+v", trs)
	}
	// the third opens it
	s.ModelErrors, s.ConsecutiveFailures = 3, 3
	trs := e.Transitions(snap, now)
	only(t, trs, key, stats.BreakerClosed, stats.BreakerOpen)
	apply(t, snap, trs)
	if got := counts(t, e, NewTable(snap, hbs, now), &Request{Type: "t"}, 100); got["shaky"] != 0 {
		t.Fatalf("an open breaker let tasks through: %v", got)
	}

	// before the cooldown nothing changes; after it, half-open
	if trs := e.Transitions(snap, now.Add(9*time.Second)); len(trs) != 0 {
		t.Fatalf("left open before the cooldown: %+v", trs)
	}
	now = now.Add(10 * time.Second)
	trs = e.Transitions(snap, now)
	only(t, trs, key, stats.BreakerOpen, stats.BreakerHalfOpen)
	apply(t, snap, trs)

	// half-open: exactly the probes go through, even though shaky is the
	// most reliable on paper
	tab := NewTable(snap, hbs, now)
	got := counts(t, e, tab, &Request{Type: "t"}, 100)
	if got["shaky"] != 2 || got["steady"] != 98 {
		t.Fatalf("half-open let %v through, want exactly 2 probes", got)
	}
	// probes already in flight (seen by the stats) count against the limit
	s.InFlight = 1
	if got := counts(t, e, NewTable(snap, hbs, now), &Request{Type: "t"}, 50); got["shaky"] != 1 {
		t.Fatalf("with one probe in flight: %v, want one more probe", got)
	}
	// no outcome yet: stays half-open
	if trs := e.Transitions(snap, now.Add(time.Second)); len(trs) != 0 {
		t.Fatalf("changed without an outcome: %+v", trs)
	}

	// a probe fails: open again
	s.ConsecutiveFailures++
	s.LastOutcome = now.Add(2 * time.Second)
	trs = e.Transitions(snap, now.Add(2*time.Second))
	only(t, trs, key, stats.BreakerHalfOpen, stats.BreakerOpen)
	apply(t, snap, trs)

	// cooldown again, half-open, then a probe succeeds: closed
	now = now.Add(12 * time.Second)
	trs = e.Transitions(snap, now)
	only(t, trs, key, stats.BreakerOpen, stats.BreakerHalfOpen)
	apply(t, snap, trs)
	s.ConsecutiveFailures, s.Successes, s.LastOutcome, s.InFlight = 0, s.Successes+1, now.Add(time.Second), 0
	trs = e.Transitions(snap, now.Add(time.Second))
	only(t, trs, key, stats.BreakerHalfOpen, stats.BreakerClosed)
	apply(t, snap, trs)
	if got := counts(t, e, NewTable(snap, hbs, now), &Request{Type: "t"}, 20); got["shaky"] != 20 {
		t.Fatalf("closed breaker: %v, want shaky back", got)
	}
}

func TestBreakerFailureRate(t *testing.T) {
	t.Parallel()
	e := engine(t, Config{Breaker: BreakerConfig{ConsecutiveFailures: 1000, FailureRate: 0.5, MinRequests: 20}})
	snap := snapshot(map[string]stats.Series{
		"few":   series(2, 8, time.Millisecond, time.Millisecond),    // 80% but only 10 requests
		"half":  series(10, 10, time.Millisecond, time.Millisecond),  // exactly 50%: not above
		"worse": series(10, 11, time.Millisecond, time.Millisecond),  // above, with enough requests
		"fine":  series(100, 10, time.Millisecond, time.Millisecond), // fine
	})
	only(t, e.Transitions(snap, t0), stats.BreakerKey{Model: "worse"}, stats.BreakerClosed, stats.BreakerOpen)

	// a breaker that just closed is not reopened by the failures still in
	// the window; once the window has rolled past the close it is judged
	snap.Models["worse"].Breaker = stats.Breaker{State: stats.BreakerClosed, Since: t0}
	if trs := e.Transitions(snap, t0.Add(time.Minute)); len(trs) != 0 {
		t.Fatalf("reopened on stale failures: %+v", trs)
	}
	only(t, e.Transitions(snap, t0.Add(snap.Window)), stats.BreakerKey{Model: "worse"}, stats.BreakerClosed, stats.BreakerOpen)
}

func TestTaskErrorsNeverOpenABreaker(t *testing.T) {
	t.Parallel()
	e := engine(t, Config{Breaker: BreakerConfig{ConsecutiveFailures: 1, MinRequests: 1}})
	s := series(1, 0, time.Millisecond, 0)
	s.TaskErrors = 10_000
	s.Expired = 500
	snap := snapshot(map[string]stats.Series{"m": s})
	snap.Models["m"].Nodes["n1"] = &s
	if trs := e.Transitions(snap, t0); len(trs) != 0 {
		t.Fatalf("task errors opened a breaker: %+v", trs)
	}
}

func TestNodeBreaker(t *testing.T) {
	t.Parallel()
	e := engine(t, Config{Breaker: BreakerConfig{ConsecutiveFailures: 2, HalfOpenProbes: 1}})
	snap := snapshot(map[string]stats.Series{"m": series(100, 4, time.Millisecond, time.Millisecond)})
	good := series(100, 0, time.Millisecond, 0)
	bad := series(0, 4, 0, time.Millisecond)
	bad.ConsecutiveFailures = 4
	snap.Models["m"].Nodes["good"] = &good
	snap.Models["m"].Nodes["bad"] = &bad
	trs := e.Transitions(snap, t0)
	only(t, trs, stats.BreakerKey{Model: "m", Node: "bad"}, stats.BreakerClosed, stats.BreakerOpen)
	apply(t, snap, trs)

	hbs := []protocol.Heartbeat{hb("bad", "t", 100, "m"), hb("good", "t", 1, "m")}
	tab := NewTable(snap, hbs, t0)
	for i := 0; i < 50; i++ {
		d, err := e.Decide(tab, &Request{Type: "t"})
		if err != nil || d.Node != "good" || d.Panic {
			t.Fatalf("decision %+v %v, want node good", d, err)
		}
		tab.Dispatched(d.Model, d.Node) // good fills up, bad stays empty: still not chosen
	}
	// half-open: one probe to the bad node
	trs = e.Transitions(snap, t0.Add(time.Minute))
	only(t, trs, stats.BreakerKey{Model: "m", Node: "bad"}, stats.BreakerOpen, stats.BreakerHalfOpen)
	apply(t, snap, trs)
	tab = NewTable(snap, hbs, t0.Add(time.Minute))
	n := map[string]int{}
	for i := 0; i < 20; i++ {
		d, err := e.Decide(tab, &Request{Type: "t"})
		if err != nil {
			t.Fatal(err)
		}
		n[d.Node]++
	}
	if n["bad"] != 1 {
		t.Fatalf("half-open node got %v, want exactly one probe", n)
	}
}

func TestPanicMode(t *testing.T) {
	t.Parallel()
	e := engine(t, Config{ExploreShare: -1})
	snap := snapshot(map[string]stats.Series{
		"a": series(900, 100, time.Millisecond, time.Millisecond),
		"b": series(990, 10, time.Millisecond, time.Millisecond),
	})
	open := stats.Breaker{State: stats.BreakerOpen, Since: t0}
	snap.Models["a"].Breaker = open
	hbs := []protocol.Heartbeat{hb("n1", "t", 4, "a", "b")}

	// one open: the other takes everything, no panic
	for i := 0; i < 20; i++ {
		d, err := e.Decide(NewTable(snap, hbs, t0), &Request{Type: "t"})
		if err != nil || d.Model != "b" || d.Panic {
			t.Fatalf("%+v %v", d, err)
		}
	}
	// all open: route by the policy anyway, flagged
	snap.Models["b"].Breaker = open
	tab := NewTable(snap, hbs, t0)
	for i := 0; i < 20; i++ {
		d, err := e.Decide(tab, &Request{Type: "t"})
		if err != nil || d.Model != "b" || d.Node != "n1" || !d.Panic {
			t.Fatalf("panic mode: %+v %v, want b flagged as panic", d, err)
		}
	}
	// panic mode still fails over
	d, err := e.Decide(tab, &Request{Type: "t", Tried: []protocol.Attempt{{Model: "b", Node: "n1"}}})
	if err != nil || d.Model != "a" || !d.Panic {
		t.Fatalf("panic failover: %+v %v", d, err)
	}
	// every node of a model open counts as the model being blocked
	snap.Models["a"].Breaker = stats.Breaker{}
	snap.Models["b"].Breaker = stats.Breaker{}
	snap.Models["a"].Nodes["n1"] = &stats.Series{Breaker: open}
	snap.Models["b"].Nodes["n1"] = &stats.Series{Breaker: open}
	d, err = e.Decide(NewTable(snap, hbs, t0), &Request{Type: "t"})
	if err != nil || !d.Panic || d.Node != "n1" {
		t.Fatalf("all nodes open: %+v %v", d, err)
	}
}

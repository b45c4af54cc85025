package policy

import (
	"testing"
	"time"

	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/shared/protocol"
)

func TestFailoverAvoidsTriedModels(t *testing.T) {
	t.Parallel()
	snap := snapshot(map[string]stats.Series{
		"best":   series(990, 10, time.Millisecond, time.Millisecond),
		"second": series(950, 50, time.Millisecond, time.Millisecond),
		"third":  series(900, 100, time.Millisecond, time.Millisecond),
	})
	hbs := []protocol.Heartbeat{hb("n1", "t", 4, "best", "second"), hb("n2", "t", 4, "best", "third")}
	tab := NewTable(snap, hbs, t0)
	for _, pol := range Names {
		e := engine(t, Config{Default: pol})
		for i := 0; i < 50; i++ {
			d, err := e.Decide(tab, &Request{Type: "t", Tried: []protocol.Attempt{{Model: "best", Node: "n1"}}})
			if err != nil || d.Model == "best" {
				t.Fatalf("%s: %+v %v: retried a tried model while others remain", pol, d, err)
			}
			d, err = e.Decide(tab, &Request{Type: "t", Tried: []protocol.Attempt{{Model: "best", Node: "n1"}, {Model: "second", Node: "n1"}}})
			if err != nil || d.Model != "third" {
				t.Fatalf("%s: %+v %v, want the untried third", pol, d, err)
			}
		}
	}
	e := engine(t, Config{ExploreShare: -1})
	d, err := e.Decide(tab, &Request{Type: "t", Tried: []protocol.Attempt{{Model: "best", Node: "n1"}}})
	if err != nil || d.Model != "second" {
		t.Fatalf("reliability failover: %+v %v, want second", d, err)
	}
}

func TestFailoverSameModelOtherNodeThenRepeat(t *testing.T) {
	t.Parallel()
	e := engine(t, Config{})
	tab := NewTable(nil, []protocol.Heartbeat{hb("n1", "t", 4, "only"), hb("n2", "t", 4, "only")}, t0)
	for i := 0; i < 20; i++ {
		d, err := e.Decide(tab, &Request{Type: "t", Tried: []protocol.Attempt{{Model: "only", Node: "n2"}}})
		if err != nil || d.Model != "only" || d.Node != "n1" {
			t.Fatalf("%+v %v, want only on the untried n1", d, err)
		}
	}
	// both nodes tried: repeat
	tried := []protocol.Attempt{{Model: "only", Node: "n1"}, {Model: "only", Node: "n2"}}
	if d, err := e.Decide(tab, &Request{Type: "t", Tried: tried}); err != nil || d.Model != "only" {
		t.Fatalf("repeat: %+v %v", d, err)
	}

	// a tried model with an untried node beats repeating a model on a tried
	// node: a on n1 and b on n1 tried, b also on n2 → b on n2
	tab = NewTable(nil, []protocol.Heartbeat{hb("n1", "t", 4, "a", "b"), hb("n2", "t", 4, "b")}, t0)
	tried = []protocol.Attempt{{Model: "a", Node: "n1"}, {Model: "b", Node: "n1"}}
	for i := 0; i < 20; i++ {
		if d, err := e.Decide(tab, &Request{Type: "t", Tried: tried}); err != nil || d.Model != "b" || d.Node != "n2" {
			t.Fatalf("%+v %v, want b on n2", d, err)
		}
	}
}

// A retry goes to the best model left, not to a half-open model's probe
// nor to exploration: issue 40's task went steady → fast-flaky → broken
// (failing 45%) while slow-solid (failing none) was free. A first attempt
// still gives the half-open model its probe.
func TestRetryPrefersTheMostReliableRemaining(t *testing.T) {
	t.Parallel()
	snap := snapshot(map[string]stats.Series{
		"steady":     series(990, 10, 40*time.Millisecond, 40*time.Millisecond),
		"slow-solid": series(1000, 0, 160*time.Millisecond, 160*time.Millisecond),
		"broken":     series(550, 450, 20*time.Millisecond, 20*time.Millisecond),
		"unmeasured": series(2, 0, time.Millisecond, time.Millisecond),
	})
	snap.Models["broken"].Breaker = stats.Breaker{State: stats.BreakerHalfOpen, Since: t0}
	hbs := []protocol.Heartbeat{hb("n1", "t", 64, "steady", "slow-solid", "broken", "unmeasured"),
		hb("n2", "t", 64, "steady", "slow-solid", "broken", "unmeasured")}
	e := engine(t, Config{ExploreShare: 0.5, Breaker: BreakerConfig{HalfOpenProbes: 1000}})
	tab := NewTable(snap, hbs, t0)
	if d, err := e.Decide(tab, &Request{Type: "t"}); err != nil || d.Model != "broken" {
		t.Fatalf("first attempt: %+v %v, want the half-open model's probe", d, err)
	}
	got := map[string]int{}
	for range 400 {
		d, err := e.Decide(tab, &Request{Type: "t", Tried: []protocol.Attempt{{Model: "steady", Node: "n1"}}})
		if err != nil {
			t.Fatal(err)
		}
		tab.Dispatched(d.Model, d.Node)
		got[d.Model]++
	}
	if got["slow-solid"] != 400 {
		t.Fatalf("retries went to %v, want every one to slow-solid (the most reliable model left)", got)
	}
}

// Issue 39: an attempt lost with its node (or expired before it started)
// does not blame its model. The retry may go back to the best model on
// another node instead of down to a worse one; a model that failed on its
// own account is still avoided while others remain.
func TestFailoverAfterANodeLossKeepsTheModel(t *testing.T) {
	t.Parallel()
	snap := snapshot(map[string]stats.Series{
		"best":   series(990, 10, time.Millisecond, time.Millisecond),
		"second": series(950, 50, time.Millisecond, time.Millisecond),
	})
	hbs := []protocol.Heartbeat{hb("n1", "t", 4, "best", "second"), hb("n2", "t", 4, "best", "second")}
	tab := NewTable(snap, hbs, t0)
	e := engine(t, Config{ExploreShare: -1})
	for _, st := range []protocol.OutcomeStatus{protocol.OutcomeNodeLost, protocol.OutcomeExpired} {
		d, err := e.Decide(tab, &Request{Type: "t", Tried: []protocol.Attempt{{Model: "best", Node: "n1", Status: st}}})
		if err != nil || d.Model != "best" || d.Node != "n2" {
			t.Fatalf("after %s on n1: %+v %v, want best on n2", st, d, err)
		}
	}
	for _, st := range []protocol.OutcomeStatus{protocol.OutcomeModelError, protocol.OutcomeTimeout, protocol.OutcomeLost} {
		d, err := e.Decide(tab, &Request{Type: "t", Tried: []protocol.Attempt{{Model: "best", Node: "n1", Status: st}}})
		if err != nil || d.Model != "second" {
			t.Fatalf("after %s on n1: %+v %v, want second (best is blamed)", st, d, err)
		}
	}
	// The best model lost with its only other node too: no untried node
	// of it is left, so the retry goes to the other model.
	d, err := e.Decide(tab, &Request{Type: "t", Tried: []protocol.Attempt{
		{Model: "best", Node: "n1", Status: protocol.OutcomeNodeLost}, {Model: "best", Node: "n2", Status: protocol.OutcomeNodeLost}}})
	if err != nil || d.Model != "second" {
		t.Fatalf("after best was lost on both nodes: %+v %v, want second", d, err)
	}
}

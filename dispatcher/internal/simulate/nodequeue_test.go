package simulate

import (
	"testing"
	"time"
)

// TestNodeDoesNotStartTooLate: as the worker (d02e923), a node does not
// start a dispatch whose deadline leaves less than its model's mean
// successful run there (weight 1/8, in the worker's integer steps; no
// limit before the first success): it reports it expired, a queued one
// with the others its freed slot skips, a fresh one by an event after the
// dispatch that sent it.
func TestNodeDoesNotStartTooLate(t *testing.T) {
	t.Parallel()
	sc, err := ParseScenario([]byte(minimal))
	if err != nil {
		t.Fatal(err)
	}
	sc.Nodes[0].Capacity = 1
	s, err := newSim(sc, Options{}.withDefaults(sc), Oracle)
	if err != nil {
		t.Fatal(err)
	}
	n := s.nodes[0]
	at := func(idx int, left time.Duration) *attempt {
		return &attempt{t: &task{idx: idx}, n: 1, model: "m", node: n, deadline: s.now + left}
	}
	busy := at(0, time.Microsecond) // no mean yet: started however little is left
	s.toNode(busy)
	if busy.state != stRunning {
		t.Fatalf("first dispatch not started with no mean run: state %v", busy.state)
	}
	n.observeRun("m", 80*time.Millisecond)
	n.observeRun("m", 40*time.Millisecond)
	if got, want := n.meanRun["m"], 75*time.Millisecond; got != want {
		t.Fatalf("mean run %v, want %v (80 ms, then 40 ms at weight 1/8)", got, want)
	}
	short, enough := at(1, 74*time.Millisecond), at(2, 75*time.Millisecond)
	s.toNode(short)
	s.toNode(enough)
	n.running-- // the slot frees
	if exp := s.startQueued(n); len(exp) != 1 || exp[0] != short || enough.state != stRunning {
		t.Fatalf("expired %v, the one with 75 ms left %v: want the one with 74 ms expired and the other started", exp, enough.state)
	}
	n.running--
	fresh := at(3, 10*time.Millisecond)
	s.toNode(fresh)
	var expired []*attempt
	for _, e := range s.q {
		if e.kind == evExpired {
			expired = append(expired, e.a)
		}
	}
	if fresh.state == stRunning || len(expired) != 1 || expired[0] != fresh {
		t.Fatalf("a fresh dispatch with 10 ms left: state %v, expired events for %v; want not started and one expired event", fresh.state, expired)
	}
}

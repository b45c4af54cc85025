package policy

import (
	"testing"
	"time"

	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/shared/protocol"
)

func nodeCounts(t *testing.T, e *Engine, tab *Table, n int, dispatch bool) map[string]int {
	t.Helper()
	out := map[string]int{}
	for i := 0; i < n; i++ {
		d, err := e.Decide(tab, &Request{Type: "t"})
		if err != nil {
			t.Fatal(err)
		}
		if dispatch {
			tab.Dispatched(d.Model, d.Node)
		}
		out[d.Node]++
	}
	return out
}

func TestNodeChoicePrefersLessLoaded(t *testing.T) {
	t.Parallel()
	e := engine(t, Config{})
	busy := hb("busy", "t", 4, "m")
	busy.InFlight = 4
	tab := NewTable(nil, []protocol.Heartbeat{busy, hb("idle", "t", 4, "m")}, t0)
	if got := nodeCounts(t, e, tab, 50, false); got["idle"] != 50 {
		t.Fatalf("%v, want idle", got)
	}
	// local dispatches count: the idle node fills up and the load evens out
	got := nodeCounts(t, e, tab, 40, true)
	if got["idle"] < 20 || got["busy"] < 10 {
		t.Fatalf("local dispatches not counted: %v", got)
	}
	// the snapshot's per-node in-flight counts too
	snap := snapshot(map[string]stats.Series{"m": {}})
	snap.Models["m"].Nodes["a"] = &stats.Series{InFlight: 10}
	tab = NewTable(snap, []protocol.Heartbeat{hb("a", "t", 10, "m"), hb("b", "t", 10, "m")}, t0)
	if got := nodeCounts(t, e, tab, 20, false); got["b"] != 20 {
		t.Fatalf("%v, want b", got)
	}
}

func TestNodeChoicePrefersReliableNode(t *testing.T) {
	t.Parallel()
	e := engine(t, Config{})
	snap := snapshot(map[string]stats.Series{"m": series(200, 100, time.Millisecond, time.Millisecond)})
	good := series(100, 0, time.Millisecond, 0)
	bad := series(100, 100, time.Millisecond, time.Millisecond)
	snap.Models["m"].Nodes["good"] = &good
	snap.Models["m"].Nodes["bad"] = &bad
	tab := NewTable(snap, []protocol.Heartbeat{hb("bad", "t", 4, "m"), hb("good", "t", 4, "m")}, t0)
	if got := nodeCounts(t, e, tab, 50, false); got["good"] != 50 {
		t.Fatalf("%v, want good", got)
	}
}

func TestNodeChoicePowerOfTwo(t *testing.T) {
	t.Parallel()
	e := engine(t, Config{})
	var hbs []protocol.Heartbeat
	for i, load := range []int{0, 1, 2, 3, 8} {
		h := hb(string(rune('a'+i)), "t", 8, "m")
		h.InFlight = load
		hbs = append(hbs, h)
	}
	tab := NewTable(nil, hbs, t0)
	got := nodeCounts(t, e, tab, 2000, false)
	// two random choices: the most loaded never wins, the least loaded
	// wins most, and more than one node is used so replicas do not herd
	if got["e"] != 0 || got["a"] <= got["b"] || got["b"] <= got["c"] || got["c"] <= got["d"] || got["d"] == 0 {
		t.Fatalf("power of two choices: %v", got)
	}
}

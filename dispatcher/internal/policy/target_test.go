package policy

import (
	"testing"
	"time"

	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/shared/protocol"
)

// targetWorld: one type served by "fast" (measured at fast per attempt)
// on node f and "slow" (at slow) on node s, 8 slots each, with
// inFlight[node] attempts running or queued on each node; every pair
// measured over n attempts on its own node.
func targetWorld(fast, slow time.Duration, n int64, inFlight map[string]int) *Table {
	snap := snapshot(map[string]stats.Series{
		"fast": series(n, 0, fast, 0),
		"slow": series(n, 0, slow, 0),
	})
	for model, node := range map[string]string{"fast": "f", "slow": "s"} {
		s := snap.Models[model].Series
		snap.Models[model].Nodes[node] = &s
	}
	f, s := hb("f", "t", 8, "fast"), hb("s", "t", 8, "slow")
	f.InFlight, s.InFlight = inFlight["f"], inFlight["s"]
	return NewTable(snap, []protocol.Heartbeat{f, s}, t0)
}

func req(models ...string) *Request {
	return &Request{Type: "t", Models: models, Timeout: 30 * time.Second, Deadline: 40 * time.Second}
}

// By default each (model, node) has its own queue target, three of its own
// service times: a node counts as saturated once about two slots' worth
// of attempts per slot wait there, whatever the model's speed, while the
// deadline alone (30 s) would let it queue hundreds.
func TestQueueTargetAutoPerPair(t *testing.T) {
	t.Parallel()
	e := engine(t, Config{ExploreShare: -1})
	for _, c := range []struct {
		node, model string
		inFlight    int
		saturated   bool
	}{
		// 10 ms on 8 slots: target 30 ms, 20 ms of wait = 16 ahead
		{"f", "fast", 8 + 14, false},
		{"f", "fast", 8 + 16, true},
		// 500 ms on 8 slots: target 1.5 s, 1 s of wait = 16 ahead
		{"s", "slow", 8 + 14, false},
		{"s", "slow", 8 + 16, true},
	} {
		tab := targetWorld(10*time.Millisecond, 500*time.Millisecond, 1000, map[string]int{c.node: c.inFlight})
		d, err := e.Decide(tab, req(c.model))
		if err != nil || d.Saturated != c.saturated {
			t.Errorf("%s with %d in flight on 8 slots: %+v %v, want saturated %v", c.model, c.inFlight, d, err, c.saturated)
		}
		// without the target (the hold's question: saturated at all?)
		r := req(c.model)
		r.FullDeadline = true
		if d, err := e.Decide(tab, r); err != nil || d.Saturated {
			t.Errorf("%s with %d in flight, full deadline: %+v %v, want not saturated", c.model, c.inFlight, d, err)
		}
	}
	// the fast node full beyond its target, the slow one not: the task
	// goes to the slow model, not saturated
	tab := targetWorld(10*time.Millisecond, 500*time.Millisecond, 1000, map[string]int{"f": 40})
	for range 20 {
		if d, err := e.Decide(tab, req()); err != nil || d.Model != "slow" || d.Saturated {
			t.Fatalf("fast beyond its target: %+v %v, want slow", d, err)
		}
	}
}

// A fixed MLSCHED_QUEUE_TARGET wins over the automatic one; a negative
// one turns the target off (the deadline alone).
func TestQueueTargetOverride(t *testing.T) {
	t.Parallel()
	tab := func() *Table {
		return targetWorld(10*time.Millisecond, 500*time.Millisecond, 1000, map[string]int{"s": 8 + 40})
	}
	// 40 queued on 8 slots of 500 ms: 2.5 s of wait
	for _, c := range []struct {
		target    time.Duration
		saturated bool
	}{{0, true}, {4 * time.Second, false}, {2 * time.Second, true}, {-1, false}} {
		e := engine(t, Config{ExploreShare: -1, QueueTarget: c.target})
		if d, err := e.Decide(tab(), req("slow")); err != nil || d.Saturated != c.saturated {
			t.Errorf("queue target %v: %+v %v, want saturated %v", c.target, d, err, c.saturated)
		}
	}
}

// A model that slows down (50 ms to 200 ms) has its target follow its
// window's mean: its nodes queue the same number of attempts as before
// (a fixed 150 ms target would hold every task of it once a slot's worth
// waits: its service time alone is nearly the target).
func TestQueueTargetFollowsLatency(t *testing.T) {
	t.Parallel()
	auto := engine(t, Config{ExploreShare: -1})
	fixed := engine(t, Config{ExploreShare: -1, QueueTarget: 150 * time.Millisecond})
	for _, lat := range []time.Duration{50 * time.Millisecond, 200 * time.Millisecond} {
		one := targetWorld(lat, lat, 1000, map[string]int{"s": 8 + 1})
		if d, _ := fixed.Decide(one, req("slow")); d.Saturated != (lat > 100*time.Millisecond) {
			t.Errorf("%v, 1 queued on 8 slots, fixed 150 ms: %+v", lat, d)
		}
		queued := targetWorld(lat, lat, 1000, map[string]int{"s": 8 + 14})
		if d, err := auto.Decide(queued, req("slow")); err != nil || d.Saturated {
			t.Errorf("%v, 14 queued on 8 slots: %+v %v, want not saturated", lat, d, err)
		}
		// the histogram's mean is within its buckets' width of lat
		pts := auto.QueueTargets(queued)
		if len(pts) != 2 || pts[1].Model != "slow" || pts[1].Node != "s" || pts[1].Mode != "auto" ||
			(pts[1].Target-3*pts[1].Service).Abs() > 10*time.Microsecond || pts[1].Service < lat*3/4 || pts[1].Service > lat*5/4 || pts[1].Samples != 1000 {
			t.Errorf("%v: queue targets %+v, want slow on s at 3 x its service time (about %v), auto", lat, pts, lat)
		}
	}
}

// While a pair has few measured attempts its target is at least a tenth of
// the timeout (at most 1 s): its service time is borrowed or assumed.
func TestQueueTargetFloorWhileFewSamples(t *testing.T) {
	t.Parallel()
	e := engine(t, Config{ExploreShare: -1, Timeout: 2 * time.Second})
	few := targetWorld(10*time.Millisecond, 10*time.Millisecond, 5, nil)
	many := targetWorld(10*time.Millisecond, 10*time.Millisecond, 500, nil)
	if pt := e.QueueTargets(few)[0]; pt.Mode != "floor" || pt.Target != 200*time.Millisecond {
		t.Errorf("5 samples, 2 s timeout: %+v, want the 200 ms floor", pt)
	}
	// 3 x 10 ms is 30 ms, above the 20 ms least target
	if pt := e.QueueTargets(many)[0]; pt.Mode != "auto" || (pt.Target-3*pt.Service).Abs() > 10*time.Microsecond || pt.Target > 40*time.Millisecond {
		t.Errorf("500 samples: %+v, want auto at 3 x its service time (about 30 ms)", pt)
	}
	tiny := targetWorld(time.Millisecond, time.Millisecond, 500, nil)
	if pt := e.QueueTargets(tiny)[0]; pt.Mode != "floor" || pt.Target != 20*time.Millisecond {
		t.Errorf("1 ms model: %+v, want the 20 ms least target", pt)
	}
	if pts := engine(t, Config{QueueTarget: -1}).QueueTargets(many); pts[0].Mode != "off" || pts[0].Target != 0 {
		t.Errorf("off: %+v", pts[0])
	}
}

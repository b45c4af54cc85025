package policy

import (
	"testing"
	"time"

	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/shared/protocol"
)

func TestReliabilityPrefersWellMeasured(t *testing.T) {
	t.Parallel()
	snap := snapshot(map[string]stats.Series{
		"big":   series(970, 30, 20*time.Millisecond, 20*time.Millisecond),
		"small": series(3, 0, 20*time.Millisecond, 0),
	})
	tab := NewTable(snap, []protocol.Heartbeat{hb("n1", "t", 8, "big", "small")}, t0)
	e := engine(t, Config{ExploreShare: -1})
	got := counts(t, e, tab, &Request{Type: "t"}, 200)
	if got["big"] != 200 {
		t.Fatalf("reliability chose %v, want big every time", got)
	}
}

func TestReliabilityPrefersHigherRate(t *testing.T) {
	t.Parallel()
	snap := snapshot(map[string]stats.Series{
		"a": series(800, 200, 5*time.Millisecond, 5*time.Millisecond),
		"b": series(990, 10, 50*time.Millisecond, 50*time.Millisecond),
		"c": series(900, 100, 5*time.Millisecond, 5*time.Millisecond),
	})
	tab := NewTable(snap, []protocol.Heartbeat{hb("n1", "t", 8, "a", "b", "c")}, t0)
	e := engine(t, Config{ExploreShare: -1})
	if got := counts(t, e, tab, &Request{Type: "t"}, 100); got["b"] != 100 {
		t.Fatalf("chose %v, want b (99%%) every time despite its latency", got)
	}
}

func TestReliabilityTiesGoToLowerLatency(t *testing.T) {
	t.Parallel()
	snap := snapshot(map[string]stats.Series{
		"slow": series(500, 5, 80*time.Millisecond, time.Millisecond),
		"fast": series(500, 5, 8*time.Millisecond, time.Millisecond),
	})
	tab := NewTable(snap, []protocol.Heartbeat{hb("n1", "t", 8, "slow", "fast")}, t0)
	e := engine(t, Config{ExploreShare: -1})
	if got := counts(t, e, tab, &Request{Type: "t"}, 100); got["fast"] != 100 {
		t.Fatalf("chose %v, want fast on a reliability tie", got)
	}
}

func TestReliabilityExploresUnsampledModel(t *testing.T) {
	t.Parallel()
	snap := snapshot(map[string]stats.Series{
		"old": series(990, 10, 10*time.Millisecond, time.Millisecond),
		// "new" has no statistics at all, "young" too few
		"young": series(5, 0, 10*time.Millisecond, 0),
	})
	tab := NewTable(snap, []protocol.Heartbeat{hb("n1", "t", 8, "old", "new", "young")}, t0)
	e := engine(t, Config{}) // default share 0.05, min samples 20
	const n = 4000
	got := counts(t, e, tab, &Request{Type: "t"}, n)
	if got["new"] == 0 {
		t.Fatalf("an unsampled model was never explored: %v", got)
	}
	explored := got["new"] + got["young"]
	if explored < n/100 || explored > n/10 {
		t.Fatalf("explored %d of %d, want about 5%%: %v", explored, n, got)
	}
	if got["old"] < n*85/100 {
		t.Fatalf("the measured best got only %d of %d: %v", got["old"], n, got)
	}
	// the least measured goes first
	if got["new"] <= got["young"] {
		t.Fatalf("exploration should favour the least measured model: %v", got)
	}
}

func TestExplorationDisabled(t *testing.T) {
	t.Parallel()
	snap := snapshot(map[string]stats.Series{"old": series(990, 10, 10*time.Millisecond, time.Millisecond)})
	tab := NewTable(snap, []protocol.Heartbeat{hb("n1", "t", 8, "old", "new")}, t0)
	e := engine(t, Config{ExploreShare: -1})
	if got := counts(t, e, tab, &Request{Type: "t"}, 2000); got["new"] != 0 {
		t.Fatalf("exploration disabled but got %v", got)
	}
}

func TestLatencyAvoidsFastFailingModel(t *testing.T) {
	t.Parallel()
	snap := snapshot(map[string]stats.Series{
		// fails 90% of the time, in 1ms; succeeds in 2ms
		"flaky": series(100, 900, 2*time.Millisecond, time.Millisecond),
		// always fails, in 100µs: no success latency at all
		"broken": series(0, 1000, 0, 100*time.Microsecond),
		"steady": series(1000, 0, 15*time.Millisecond, 0),
	})
	tab := NewTable(snap, []protocol.Heartbeat{hb("n1", "t", 8, "flaky", "broken", "steady")}, t0)
	e := engine(t, Config{Default: Latency})
	if got := counts(t, e, tab, &Request{Type: "t"}, 500); got["steady"] != 500 {
		t.Fatalf("latency policy chose %v, want steady: a fast failure is not fast", got)
	}
}

func TestLatencyPicksFastestReliable(t *testing.T) {
	t.Parallel()
	snap := snapshot(map[string]stats.Series{
		"a": series(1000, 10, 40*time.Millisecond, 40*time.Millisecond),
		"b": series(1000, 10, 4*time.Millisecond, 4*time.Millisecond),
		"c": series(1000, 10, 12*time.Millisecond, 12*time.Millisecond),
	})
	tab := NewTable(snap, []protocol.Heartbeat{hb("n1", "t", 8, "a", "b", "c")}, t0)
	e := engine(t, Config{Default: Latency, ExploreShare: -1})
	if got := counts(t, e, tab, &Request{Type: "t"}, 200); got["b"] != 200 {
		t.Fatalf("chose %v, want b", got)
	}
}

func TestThompsonSpreadsButPrefersBest(t *testing.T) {
	t.Parallel()
	snap := snapshot(map[string]stats.Series{
		"best":  series(45, 5, 10*time.Millisecond, time.Millisecond),
		"good":  series(42, 8, 10*time.Millisecond, time.Millisecond),
		"bad":   series(20, 30, 10*time.Millisecond, time.Millisecond),
		"fresh": {},
	})
	tab := NewTable(snap, []protocol.Heartbeat{hb("n1", "t", 8, "best", "good", "bad", "fresh")}, t0)
	e := engine(t, Config{Default: Thompson})
	const n = 4000
	got := counts(t, e, tab, &Request{Type: "t"}, n)
	if got["best"] <= got["good"] || got["good"] <= got["bad"] {
		t.Fatalf("thompson order wrong: %v", got)
	}
	if got["best"] < n/2 {
		t.Fatalf("best got %d of %d: %v", got["best"], n, got)
	}
	if got["good"] < n/20 || got["fresh"] == 0 {
		t.Fatalf("thompson did not spread traffic: %v", got)
	}
	if got["bad"] > n/100 {
		t.Fatalf("bad got too much: %v", got)
	}
}

func TestThompsonLatencyWeight(t *testing.T) {
	t.Parallel()
	snap := snapshot(map[string]stats.Series{
		"slow": series(950, 50, 100*time.Millisecond, time.Millisecond),
		"fast": series(950, 50, 5*time.Millisecond, time.Millisecond),
	})
	tab := NewTable(snap, []protocol.Heartbeat{hb("n1", "t", 8, "slow", "fast")}, t0)
	plain := counts(t, engine(t, Config{Default: Thompson}), tab, &Request{Type: "t"}, 2000)
	if plain["slow"] < 600 || plain["fast"] < 600 {
		t.Fatalf("equal models should split without latency weight: %v", plain)
	}
	weighted := counts(t, engine(t, Config{Default: Thompson, LatencyWeight: 0.2}), tab, &Request{Type: "t"}, 2000)
	if weighted["fast"] < 1900 {
		t.Fatalf("latency weight should favour fast: %v", weighted)
	}
}

func TestBaselines(t *testing.T) {
	t.Parallel()
	snap := snapshot(map[string]stats.Series{
		"a": series(10, 0, time.Millisecond, 0),
		"b": series(10, 0, time.Millisecond, 0),
		"c": series(10, 0, time.Millisecond, 0),
	})
	snap.Models["a"].InFlight = 6
	snap.Models["b"].InFlight = 1
	snap.Models["c"].InFlight = 3
	hbs := []protocol.Heartbeat{hb("n1", "t", 4, "a", "b", "c")}

	t.Run("round-robin", func(t *testing.T) {
		t.Parallel()
		tab := NewTable(snap, hbs, t0)
		got := counts(t, engine(t, Config{Default: RoundRobin}), tab, &Request{Type: "t"}, 300)
		if got["a"] != 100 || got["b"] != 100 || got["c"] != 100 {
			t.Fatalf("round-robin: %v", got)
		}
	})
	t.Run("random", func(t *testing.T) {
		t.Parallel()
		tab := NewTable(snap, hbs, t0)
		got := counts(t, engine(t, Config{Default: Random}), tab, &Request{Type: "t"}, 3000)
		for _, m := range []string{"a", "b", "c"} {
			if got[m] < 800 || got[m] > 1200 {
				t.Fatalf("random not uniform: %v", got)
			}
		}
	})
	t.Run("least-loaded", func(t *testing.T) {
		t.Parallel()
		tab := NewTable(snap, hbs, t0)
		e := engine(t, Config{Default: LeastLoaded})
		// b has 1 in flight, c 3, a 6: b takes two, then b and c alternate
		// as local dispatches fill them up
		var seq []string
		for i := 0; i < 6; i++ {
			d, err := e.Decide(tab, &Request{Type: "t"})
			if err != nil {
				t.Fatal(err)
			}
			tab.Dispatched(d.Model, d.Node)
			seq = append(seq, d.Model)
		}
		n := map[string]int{}
		for _, m := range seq {
			n[m]++
		}
		if seq[0] != "b" || seq[1] != "b" || n["a"] != 0 || n["b"] != 4 || n["c"] != 2 {
			t.Fatalf("least-loaded sequence %v", seq)
		}
	})
}

// A newcomer past MinSamples that may still be better than the incumbent
// keeps being explored; a model known to be worse does not.
func TestReliabilityExploresPlausiblyBetter(t *testing.T) {
	t.Parallel()
	snap := snapshot(map[string]stats.Series{
		"incumbent": series(5760, 240, 100*time.Millisecond, time.Millisecond), // 96%, well measured
		"newcomer":  series(30, 0, 100*time.Millisecond, 0),                    // 30/30: may be better
		"worse":     series(900, 100, 10*time.Millisecond, time.Millisecond),   // 90%: known worse
	})
	tab := NewTable(snap, []protocol.Heartbeat{hb("n1", "t", 8, "incumbent", "newcomer", "worse")}, t0)
	const n = 4000
	got := counts(t, engine(t, Config{}), tab, &Request{Type: "t"}, n)
	if got["newcomer"] < n/100 || got["newcomer"] > n/10 || got["worse"] != 0 || got["incumbent"] < n*85/100 {
		t.Fatalf("%v: want about 5%% on the newcomer, none on the known worse model", got)
	}
	// once the newcomer's lower bound overtakes, it leads
	snap.Models["newcomer"].Successes = 400
	tab = NewTable(snap, []protocol.Heartbeat{hb("n1", "t", 8, "incumbent", "newcomer", "worse")}, t0)
	if got := counts(t, engine(t, Config{}), tab, &Request{Type: "t"}, 1000); got["newcomer"] < 900 {
		t.Fatalf("%v: the proven newcomer should lead", got)
	}
}

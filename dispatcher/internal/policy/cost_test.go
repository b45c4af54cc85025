package policy

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/shared/protocol"
)

// pricedHB is a heartbeat of a node hosting models of type "t" at the
// given costs per task (0: no cost declared).
func pricedHB(node string, capacity int, costs map[string]float64) protocol.Heartbeat {
	h := protocol.Heartbeat{Node: node, Capacity: capacity, SentAt: t0}
	for m, c := range costs {
		h.Models = append(h.Models, protocol.ModelInfo{Name: m, Types: []string{"t"}, CostPerTask: c})
	}
	return h
}

// costWorld: cheap is 97% reliable, mid 99.8%, premium 99.95%, all well
// measured; costs 1 : 4 : 15.
func costWorld() (*stats.Snapshot, []protocol.Heartbeat) {
	snap := snapshot(map[string]stats.Series{
		"cheap":   series(9700, 300, 20*time.Millisecond, time.Millisecond),
		"mid":     series(9980, 20, 20*time.Millisecond, time.Millisecond),
		"premium": series(9995, 5, 20*time.Millisecond, time.Millisecond),
	})
	return snap, []protocol.Heartbeat{pricedHB("n1", 64, map[string]float64{"cheap": 1, "mid": 4, "premium": 15})}
}

// The cheapest model that clears the bar is bought; the bar decides which.
func TestCostBuysCheapestAboveBar(t *testing.T) {
	t.Parallel()
	snap, hbs := costWorld()
	tab := NewTable(snap, hbs, t0)
	for _, c := range []struct {
		bar  float64
		want string
	}{{0.95, "cheap"}, {0.99, "mid"}, {0.999, "premium"}} {
		e := engine(t, Config{Default: Cost, ExploreShare: -1, MinSuccess: map[string]float64{"t": c.bar}})
		if got := counts(t, e, tab, &Request{Type: "t"}, 200); got[c.want] != 200 {
			t.Errorf("bar %g: chose %v, want %s every time", c.bar, got, c.want)
		}
	}
	// "*" sets the bar of the types not named; the default is 0.99
	e := engine(t, Config{Default: Cost, ExploreShare: -1, MinSuccess: map[string]float64{"*": 0.95}})
	if got := counts(t, e, tab, &Request{Type: "t"}, 100); got["cheap"] != 100 {
		t.Errorf("bar * = 0.95: chose %v, want cheap", got)
	}
	if e := engine(t, Config{Default: Cost}); e.MinSuccessFor("t") != DefaultMinSuccess {
		t.Errorf("default bar %g, want %g", e.MinSuccessFor("t"), DefaultMinSuccess)
	}
}

// Above every model's bound, the cost policy is reliability: the most
// reliable model.
func TestCostFallsBackToReliability(t *testing.T) {
	t.Parallel()
	snap, hbs := costWorld()
	tab := NewTable(snap, hbs, t0)
	e := engine(t, Config{Default: Cost, ExploreShare: -1, MinSuccess: map[string]float64{"t": 0.9999}})
	if got := counts(t, e, tab, &Request{Type: "t"}, 200); got["premium"] != 200 {
		t.Fatalf("chose %v, want premium (reliability's choice) every time", got)
	}
}

// A task's min_success_rate is its bar (and, as for every policy, a
// constraint on the smoothed rate).
func TestCostTaskBar(t *testing.T) {
	t.Parallel()
	snap, hbs := costWorld()
	tab := NewTable(snap, hbs, t0)
	e := engine(t, Config{Default: Cost, ExploreShare: -1, MinSuccess: map[string]float64{"t": 0.95}})
	if got := counts(t, e, tab, &Request{Type: "t", MinSuccessRate: 0.999}, 200); got["premium"] != 200 {
		t.Fatalf("chose %v for a task asking 0.999, want premium", got)
	}
}

// The price is per task plus per unit of the task's size: a large task
// makes the per-unit model dearer than a flat one.
func TestCostWeighsSize(t *testing.T) {
	t.Parallel()
	snap := snapshot(map[string]stats.Series{
		"flat":    series(9990, 10, 20*time.Millisecond, time.Millisecond),
		"metered": series(9990, 10, 20*time.Millisecond, time.Millisecond),
	})
	hbs := []protocol.Heartbeat{{Node: "n1", Capacity: 8, SentAt: t0, Models: []protocol.ModelInfo{
		{Name: "flat", Types: []string{"t"}, CostPerTask: 5},
		{Name: "metered", Types: []string{"t"}, CostPerTask: 1, CostPerUnit: 0.01},
	}}}
	tab := NewTable(snap, hbs, t0)
	e := engine(t, Config{Default: Cost, ExploreShare: -1})
	if got := counts(t, e, tab, &Request{Type: "t", Size: 100}, 100); got["metered"] != 100 {
		t.Errorf("size 100 (metered costs 2, flat 5): %v", got)
	}
	if got := counts(t, e, tab, &Request{Type: "t", Size: 1000}, 100); got["flat"] != 100 {
		t.Errorf("size 1000 (metered costs 11, flat 5): %v", got)
	}
}

// Without any declared cost the cost policy decides exactly as
// reliability: the same choices for the same seed.
func TestCostWithoutPricesIsReliability(t *testing.T) {
	t.Parallel()
	snap := snapshot(map[string]stats.Series{
		"a": series(970, 30, 20*time.Millisecond, time.Millisecond),
		"b": series(5, 0, 20*time.Millisecond, 0),
		"c": series(990, 10, 40*time.Millisecond, time.Millisecond),
	})
	hbs := []protocol.Heartbeat{hb("n1", "t", 8, "a", "b", "c"), hb("n2", "t", 8, "a", "c")}
	tab := NewTable(snap, hbs, t0)
	rel := engine(t, Config{Default: Reliability, Seed: 7})
	cst := engine(t, Config{Default: Cost, Seed: 7})
	for i := range 2000 {
		req := &Request{Type: "t"}
		if i%3 == 0 {
			req.Tried = []protocol.Attempt{{Model: "c", Node: "n1"}}
		}
		d1, err1 := rel.Decide(tab, req)
		d2, err2 := cst.Decide(tab, req)
		if d1 != d2 || !errors.Is(err1, err2) {
			t.Fatalf("decision %d: reliability %+v (%v), cost %+v (%v)", i, d1, err1, d2, err2)
		}
	}
}

// A retry goes to the most reliable model left, not the cheapest.
func TestCostRetryBuysReliability(t *testing.T) {
	t.Parallel()
	snap, hbs := costWorld()
	tab := NewTable(snap, hbs, t0)
	e := engine(t, Config{Default: Cost, MinSuccess: map[string]float64{"t": 0.95}})
	req := &Request{Type: "t", Tried: []protocol.Attempt{{Model: "cheap", Node: "n1", Status: protocol.OutcomeModelError}}}
	if got := counts(t, e, tab, req, 200); got["premium"] != 200 {
		t.Fatalf("retry after cheap failed: %v, want premium every time", got)
	}
}

// An unproven cheap model gets at most the exploration share of the
// decisions while a proven model clears the bar.
func TestCostExploresUnprovenCheapModelLittle(t *testing.T) {
	t.Parallel()
	snap := snapshot(map[string]stats.Series{
		"mid":     series(9980, 20, 20*time.Millisecond, time.Millisecond),
		"premium": series(9995, 5, 20*time.Millisecond, time.Millisecond),
		"cheap":   series(30, 0, 20*time.Millisecond, 0),
	})
	tab := NewTable(snap, []protocol.Heartbeat{pricedHB("n1", 64, map[string]float64{"cheap": 1, "mid": 4, "premium": 15})}, t0)
	e := engine(t, Config{Default: Cost})
	const n = 10000
	got := counts(t, e, tab, &Request{Type: "t"}, n)
	if got["cheap"] == 0 || got["cheap"] > n*7/100 {
		t.Fatalf("cheap and unproven got %d of %d, want some but at most about the 5%% share: %v", got["cheap"], n, got)
	}
	if got["mid"] < n*93/100 {
		t.Fatalf("the cheapest proven model got %d of %d: %v", got["mid"], n, got)
	}
}

// An unproven cheaper model that already holds CostExploreCap of the
// type's outcomes in the window is not explored further: it is bought once
// its bound clears the bar, or not at all.
func TestCostExplorationCap(t *testing.T) {
	t.Parallel()
	world := func(cheapOK int64) *Table {
		snap := snapshot(map[string]stats.Series{
			"mid":     series(2990, 10, 20*time.Millisecond, time.Millisecond),
			"premium": series(2000, 1, 20*time.Millisecond, time.Millisecond),
			"cheap":   series(cheapOK, 0, 20*time.Millisecond, 0),
		})
		return NewTable(snap, []protocol.Heartbeat{pricedHB("n1", 64, map[string]float64{"cheap": 1, "mid": 4, "premium": 15})}, t0)
	}
	e := engine(t, Config{Default: Cost})
	// 60 of about 5060 outcomes: under the 1.5% cap (76), explored
	if got := counts(t, e, world(60), &Request{Type: "t"}, 4000); got["cheap"] < 100 || got["cheap"] > 300 {
		t.Errorf("cheap under the cap: %v, want about 5%% of 4000", got)
	}
	// 100 of 5100: over the cap (76) and not proven (100/100 scores 0.984)
	if got := counts(t, e, world(100), &Request{Type: "t"}, 4000); got["cheap"] != 0 || got["mid"] < 3900 {
		t.Errorf("cheap over the cap: %v, want mid and never cheap", got)
	}
	// a negative cap: never explored
	e = engine(t, Config{Default: Cost, CostExploreCap: -1})
	if got := counts(t, e, world(60), &Request{Type: "t"}, 4000); got["cheap"] != 0 {
		t.Errorf("cap disabled: %v, want cheap never", got)
	}
}

func TestCostConfigErrors(t *testing.T) {
	t.Parallel()
	for _, bar := range []float64{0, 1, -0.5, 1.2} {
		_, err := NewEngine(Config{Default: Cost, MinSuccess: map[string]float64{"t": bar}})
		if !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("bar %g: %v, want ErrInvalidConfig", bar, err)
		}
	}
	if _, err := NewEngine(Config{CostExploreCap: 1.5}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("cap 1.5: %v, want ErrInvalidConfig", err)
	}
	if e, err := NewEngine(Config{PerType: map[string]string{"chat": Cost}}); err != nil || e.PolicyFor("chat") != Cost || e.PolicyFor("x") != Reliability {
		t.Errorf("per type: %v", err)
	}
}

// closedLoop runs n first attempts through a real store at 100 tasks a
// simulated second, rebuilding the table every 250 ms as the dispatcher
// does, with each model failing at its true rate; it returns each model's
// first attempts after warm (and their total).
func closedLoop(t *testing.T, e *Engine, hbs []protocol.Heartbeat, truth map[string]float64, n, warm int) (map[string]int, int) {
	t.Helper()
	ctx := context.Background()
	now := t0
	st := stats.NewMemory(stats.Window{Size: 5 * time.Minute, Bucket: 10 * time.Second}, stats.WithClock(func() time.Time { return now }))
	defer st.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	var tab *Table
	got, total := map[string]int{}, 0
	for i := range n {
		if i%25 == 0 {
			snap, err := st.Snapshot(ctx)
			if err != nil {
				t.Fatal(err)
			}
			tab = NewTable(snap, hbs, now)
		}
		d, err := e.Decide(tab, &Request{Type: "t"})
		if err != nil {
			t.Fatal(err)
		}
		if i >= warm {
			got[d.Model]++
			total++
		}
		k := stats.KindSuccess
		if rng.Float64() >= truth[d.Model] {
			k = stats.KindModelError
		}
		if err := st.Record(ctx, []stats.Event{{Model: d.Model, Node: d.Node, Kind: stats.KindDispatched, At: now},
			{Model: d.Model, Node: d.Node, Kind: k, Latency: 20 * time.Millisecond, At: now}}); err != nil {
			t.Fatal(err)
		}
		now = now.Add(10 * time.Millisecond)
	}
	return got, total
}

// With the bar above the cheap model's true success, the cheap model gets
// at most 2% of first attempts after warm-up: it is not bought when it is
// not good enough, even when it is so close to the bar (98.7% against
// 99%) that its bound cannot tell within the window, where only the cap
// bounds it. With the bar below it, it takes nearly all of them.
func TestCostClosedLoopCheapModelShare(t *testing.T) {
	t.Parallel()
	hbs := []protocol.Heartbeat{pricedHB("n1", 1000, map[string]float64{"cheap": 1, "mid": 4, "premium": 15})}
	const n, warm = 60000, 12000 // 10 minutes, 2 of warm-up
	for _, c := range []struct {
		cheap, bar float64
		min, max   float64 // cheap's share
	}{{0.97, 0.99, 0, 0.02}, {0.987, 0.99, 0, 0.02}, {0.97, 0.95, 0.9, 1}} {
		truth := map[string]float64{"cheap": c.cheap, "mid": 0.998, "premium": 0.9995}
		e := engine(t, Config{Default: Cost, MinSuccess: map[string]float64{"t": c.bar}})
		got, total := closedLoop(t, e, hbs, truth, n, warm)
		share := float64(got["cheap"]) / float64(total)
		t.Logf("cheap %g, bar %g: %v (cheap %.2f%%)", c.cheap, c.bar, got, share*100)
		if share < c.min || share > c.max {
			t.Errorf("cheap %g, bar %g: cheap got %.2f%% of first attempts after warm-up, want %g..%g%%: %v", c.cheap, c.bar, share*100, c.min*100, c.max*100, got)
		}
		if c.bar > c.cheap && float64(got["mid"])/float64(total) < 0.9 {
			t.Errorf("cheap %g, bar %g: the cheapest model above the bar (mid) got %v", c.cheap, c.bar, got)
		}
	}
}

// When no model clears the bar, the fallback is reliability among the
// models that may still clear it: a model measured below the bar (its
// upper bound under it) is not bought, although reliability alone ranks
// it first because it is better measured.
func TestCostFallbackSkipsModelsBelowBar(t *testing.T) {
	t.Parallel()
	snap := snapshot(map[string]stats.Series{
		"small": series(19940, 60, 20*time.Millisecond, time.Millisecond), // 99.7%: upper bound 99.77%
		"large": series(299, 1, 20*time.Millisecond, time.Millisecond),    // may be 99.9%: not proven at 99.8%
	})
	hbs := []protocol.Heartbeat{pricedHB("n1", 64, map[string]float64{"small": 1, "large": 15})}
	tab := NewTable(snap, hbs, t0)
	if got := counts(t, engine(t, Config{Default: Reliability, ExploreShare: -1}), tab, &Request{Type: "t"}, 100); got["small"] != 100 {
		t.Fatalf("test setup: reliability chose %v, want small", got)
	}
	e := engine(t, Config{Default: Cost, ExploreShare: -1, MinSuccess: map[string]float64{"t": 0.998}})
	if got := counts(t, e, tab, &Request{Type: "t"}, 100); got["large"] != 100 {
		t.Errorf("bar 0.998: chose %v, want large (small is measured below the bar)", got)
	}
	// no model may clear the bar: reliability among all
	e = engine(t, Config{Default: Cost, ExploreShare: -1, MinSuccess: map[string]float64{"t": 0.9999}})
	if got := counts(t, e, tab, &Request{Type: "t"}, 100); got["small"] != 100 {
		t.Errorf("bar 0.9999: chose %v, want reliability's choice (small)", got)
	}
}

// The next dearer model is kept proven: explored while it is not, up to
// what proving the bar takes, so that it is bought at once when the
// choice fails, instead of reliability's (dearest) choice.
func TestCostKeepsStandbyProven(t *testing.T) {
	t.Parallel()
	world := func(midOK int64) *Table {
		snap := snapshot(map[string]stats.Series{
			"cheap":   series(29950, 50, 20*time.Millisecond, time.Millisecond),
			"mid":     series(midOK, 0, 20*time.Millisecond, 0),
			"premium": series(5000, 0, 20*time.Millisecond, 0),
		})
		return NewTable(snap, []protocol.Heartbeat{pricedHB("n1", 64, map[string]float64{"cheap": 1, "mid": 4, "premium": 15})}, t0)
	}
	e := engine(t, Config{Default: Cost})
	const n = 4000
	// 60 outcomes: not proven (score 0.974), explored at about the share
	if got := counts(t, e, world(60), &Request{Type: "t"}, n); got["mid"] < n*3/100 || got["mid"] > n*7/100 || got["premium"] != 0 {
		t.Errorf("unproven standby: %v, want mid about 5%%, premium never", got)
	}
	// 400 outcomes without failure: proven (score 0.996), not explored
	if got := counts(t, e, world(400), &Request{Type: "t"}, n); got["mid"] != 0 || got["cheap"] != n {
		t.Errorf("proven standby: %v, want cheap every time", got)
	}
}

// The cost policy allocates nothing per decision either, in each of its
// paths: the cheapest above the bar, exploration, the fallback.
func TestCostDecideAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items under the race detector")
	}
	snap, hbs := costWorld()
	tab := NewTable(snap, hbs, t0)
	for _, bar := range []float64{0.99, 0.9999} {
		e := engine(t, Config{Default: Cost, MinSuccess: map[string]float64{"t": bar}})
		req := &Request{Type: "t", Size: 10}
		if n := testing.AllocsPerRun(500, func() {
			if _, err := e.Decide(tab, req); err != nil {
				t.Fatal(err)
			}
		}); n != 0 {
			t.Errorf("bar %g: %v allocations per decision", bar, n)
		}
	}
}

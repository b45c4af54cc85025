package policy

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/shared/protocol"
)

func TestNewEngineConfig(t *testing.T) {
	t.Parallel()
	e, err := NewEngine(Config{PerType: map[string]string{"fast": Latency, "ab": Thompson}})
	if err != nil {
		t.Fatal(err)
	}
	if e.PolicyFor("fast") != Latency || e.PolicyFor("ab") != Thompson || e.PolicyFor("other") != Reliability {
		t.Fatalf("PolicyFor: %s %s %s", e.PolicyFor("fast"), e.PolicyFor("ab"), e.PolicyFor("other"))
	}
	c := e.Config()
	if c.MinSamples != 20 || c.ExploreShare != 0.05 || c.Breaker.ConsecutiveFailures != 5 || c.Breaker.FailureRate != 0.5 ||
		c.Breaker.MinRequests != 20 || c.Breaker.Cooldown != 10*time.Second || c.Breaker.HalfOpenProbes != 3 {
		t.Fatalf("defaults not filled: %+v", c)
	}

	_, err = NewEngine(Config{Default: "fastest"})
	if !errors.Is(err, ErrUnknownPolicy) || !strings.Contains(err.Error(), `"fastest"`) {
		t.Fatalf("unknown default: %v", err)
	}
	_, err = NewEngine(Config{PerType: map[string]string{"img": "greedy"}})
	if !errors.Is(err, ErrUnknownPolicy) || !strings.Contains(err.Error(), `"greedy"`) || !strings.Contains(err.Error(), `"img"`) {
		t.Fatalf("unknown per-type: %v", err)
	}
	for _, bad := range []Config{
		{ExploreShare: 1.5},
		{LatencyWeight: -1},
		{Breaker: BreakerConfig{FailureRate: 2}},
		{Breaker: BreakerConfig{Cooldown: -time.Second}},
	} {
		if _, err := NewEngine(bad); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v: err %v, want ErrInvalidConfig", bad, err)
		}
	}
	for _, name := range Names {
		if e, err := NewEngine(Config{Default: name}); err != nil || e.PolicyFor("x") != name {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestPerTypePolicy(t *testing.T) {
	t.Parallel()
	snap := snapshot(map[string]stats.Series{
		"reliable": series(1000, 0, 50*time.Millisecond, 0),
		"quick":    series(900, 100, time.Millisecond, time.Millisecond),
	})
	h := protocol.Heartbeat{Node: "n1", Capacity: 4, Models: []protocol.ModelInfo{
		{Name: "reliable", Types: []string{"a", "b"}},
		{Name: "quick", Types: []string{"a", "b"}},
	}}
	tab := NewTable(snap, []protocol.Heartbeat{h}, t0)
	e := engine(t, Config{ExploreShare: -1, PerType: map[string]string{"b": Latency}})
	if got := counts(t, e, tab, &Request{Type: "a"}, 20); got["reliable"] != 20 {
		t.Fatalf("type a: %v", got)
	}
	if got := counts(t, e, tab, &Request{Type: "b"}, 20); got["quick"] != 20 {
		t.Fatalf("type b: %v", got)
	}
}

func TestSeedIsReproducible(t *testing.T) {
	t.Parallel()
	tab := NewTable(nil, []protocol.Heartbeat{hb("n1", "t", 4, "a", "b", "c"), hb("n2", "t", 4, "a", "b", "c"), hb("n3", "t", 4, "a")}, t0)
	run := func(seed uint64) string {
		e := engine(t, Config{Default: Random, Seed: seed})
		var b strings.Builder
		for i := 0; i < 50; i++ {
			d, err := e.Decide(tab, &Request{Type: "t"})
			if err != nil {
				t.Fatal(err)
			}
			b.WriteString(d.Model + d.Node)
		}
		return b.String()
	}
	if run(7) != run(7) {
		t.Fatal("same seed, different choices")
	}
	if run(7) == run(8) {
		t.Fatal("different seeds, same choices")
	}
}

func TestTableCandidates(t *testing.T) {
	t.Parallel()
	snap := snapshot(map[string]stats.Series{"a": series(970, 30, 10*time.Millisecond, 2*time.Millisecond)})
	snap.Models["a"].InFlight = 3
	tab := NewTable(snap, []protocol.Heartbeat{hb("n2", "t", 4, "b", "a"), hb("n1", "t", 2, "a"), hb("n3", "u", 1, "c")}, t0)
	if got := fmt.Sprint(tab.Types()); got != "[t u]" {
		t.Fatalf("types %s", got)
	}
	cs := tab.Candidates("t")
	if len(cs) != 2 || cs[0].Model != "a" || cs[1].Model != "b" {
		t.Fatalf("candidates %+v", cs)
	}
	a := cs[0]
	if a.Capacity != 6 || a.Samples() != 1000 || math.Abs(a.Rate-971.0/1002) > 1e-9 || a.Lower < 0.95 || a.Lower > 0.97 {
		t.Fatalf("candidate a: %+v", a)
	}
	if a.P95 < 10*time.Millisecond || a.P95 > 15*time.Millisecond || a.MeanUs < 7000 || a.MeanUs > 15000 || a.FailMeanUs != 2000 {
		t.Fatalf("latency of a: p95 %v mean %v fail %v", a.P95, a.MeanUs, a.FailMeanUs)
	}
	tab.Dispatched("a", "n1")
	tab.Dispatched("a", "n1")
	tab.Dispatched("ghost", "nowhere") // unknown: ignored
	if a.InFlight() != 5 || a.Load() != 5.0/6 {
		t.Fatalf("in flight %d load %g", a.InFlight(), a.Load())
	}
	if !math.IsInf(cs[1].ExpectedUs, 1) || cs[1].Rate != 0.5 || cs[1].Lower != 0 {
		t.Fatalf("unmeasured candidate: %+v", cs[1])
	}
}

// TestConcurrentDecide runs decisions, dispatches and table swaps at once;
// run with -race.
func TestConcurrentDecide(t *testing.T) {
	t.Parallel()
	snap := snapshot(map[string]stats.Series{
		"a": series(900, 100, time.Millisecond, time.Millisecond),
		"b": series(950, 50, 2*time.Millisecond, time.Millisecond),
		"c": series(10, 0, time.Millisecond, 0),
	})
	snap.Models["c"].Breaker = stats.Breaker{State: stats.BreakerHalfOpen, Since: t0}
	hbs := []protocol.Heartbeat{hb("n1", "t", 8, "a", "b", "c"), hb("n2", "t", 8, "a", "b"), hb("n3", "t", 8, "a", "c")}
	for _, pol := range Names {
		e := engine(t, Config{Default: pol, Breaker: BreakerConfig{HalfOpenProbes: 3}})
		tab := NewTable(snap, hbs, t0)
		var wg sync.WaitGroup
		var mu sync.Mutex
		total := map[string]int{}
		for g := 0; g < 8; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				local := map[string]int{}
				for i := 0; i < 500; i++ {
					req := &Request{Type: "t"}
					if i%3 == 0 {
						req.Tried = []protocol.Attempt{{Model: "a", Node: "n1"}}
					}
					d, err := e.Decide(tab, req)
					if err != nil || d.Node == "" || d.Panic {
						t.Errorf("%s: %+v %v", pol, d, err)
						return
					}
					tab.Dispatched(d.Model, d.Node)
					local[d.Model]++
				}
				mu.Lock()
				for k, v := range local {
					total[k] += v
				}
				mu.Unlock()
			}()
		}
		wg.Wait()
		// the half-open model got its probes and not one more, across
		// all goroutines
		if total["c"] != 3 {
			t.Fatalf("%s: half-open model got %d tasks, want 3 probes: %v", pol, total["c"], total)
		}
	}
}

func TestRandDistributions(t *testing.T) {
	t.Parallel()
	r := NewRand(1)
	const n = 20000
	for _, ab := range [][2]float64{{1, 1}, {2, 8}, {0.5, 0.5}, {300, 100}} {
		var sum, sq float64
		for i := 0; i < n; i++ {
			x := r.Beta(ab[0], ab[1])
			if x < 0 || x > 1 {
				t.Fatalf("Beta%v = %g", ab, x)
			}
			sum += x
			sq += x * x
		}
		a, b := ab[0], ab[1]
		mean, wantMean := sum/n, a/(a+b)
		vr, wantVar := sq/n-mean*mean, a*b/((a+b)*(a+b)*(a+b+1))
		if math.Abs(mean-wantMean) > 0.01 || math.Abs(vr-wantVar) > 0.15*wantVar+1e-4 {
			t.Errorf("Beta%v: mean %.4f (want %.4f) var %.5f (want %.5f)", ab, mean, wantMean, vr, wantVar)
		}
	}
	seen := [7]int{}
	for i := 0; i < 7000; i++ {
		seen[r.IntN(7)]++
	}
	for k, v := range seen {
		if v < 850 || v > 1150 {
			t.Fatalf("IntN(7) bucket %d: %d", k, v)
		}
	}
}

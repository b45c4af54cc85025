package policy

import (
	"fmt"
	"testing"
	"time"

	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/shared/protocol"
)

// benchWorld has models m0..m<models-1> serving type "t", each on `spread`
// of `nodes` nodes, with varied statistics, per-node series and latency.
func benchWorld(models, nodes, spread int) (*stats.Snapshot, []protocol.Heartbeat) {
	snap := &stats.Snapshot{Taken: t0, Window: 5 * time.Minute, Models: map[string]*stats.ModelStats{}}
	hbs := make([]protocol.Heartbeat, nodes)
	for n := range hbs {
		hbs[n] = protocol.Heartbeat{Node: fmt.Sprintf("node-%03d", n), Capacity: 16, InFlight: n % 5}
	}
	for m := 0; m < models; m++ {
		name := fmt.Sprintf("m%03d", m)
		s := series(int64(900+m%90), int64(10+m%50), time.Duration(5+m%20)*time.Millisecond, time.Millisecond)
		ms := &stats.ModelStats{Series: s, Nodes: map[string]*stats.Series{}}
		for k := 0; k < spread; k++ {
			n := (m + k) % nodes
			ns := series(int64(300+k), int64(k), 8*time.Millisecond, time.Millisecond)
			ms.Nodes[hbs[n].Node] = &ns
			hbs[n].Models = append(hbs[n].Models, protocol.ModelInfo{Name: name, Types: []string{"t", "u"}})
		}
		snap.Models[name] = ms
	}
	return snap, hbs
}

func benchDecide(b *testing.B, models int, pol string, req *Request) {
	snap, hbs := benchWorld(models, 20, 4)
	tab := NewTable(snap, hbs, t0)
	e, err := NewEngine(Config{Default: pol})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := e.Decide(tab, req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecide10 is the per-task cost with 10 candidate models on 4
// nodes each, default (reliability) policy.
func BenchmarkDecide10(b *testing.B) { benchDecide(b, 10, Reliability, &Request{Type: "t"}) }

func BenchmarkDecide100(b *testing.B) { benchDecide(b, 100, Reliability, &Request{Type: "t"}) }

func BenchmarkDecide10Policies(b *testing.B) {
	for _, pol := range Names {
		b.Run(pol, func(b *testing.B) { benchDecide(b, 10, pol, &Request{Type: "t"}) })
	}
}

func BenchmarkDecide100Thompson(b *testing.B) { benchDecide(b, 100, Thompson, &Request{Type: "t"}) }

// BenchmarkDecide10Constrained is a retry with an allow-list and both
// constraints.
func BenchmarkDecide10Constrained(b *testing.B) {
	benchDecide(b, 10, Reliability, &Request{Type: "t", Models: []string{"m001", "m002", "m003", "m004", "m005"},
		MaxLatencyMs: 100, MinSuccessRate: 0.5, Tried: []protocol.Attempt{{Model: "m001", Node: "node-001"}}})
}

func BenchmarkDecide10Parallel(b *testing.B) {
	snap, hbs := benchWorld(10, 20, 4)
	tab := NewTable(snap, hbs, t0)
	e, _ := NewEngine(Config{})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		req := &Request{Type: "t"}
		for pb.Next() {
			d, err := e.Decide(tab, req)
			if err != nil {
				b.Error(err)
				return
			}
			tab.Dispatched(d.Model, d.Node)
		}
	})
}

// BenchmarkNewTable is the cost of applying a snapshot (done every refresh).
func BenchmarkNewTable(b *testing.B) {
	for _, size := range []struct{ models, nodes int }{{10, 20}, {100, 50}} {
		b.Run(fmt.Sprintf("models=%d/nodes=%d", size.models, size.nodes), func(b *testing.B) {
			snap, hbs := benchWorld(size.models, size.nodes, 4)
			b.ReportAllocs()
			for b.Loop() {
				NewTable(snap, hbs, t0)
			}
		})
	}
}

func BenchmarkTransitions(b *testing.B) {
	snap, _ := benchWorld(100, 50, 4)
	e, _ := NewEngine(Config{})
	b.ReportAllocs()
	for b.Loop() {
		e.Transitions(snap, t0)
	}
}

func TestDecideAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items under the race detector")
	}
	snap, hbs := benchWorld(10, 20, 4)
	tab := NewTable(snap, hbs, t0)
	for _, pol := range Names {
		e := engine(t, Config{Default: pol})
		req := &Request{Type: "t", Models: []string{"m001", "m002", "m003"}, MaxLatencyMs: 500, Tried: []protocol.Attempt{{Model: "m001", Node: "node-001"}}}
		if n := testing.AllocsPerRun(200, func() {
			if _, err := e.Decide(tab, req); err != nil {
				t.Fatal(err)
			}
			tab.Dispatched("m002", "node-002")
		}); n != 0 {
			t.Errorf("%s: %v allocations per decision", pol, n)
		}
		e.SetSplits([]*Split{NewSplit("m002", 0.3)})
		if n := testing.AllocsPerRun(200, func() {
			if _, err := e.Decide(tab, &Request{Type: "t"}); err != nil {
				t.Fatal(err)
			}
		}); n != 0 {
			t.Errorf("%s with a split: %v allocations per decision", pol, n)
		}
	}
}

// BenchmarkDecide10Split is BenchmarkDecide10 under a rollout's split.
func BenchmarkDecide10Split(b *testing.B) {
	snap, hbs := benchWorld(10, 20, 4)
	tab := NewTable(snap, hbs, t0)
	e := engine(b, Config{})
	e.SetSplits([]*Split{NewSplit("m002", 0.05)})
	req := &Request{Type: "t"}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := e.Decide(tab, req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecide10Loaded is BenchmarkDecide10 with every node full and
// queued: the load model is evaluated for every candidate.
func BenchmarkDecide10Loaded(b *testing.B) {
	snap, hbs := benchWorld(10, 20, 4)
	for i := range hbs {
		hbs[i].InFlight, hbs[i].Queued = hbs[i].Capacity, 5+i%7
	}
	tab := NewTable(snap, hbs, t0)
	e, err := NewEngine(Config{})
	if err != nil {
		b.Fatal(err)
	}
	req := &Request{Type: "t"}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := e.Decide(tab, req); err != nil {
			b.Fatal(err)
		}
	}
}

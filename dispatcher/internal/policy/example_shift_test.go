package policy_test

import (
	"fmt"
	"time"

	"github.com/mlsched/mlsched/dispatcher/internal/policy"
	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/shared/protocol"
)

// A model that was reliable for the whole window starts failing: its
// recent buckets (stats.Series.Recent, a part of the window's counts)
// disagree with the rest of the window, so its estimates rest on them alone
// and it loses the lead although its window rate is still the best.
func ExampleNewTable_shift() {
	series := func(ok, failed, recentOK, recentFailed int64) *stats.ModelStats {
		ms := &stats.ModelStats{}
		ms.Successes, ms.ModelErrors = ok+recentOK, failed+recentFailed
		ms.Recent = stats.Counts{Successes: recentOK, ModelErrors: recentFailed}
		return ms
	}
	snap := &stats.Snapshot{Window: 5 * time.Minute, Models: map[string]*stats.ModelStats{
		"alpha": series(5400, 55, 72, 48), // 99% for minutes, then 40% failures
		"beta":  series(1900, 60, 95, 3),  // a steady 97%
	}}
	nodes := []protocol.Heartbeat{{Node: "gpu-1", Capacity: 8, Models: []protocol.ModelInfo{
		{Name: "alpha", Types: []string{"classify"}}, {Name: "beta", Types: []string{"classify"}}}}}
	table := policy.NewTable(snap, nodes, time.Now())
	for _, c := range table.Candidates("classify") {
		window := float64(snap.Models[c.Model].Successes) / float64(snap.Models[c.Model].Judged())
		fmt.Printf("%s: window %.3f, shifted %v, estimate %.3f from %d outcomes\n", c.Model, window, c.Shifted, c.Rate, c.Samples())
	}
	eng, _ := policy.NewEngine(policy.Config{ExploreShare: -1, Seed: 1})
	d, _ := eng.Decide(table, &policy.Request{Type: "classify"})
	fmt.Println("reliability →", d.Model)
	// Output:
	// alpha: window 0.982, shifted true, estimate 0.598 from 120 outcomes
	// beta: window 0.969, shifted false, estimate 0.969 from 2058 outcomes
	// reliability → beta
}

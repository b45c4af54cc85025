package policy_test

import (
	"fmt"
	"time"

	"github.com/mlsched/mlsched/dispatcher/internal/policy"
	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/shared/protocol"
)

// The dispatcher's loop: build a table every refresh, decide per task,
// report each dispatch, and apply breaker transitions.
func Example() {
	eng, err := policy.NewEngine(policy.Config{
		PerType: map[string]string{"embed": policy.Latency}, // everything else: reliability
		Seed:    1,                                          // reproducible choices, for this example
	})
	if err != nil {
		panic(err)
	}

	// Statistics as a stats.Store snapshot would return them.
	seen := func(ok, failed int64, lat time.Duration) *stats.ModelStats {
		ms := &stats.ModelStats{}
		ms.Successes, ms.ModelErrors = ok, failed
		for i := int64(0); i < ok; i++ {
			ms.Latency.Observe(lat)
		}
		return ms
	}
	snap := &stats.Snapshot{Window: 5 * time.Minute, Models: map[string]*stats.ModelStats{
		"gpt-small": seen(970, 30, 40*time.Millisecond),
		"gpt-tiny":  seen(3, 0, 5*time.Millisecond), // perfect, but 3 samples say little
	}}
	nodes := []protocol.Heartbeat{{
		Node: "gpu-1", Capacity: 8,
		Models: []protocol.ModelInfo{{Name: "gpt-small", Types: []string{"summarize"}}, {Name: "gpt-tiny", Types: []string{"summarize"}}},
	}}
	table := policy.NewTable(snap, nodes, time.Now())

	d, err := eng.Decide(table, &policy.Request{Type: "summarize"})
	if err != nil {
		panic(err)
	}
	table.Dispatched(d.Model, d.Node)
	fmt.Println(eng.PolicyFor("summarize"), "→", d.Model, "on", d.Node)

	// A retry avoids the model that just failed.
	d, _ = eng.Decide(table, &policy.Request{Type: "summarize", Tried: []protocol.Attempt{{Model: d.Model, Node: d.Node}}})
	fmt.Println("retry →", d.Model)

	// Constraints nobody meets are explained, candidate by candidate.
	_, err = eng.Decide(table, &policy.Request{Type: "summarize", MaxLatencyMs: 10, MinSuccessRate: 0.9})
	fmt.Println(err)

	// Breaker transitions are written by the dispatcher with SetBreaker.
	fmt.Println(len(eng.Transitions(snap, time.Now())), "transitions")
	// Output:
	// reliability → gpt-small on gpu-1
	// retry → gpt-tiny
	// constraints_unsatisfied: no model for type "summarize" meets max_latency_ms=10 min_success_rate=0.9: gpt-small: p95 42ms exceeds max_latency_ms 10; gpt-tiny: success rate 0.800 (3/3) below min_success_rate 0.9
	// 0 transitions
}

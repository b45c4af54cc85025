package simulate_test

import (
	"context"
	"fmt"

	"github.com/mlsched/mlsched/dispatcher/internal/simulate"
)

// A scenario is JSON: two models, one node, Poisson arrivals. The run
// compares the reliability policy with the oracle on the same tasks.
func Example() {
	sc, err := simulate.ParseScenario([]byte(`{
	  "name": "two-models",
	  "arrival": {"rate": 50, "types": {"summarize": 1}},
	  "models": [
	    {"name": "fast", "types": ["summarize"], "profile": [
	      {"at": "0s", "failure_prob": 0.2, "latency": {"dist": "fixed", "value": "50ms"}}]},
	    {"name": "sure", "types": ["summarize"], "profile": [
	      {"at": "0s", "failure_prob": 0.01, "latency": {"dist": "uniform", "min": "100ms", "max": "200ms"}}]}
	  ],
	  "nodes": [{"name": "gpu-1", "capacity": 32, "models": ["fast", "sure"]}]
	}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	rep, err := simulate.Run(context.Background(), sc, simulate.Options{Tasks: 5000, Seed: 42, Policies: []string{"reliability", "latency"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, r := range rep.Results {
		fmt.Printf("%-11s first-attempt success above 95%%: %v\n", r.Policy, r.FirstSuccess > 0.95)
	}
	// Output:
	// reliability first-attempt success above 95%: true
	// latency     first-attempt success above 95%: false
	// oracle      first-attempt success above 95%: true
}

// A scenario file's mistakes are reported with the offending field.
func ExampleParseScenario_error() {
	_, err := simulate.ParseScenario([]byte(`{"arrival": {"rate": 10, "types": {"t": 1}},
	  "models": [{"name": "m", "types": ["t"], "profile": [{"at": "0s", "failure_prob": 0.1, "latency": {"dist": "gamma"}}]}],
	  "nodes": [{"name": "n", "models": ["m"]}]}`))
	fmt.Println(err)
	// Output:
	// invalid scenario: models[0].profile[0].latency.dist: unknown distribution "gamma" (want fixed, uniform, normal or lognormal)
}

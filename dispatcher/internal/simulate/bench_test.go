package simulate

import (
	"context"
	"testing"

	"github.com/mlsched/mlsched/dispatcher/internal/policy"
)

// BenchmarkRun measures simulated tasks per second of wall time for one
// policy (the oracle runs too) on each built-in scenario.
func BenchmarkRun(b *testing.B) {
	for _, name := range []string{"stationary", "node-crash", "heavy-tail"} {
		for _, pol := range []string{policy.Reliability, policy.Thompson} {
			b.Run(name+"/"+pol, func(b *testing.B) {
				sc, err := Load(name)
				if err != nil {
					b.Fatal(err)
				}
				const tasks = 10_000
				b.ReportAllocs()
				for b.Loop() {
					if _, err := Run(context.Background(), sc, Options{Tasks: tasks, Policies: []string{pol}}); err != nil {
						b.Fatal(err)
					}
				}
				// two runs per iteration: the policy and the oracle
				b.ReportMetric(float64(2*tasks*b.N)/b.Elapsed().Seconds(), "tasks/s")
			})
		}
	}
}

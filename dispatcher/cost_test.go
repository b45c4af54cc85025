package dispatcher_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/mlsched/mlsched/dispatcher"
	"github.com/mlsched/mlsched/shared/protocol"
)

// The cost policy prices each model for the task's size, as the nodes
// announce their costs: once both models are proven (a low bar, so that a
// few successes prove them), a small task goes to the per-unit model and a
// large one to the flat-priced model.
func TestCostPolicyPricesTheTaskSize(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *dispatcher.Config) { c.Policy, c.MinSuccess = "cost", 0.01 })
	e.costs = map[string][2]float64{"flat": {5, 0}, "metered": {1, 0.01}}
	n := e.startNode("n1", []string{"summarize"}, map[string]behavior{"flat": succeed, "metered": succeed})
	e.warmUp("summarize", []string{"flat", "metered"}, 25)
	for i, c := range []struct {
		size float64
		want string
	}{{100, "metered"}, {1000, "flat"}} { // metered costs 2, then 11; flat 5
		for j := range 10 {
			id := fmt.Sprintf("s%d-%d", i, j)
			e.submit(protocol.Task{ID: id, Type: "summarize", Size: c.size})
			if r := e.result(id); r.Model != c.want {
				t.Errorf("size %g: %s went to %s, want %s (attempts: %v)", c.size, id, r.Model, c.want, strings.Join(n.attempts(), " "))
			}
		}
	}
}

// warmUp proves each model with n successes of typ (through allow-lists),
// past MinSamples so that none is explored, and waits until the decisions'
// table is rebuilt from a snapshot holding them all.
func (e *env) warmUp(typ string, models []string, n int) {
	e.t.Helper()
	for i := range n {
		for _, m := range models {
			e.submit(protocol.Task{ID: fmt.Sprintf("w-%s-%d", m, i), Type: typ, Models: []string{m}})
		}
	}
	for i := range n {
		for _, m := range models {
			if r := e.result(fmt.Sprintf("w-%s-%d", m, i)); r.Status != protocol.StatusSucceeded || r.Model != m {
				e.t.Fatalf("warm-up: %+v", r)
			}
		}
	}
	var seen protocol.StatsReport
	e.waitFor("a snapshot with the warm-up", func() bool {
		seen = e.stats()
		ok := 0
		for _, m := range seen.Models {
			if m.Successes >= int64(n) {
				ok++
			}
		}
		return ok == len(models)
	})
	e.waitFor("the next snapshot", func() bool { return e.stats().SnapshotAt.After(seen.SnapshotAt) })
}

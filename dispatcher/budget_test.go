package dispatcher_test

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/mlsched/mlsched/dispatcher"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/redistest"
)

// Three replicas share one tenant's cost budget through Redis: what they
// dispatch in a period costs at most the budget (the charge and the check
// are one script), the tasks over it are rejected with budget_exceeded and
// a retry_after within the period, every task has exactly one result, and
// a tenant without a budget is not limited. The cost is the model's as its
// node declares it: per task plus per unit of the task's size.
func TestBudgetAcrossThreeReplicas(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t)
	const limit = 20.0
	withBudget := func(c *dispatcher.Config) {
		c.RedisURL = "redis://" + rs.Addr
		c.TenantBudgets = map[string]string{"a": strconv.FormatFloat(limit, 'g', -1, 64) + "/minute"}
	}
	e := newEnv(t, withBudget)
	for i := range 2 {
		cfg := testConfig(e.ns.URL)
		withBudget(&cfg)
		cfg.Name = fmt.Sprintf("replica%d", i+2)
		runDispatcher(t, cfg)
	}
	e.costs = map[string][2]float64{"m": {0.5, 0.01}} // 0.5 + 0.01 x 50 = 1 per task
	e.startNode("n1", []string{"b"}, map[string]behavior{"m": succeed})
	const n = 60
	startMinute := time.Now().Unix() / 60
	for i := range n {
		e.submit(protocol.Task{ID: fmt.Sprintf("ba%d", i), Type: "b", Tenant: "a", Size: 50})
		if i%6 == 0 {
			e.submit(protocol.Task{ID: fmt.Sprintf("bb%d", i), Type: "b", Tenant: "other", Size: 50})
		}
	}
	succeeded, refused := 0, 0
	for i := range n {
		res := e.result(fmt.Sprintf("ba%d", i))
		switch {
		case res.Status == protocol.StatusSucceeded:
			succeeded++
		case res.Status == protocol.StatusRejected && res.ErrorCode == protocol.CodeBudgetExceeded &&
			res.RetryAfterMs > 0 && res.RetryAfterMs <= 60_000:
			refused++
		default:
			t.Fatalf("ba%d: %+v, want succeeded or rejected with budget_exceeded and a retry_after within the minute", i, res)
		}
		if i%6 == 0 {
			if res := e.result(fmt.Sprintf("bb%d", i)); res.Status != protocol.StatusSucceeded {
				t.Fatalf("a tenant without a budget: %+v", res)
			}
		}
	}
	minutes := int(time.Now().Unix()/60-startMinute) + 1 // a minute boundary crossed renews the budget once
	if float64(succeeded) > limit*float64(minutes) || succeeded < int(limit) {
		t.Fatalf("%d of tenant a's tasks (cost 1 each) ran over %d period(s) of a budget of %g", succeeded, minutes, limit)
	}
	if refused == 0 {
		t.Fatal("none refused")
	}
	for i := range n {
		if c := e.resultCount(fmt.Sprintf("ba%d", i)); c != 1 {
			t.Fatalf("ba%d has %d results, want 1", i, c)
		}
	}
}

// A budget that degrades sends its tasks on past the limit (charged, and
// counted as over_budget) instead of refusing them, to the cheapest model
// that clears the type's bar, whatever the type's own policy (reliability
// here, which ranks the two proven models alike).
func TestBudgetDegradeGoesToTheCheapest(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *dispatcher.Config) {
		c.TypeBudgets = map[string]string{"d": "3/hour/degrade"}
		c.MinSuccess = 0.5
	})
	e.costs = map[string][2]float64{"dear": {10, 0}, "cheap": {1, 0}}
	n := e.startNode("n1", []string{"d"}, map[string]behavior{"dear": succeed, "cheap": succeed})
	// warm-up: both proven (past MinSamples)
	e.warmUp("d", []string{"dear", "cheap"}, 25)
	for i := range 10 {
		id := fmt.Sprintf("d%d", i)
		e.submit(protocol.Task{ID: id, Type: "d"})
		if r := e.result(id); r.Status != protocol.StatusSucceeded || r.Model != "cheap" {
			t.Errorf("%s past the budget: %s on %s, want succeeded on cheap (attempts: %v)", id, r.Status, r.Model, n.attempts())
		}
	}
	if got := e.d.Counters().OverBudget.Load(); got < 10 {
		t.Fatalf("over_budget %d, want every task past the limit counted", got)
	}
}

package clusterview_test

import (
	"testing"
	"time"

	"github.com/mlsched/mlsched/dispatcher/clusterview"
	"github.com/mlsched/mlsched/shared/protocol"
)

// Models and breakers come from the freshest snapshot (the store is shared),
// counters are summed, nodes united with their latest heartbeat, and
// degraded mode stays per replica.
func TestMerge(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	reports := []protocol.StatsReport{
		{Dispatcher: "b", Store: "redis", SnapshotAt: t0, Window: time.Minute,
			Models:       []protocol.ModelReport{{Name: "old", Dispatched: 1}},
			QueueTargets: []protocol.QueueTargetReport{{Model: "old", Node: "n1", TargetMs: 999, Mode: "auto"}},
			Counters:     map[string]int64{"results": 10, "late": 1},
			Nodes:        []protocol.Heartbeat{{Node: "n1", Capacity: 4, InFlight: 1, SentAt: t0}},
			Backlog:      map[string]int64{"ocr": 3}},
		{Dispatcher: "a", Store: "redis", SnapshotAt: t0.Add(time.Second), Window: time.Minute, Degraded: true, DegradedReason: "redis down",
			Models:       []protocol.ModelReport{{Name: "m2", Dispatched: 5, Breaker: "open"}, {Name: "m1", Dispatched: 7}},
			QueueTargets: []protocol.QueueTargetReport{{Model: "m1", Node: "n1", ServiceMs: 50, TargetMs: 150, Mode: "auto"}},
			Counters:     map[string]int64{"results": 5},
			Nodes: []protocol.Heartbeat{{Node: "n1", Capacity: 4, InFlight: 4, SentAt: t0.Add(time.Second),
				Models: []protocol.ModelInfo{{Name: "m2"}, {Name: "m1"}}}, {Node: "n2", Draining: true}}},
	}
	v := clusterview.Merge(reports, t0)
	if len(v.Replicas) != 2 || v.Replicas[0].Name != "a" || v.Replicas[1].Name != "b" {
		t.Fatalf("replicas %+v", v.Replicas)
	}
	if len(v.Models) != 2 || v.Models[0].Name != "m1" || v.Models[1].Breaker != "open" {
		t.Fatalf("models %+v, want the freshest snapshot's, sorted", v.Models)
	}
	if len(v.QueueTargets) != 1 || v.QueueTargets[0].Model != "m1" || v.QueueTargets[0].TargetMs != 150 {
		t.Fatalf("queue targets %+v, want the freshest snapshot's", v.QueueTargets)
	}
	if v.Counters["results"] != 15 || v.Counters["late"] != 1 {
		t.Fatalf("counters %v", v.Counters)
	}
	if len(v.Nodes) != 2 || v.Nodes[0].InFlight != 4 || v.Nodes[0].Load != 1 || v.Nodes[0].Models[0] != "m1" || !v.Nodes[1].Draining {
		t.Fatalf("nodes %+v", v.Nodes)
	}
	if v.BacklogTotal() != 3 || v.Window != time.Minute {
		t.Fatalf("backlog %v window %s", v.Backlog, v.Window)
	}
	if d := v.Degraded(); len(d) != 1 || d[0].Name != "a" || d[0].DegradedReason != "redis down" {
		t.Fatalf("degraded %+v", d)
	}
	if empty := clusterview.Merge(nil, t0); len(empty.Models) != 0 || empty.Counters == nil || empty.Backlog == nil {
		t.Fatalf("empty view %+v", empty)
	}
}

// A family's rollout comes from the replica whose reading is newest: a
// later step, or more outcomes in the same one.
func TestMergeRollouts(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ro := func(family string, since time.Time, n int64) protocol.RolloutReport {
		return protocol.RolloutReport{Family: family, Model: family + "@v2", StepSince: since, New: protocol.RolloutCounts{Successes: n}}
	}
	v := clusterview.Merge([]protocol.StatsReport{
		{Dispatcher: "a", Rollouts: []protocol.RolloutReport{ro("ocr", t0, 50), ro("fraud", t0, 10)}},
		{Dispatcher: "b", Rollouts: []protocol.RolloutReport{ro("fraud", t0.Add(time.Minute), 1), ro("ocr", t0, 40)}},
	}, t0)
	if len(v.Rollouts) != 2 || v.Rollouts[0].Family != "fraud" || v.Rollouts[0].New.Successes != 1 || v.Rollouts[1].New.Successes != 50 {
		t.Fatalf("rollouts %+v", v.Rollouts)
	}
}

// Flow control: held tasks are summed by band and tenant across replicas,
// bounded to the tenants holding most (the rest "other"); ended tasks
// summed by band and code.
func TestMergeFlowControl(t *testing.T) {
	var a, b protocol.StatsReport
	a.HeldBy = []protocol.HeldCount{{Band: "high", Tenant: "fraud", Held: 2}, {Band: "normal", Tenant: "bulk", Held: 5}}
	b.HeldBy = []protocol.HeldCount{{Band: "normal", Tenant: "bulk", Held: 1}, {Band: "low", Tenant: "other", Held: 4}}
	a.EndedBy = []protocol.EndedCount{{Band: "low", Code: protocol.CodeShed, Tasks: 7}}
	b.EndedBy = []protocol.EndedCount{{Band: "low", Code: protocol.CodeShed, Tasks: 3}, {Band: "normal", Code: protocol.CodeExpired, Tasks: 1}}
	for i := range clusterview.HeldTenants + 5 { // more tenants than the bound
		b.HeldBy = append(b.HeldBy, protocol.HeldCount{Band: "low", Tenant: "t" + string(rune('a'+i)), Held: 1})
	}
	v := clusterview.Merge([]protocol.StatsReport{a, b}, time.Now())
	got := map[string]int{}
	for _, h := range v.HeldBy {
		got[h.Band+"/"+h.Tenant] += h.Held
	}
	if got["high/fraud"] != 2 || got["normal/bulk"] != 6 {
		t.Errorf("held %v", got)
	}
	tenants := map[string]bool{}
	total := 0
	for _, h := range v.HeldBy {
		tenants[h.Tenant] = true
		total += h.Held
	}
	if len(tenants) > clusterview.HeldTenants+1 || !tenants["other"] || total != 2+6+4+clusterview.HeldTenants+5 {
		t.Errorf("%d tenants named (bound %d + other), %d held: %v", len(tenants), clusterview.HeldTenants, total, v.HeldBy)
	}
	if v.HeldBy[0].Band != "high" || v.HeldBy[len(v.HeldBy)-1].Band != "low" {
		t.Errorf("not ordered high, normal, low: %v", v.HeldBy)
	}
	if len(v.EndedBy) != 2 || v.EndedBy[0] != (protocol.EndedCount{Band: "normal", Code: protocol.CodeExpired, Tasks: 1}) ||
		v.EndedBy[1] != (protocol.EndedCount{Band: "low", Code: protocol.CodeShed, Tasks: 10}) {
		t.Errorf("ended %v", v.EndedBy)
	}
}

// A budget's spending is shared: the view keeps the highest reading of its
// current period, not a sum; costs are per replica and add up.
func TestMergeCosts(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	b := func(spent float64, ends time.Time) []protocol.BudgetReport {
		return []protocol.BudgetReport{{Scope: "tenant", Name: "acme", Limit: 100, Spent: spent, Ends: ends}}
	}
	v := clusterview.Merge([]protocol.StatsReport{
		{Dispatcher: "a", Budgets: b(40, t0), Cost: &protocol.CostReport{ByType: map[string]float64{"ocr": 3}, ByModel: map[string]float64{"big": 3}}},
		{Dispatcher: "b", Budgets: b(55, t0), Cost: &protocol.CostReport{ByType: map[string]float64{"ocr": 2}, ByTenant: map[string]float64{"acme": 2}}},
		{Dispatcher: "c", Budgets: b(90, t0.Add(-time.Hour))}, // a replica that read the last period
	}, t0)
	if len(v.Budgets) != 1 || v.Budgets[0].Spent != 55 {
		t.Fatalf("budgets %+v, want acme at 55 (the highest reading of the current period)", v.Budgets)
	}
	if v.Cost == nil || v.Cost.ByType["ocr"] != 5 || v.Cost.ByModel["big"] != 3 || v.Cost.ByTenant["acme"] != 2 {
		t.Fatalf("cost %+v, want the replicas' sums", v.Cost)
	}
	if v := clusterview.Merge([]protocol.StatsReport{{Dispatcher: "a"}}, t0); v.Cost != nil || v.Budgets != nil {
		t.Fatalf("no costs declared: %+v %+v", v.Cost, v.Budgets)
	}
}

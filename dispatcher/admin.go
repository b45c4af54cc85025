package dispatcher

import (
	"context"
	"encoding/json"
	"sort"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mlsched/mlsched/dispatcher/internal/finish"
	"github.com/mlsched/mlsched/shared/protocol"
)

// serveAdmin answers `mlsched stats` with this replica's report. Every
// replica answers; the CLI takes the first answer.
func serveAdmin(nc *nats.Conn, report func() *protocol.StatsReport) (*nats.Subscription, error) {
	return nc.Subscribe(protocol.SubjectAdminStats, func(m *nats.Msg) {
		data, err := json.Marshal(report())
		if err == nil {
			_ = m.Respond(data)
		}
	})
}

// report builds this replica's view of the cluster.
func (p *parts) report(cfg Config, c *Counters) *protocol.StatsReport {
	r := &protocol.StatsReport{Dispatcher: cfg.Name, Store: p.kind, Window: cfg.StatsWindow,
		Policies: map[string]string{"*": cfg.Policy}, Backlog: p.backlog.get()}
	for k, v := range cfg.PolicyConfig().PerType {
		r.Policies[k] = v
	}
	r.Counters = map[string]int64{
		"dispatched": c.Dispatched.Load(), "redispatched": c.Redispatched.Load(), "results": c.Results.Load(),
		"rejected": c.Rejected.Load(), "dead_lettered": c.DeadLettered.Load(), "suppressed": c.Suppressed.Load(),
		"late": c.Late.Load(), "lost": c.Lost.Load(), "panic": c.Panic.Load(), "cancelled": c.Cancelled.Load(),
		"saturated": c.Saturated.Load(),
		"forged":    c.Forged.Load(), "unserved_refused": c.UnservedRefused.Load(),
		"reports": c.Reports.Load(), "reports_deferred": c.ReportsDeferred.Load(),
		"succeeded": c.Succeeded.Load(), "failed": c.Failed.Load(), "shed": c.Shed.Load(),
		"expired": c.Expired.Load(), "shed_sheddable": c.ShedFlow.Load(), "over_quota": c.OverQuota.Load(),
		"over_budget": c.OverBudget.Load(),
		"inversions":  c.Inversions.Load(), "parked": c.Parked.Load(), "shed_inversions": c.ShedInversions.Load(),
	}
	r.Types = c.Types.Snapshot()
	if p.adm.Budgets != nil {
		_ = p.adm.Budgets.Refresh(context.Background()) // down: this replica's last figures
	}
	for _, b := range p.adm.Budgets.Statuses() {
		r.Budgets = append(r.Budgets, protocol.BudgetReport{Scope: string(b.Scope), Name: b.Name, Limit: b.Limit,
			Period: b.Period, Action: string(b.Action), Spent: b.Spent, Ends: b.Ends})
	}
	if reason := p.snaps.degraded.Load(); reason != nil {
		r.Degraded, r.DegradedReason = true, *reason
	}
	bs := p.batch.Stats()
	r.Buffered, r.Dropped = bs.Buffered, bs.Dropped
	if bs.Degraded && !r.Degraded {
		r.Degraded, r.DegradedReason = true, "statistics updates are buffered: "+bs.LastError
	}
	r.Nodes = p.reg.Live()
	r.Counters["bad_heartbeats"] = p.reg.Refused()
	for _, v := range p.rolls.list() {
		ro := v.Rollout
		ev := ro.Reading()
		r.Rollouts = append(r.Rollouts, protocol.RolloutReport{Family: v.Family, Model: ro.Model, State: string(ro.State),
			Step: ro.Step, Steps: ro.Steps, Share: ro.Share(), Split: ro.Split > 0, StepSince: ro.StepSince,
			New:       protocol.RolloutCounts(ro.New),
			Incumbent: protocol.RolloutCounts(ro.Incumbent), LLR: ev.LLR, Verdict: ev.Verdict})
		if n := len(ro.History); n > 0 {
			last := &r.Rollouts[len(r.Rollouts)-1]
			e := ro.History[n-1]
			last.LastAt, last.LastTo, last.LastReason = e.At, string(e.To), e.Reason
		}
	}
	r.Held = p.adm.Held()
	r.HeldBy = p.adm.HeldBy(20)
	r.EndedBy = c.endedBy()
	r.QuotaDegraded = p.adm.Quota.Degraded()
	r.Unserved = p.adm.Unserved()
	for _, pt := range p.adm.Engine.QueueTargets(p.snaps.table.Load()) {
		r.QueueTargets = append(r.QueueTargets, protocol.QueueTargetReport{Model: pt.Model, Node: pt.Node,
			ServiceMs: float64(pt.Service) / float64(time.Millisecond), Samples: pt.Samples,
			TargetMs: float64(pt.Target) / float64(time.Millisecond), Mode: pt.Mode})
	}
	snap := p.snaps.snap.Load()
	if snap == nil {
		return r
	}
	r.SnapshotAt = snap.Taken
	var total int64
	for _, m := range snap.Models {
		total += m.Dispatched
	}
	for name, m := range snap.Models {
		mr := protocol.ModelReport{Name: name, Dispatched: m.Dispatched, Successes: m.Successes,
			ModelErrors: m.ModelErrors, Timeouts: m.Timeouts, TaskErrors: m.TaskErrors, Expired: m.Expired,
			Late: m.Late, InFlight: m.InFlight, Breaker: m.Breaker.State.String(),
			P50Ms: ms(m.Latency.Quantile(0.5)), P95Ms: ms(m.Latency.Quantile(0.95))}
		if j := m.Judged(); j > 0 {
			mr.SuccessRate = float64(m.Successes) / float64(j)
		}
		if total > 0 {
			mr.TrafficShare = float64(m.Dispatched) / float64(total)
		}
		r.Models = append(r.Models, mr)
	}
	sort.Slice(r.Models, func(i, j int) bool { return r.Models[i].Name < r.Models[j].Name })
	return r
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// endedBy lists the non-zero Ended counters.
func (c *Counters) endedBy() []protocol.EndedCount {
	var out []protocol.EndedCount
	for b := range c.Ended {
		for k := range c.Ended[b] {
			if n := c.Ended[b][k].Load(); n > 0 {
				out = append(out, protocol.EndedCount{Band: finish.FlowBands[b], Code: finish.FlowCodes[k], Tasks: n})
			}
		}
	}
	return out
}

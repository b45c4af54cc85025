package dispatcher

import (
	"context"
	"maps"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mlsched/mlsched/dispatcher/internal/finish"
	"github.com/mlsched/mlsched/dispatcher/rollout"
	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/shared/opshttp"
	"github.com/mlsched/mlsched/shared/protocol"
)

// Prometheus metrics of a replica. The per-task instruments are resolved once
// per label value (opshttp.Children) and then cost an atomic add; gauges
// derived from the statistics snapshot, the node registry and the backlog
// are computed when scraped, off the dispatch path.
type metrics struct {
	reg *prometheus.Registry

	received *opshttp.Children[string, prometheus.Counter]     // type
	results  *opshttp.Children[opshttp.L2, prometheus.Counter] // type, status
	attempts *opshttp.Children[opshttp.L3, prometheus.Counter] // model, node, outcome
	decision prometheus.Histogram
	taskDur  *opshttp.Children[string, prometheus.Observer] // type
	dead     *opshttp.Children[string, prometheus.Counter]  // kind
	// admitted and wait are flow control's, by priority band (high,
	// normal, low: bounded): tasks sent on (first dispatch stored), and
	// their wait from submission to that dispatch.
	admitted *opshttp.Children[string, prometheus.Counter]  // band
	wait     *opshttp.Children[string, prometheus.Observer] // band
	// cost is the declared cost of the attempts dispatched, by type and
	// model, and tenantCost by tenant (the first maxCostTenants tenants
	// seen, the rest as "other": tenants are the producers' to name).
	cost         *opshttp.Children[opshttp.L2, prometheus.Counter] // type, model
	tenantCost   *opshttp.Children[string, prometheus.Counter]     // tenant
	costTenants  sync.Map                                          // tenant: struct{}
	nCostTenants atomic.Int64
	costMu       sync.Mutex
	costs        protocol.CostReport // totals since start (under costMu)
	// pipeSteps counts pipeline steps ended, by step type and status
	// (succeeded, failed): pipeline.go.
	pipeSteps *opshttp.Children[opshttp.L2, prometheus.Counter]
}

// maxCostTenants bounds the tenant label of mlsched_tenant_cost_total.
const maxCostTenants = 200

// Received counts a task received, by type (intake.Metrics).
func (m *metrics) Received(typ string) { m.received.Get(typ).Inc() }

// Decision observes one decision's duration (admission.Metrics).
func (m *metrics) Decision(seconds float64) { m.decision.Observe(seconds) }

// Admitted counts a first attempt of the band dispatched (flow control).
func (m *metrics) Admitted(band string) { m.admitted.Get(band).Inc() }

// Waited observes a first attempt's wait from submission to its dispatch.
func (m *metrics) Waited(band string, seconds float64) { m.wait.Get(band).Observe(seconds) }

// Spent counts an attempt's declared cost, in the metrics and in the
// totals `mlsched stats` shows.
func (m *metrics) Spent(typ, tenant, model string, cost float64) {
	m.cost.Get(opshttp.L2{A: typ, B: model}).Add(cost)
	if _, ok := m.costTenants.Load(tenant); !ok {
		if m.nCostTenants.Add(1) > maxCostTenants {
			m.nCostTenants.Add(-1)
			tenant = "other"
		} else if _, dup := m.costTenants.LoadOrStore(tenant, struct{}{}); dup {
			m.nCostTenants.Add(-1)
		}
	}
	m.tenantCost.Get(tenant).Add(cost)
	m.costMu.Lock()
	if m.costs.ByType == nil {
		m.costs = protocol.CostReport{ByType: map[string]float64{}, ByModel: map[string]float64{}, ByTenant: map[string]float64{}}
	}
	m.costs.ByType[typ] += cost
	m.costs.ByModel[model] += cost
	m.costs.ByTenant[tenant] += cost
	m.costMu.Unlock()
}

// costReport copies the totals (nil before any priced attempt).
func (m *metrics) costReport() *protocol.CostReport {
	m.costMu.Lock()
	defer m.costMu.Unlock()
	if m.costs.ByType == nil {
		return nil
	}
	return &protocol.CostReport{ByType: maps.Clone(m.costs.ByType), ByModel: maps.Clone(m.costs.ByModel),
		ByTenant: maps.Clone(m.costs.ByTenant)}
}

// Buckets of submit-to-result and execution durations: 5ms to 2 minutes.
var durationBuckets = prometheus.ExponentialBuckets(0.005, 2.5, 12)

func newMetrics(d *Dispatcher) *metrics {
	reg := opshttp.NewRegistry()
	received := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mlsched_tasks_received_total",
		Help: "Task messages consumed from MLSCHED_TASKS (first delivery), by type; \"invalid\" for messages that are not a task."}, []string{"type"})
	results := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mlsched_results_total",
		Help: "Final results stored, by type and status (succeeded, failed, rejected)."}, []string{"type", "status"})
	attempts := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mlsched_attempts_total",
		Help: "Attempt outcomes reported (first delivery), by model, node and outcome (success, model_error, timeout, task_error, expired, lost)."},
		[]string{"model", "node", "outcome"})
	decision := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "mlsched_decision_duration_seconds",
		Help:    "Time the policy engine took to choose a model and a node for one attempt.",
		Buckets: prometheus.ExponentialBuckets(1e-6, 4, 10)})
	taskDur := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "mlsched_task_duration_seconds",
		Help: "Time from a task's submission (its MLSCHED_TASKS timestamp) to its stored result, by type.", Buckets: durationBuckets},
		[]string{"type"})
	dead := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mlsched_dead_letters_total",
		Help: "Entries written to MLSCHED_DLQ, by kind (invalid, exhausted, outcome)."}, []string{"kind"})
	admitted := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mlsched_flow_admitted_total",
		Help: "Tasks sent on to a node (first attempt's dispatch stored), by priority band (high: priority > 0, normal: 0, low: < 0, sheddable)."},
		[]string{"band"})
	wait := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "mlsched_flow_wait_seconds",
		Help:    "Time from a task's submission (its MLSCHED_TASKS timestamp) to its first dispatch, queueing and holding included, by priority band.",
		Buckets: durationBuckets}, []string{"band"})
	cost := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mlsched_cost_total",
		Help: "Declared cost (the models file's cost, per task and per unit of the task's size) of the attempts dispatched, by type and model; absent for models that declare none."},
		[]string{"type", "model"})
	tenantCost := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mlsched_tenant_cost_total",
		Help: "Declared cost of the attempts dispatched, by tenant (the first 200 tenants seen by the replica, the rest as other)."},
		[]string{"tenant"})
	pipeSteps := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mlsched_pipeline_steps_total",
		Help: "Pipeline steps ended, by the step's task type and status (succeeded: the pipeline went on or ended with it; failed: it failed the pipeline)."},
		[]string{"type", "status"})
	reg.MustRegister(pipeSteps, received, results, attempts, decision, taskDur, dead, admitted, wait, cost, tenantCost, &snapshotCollector{d: d}, &streamsCollector{d: d})
	m := &metrics{reg: reg, received: opshttp.Counter1(received), results: opshttp.Counter2(results),
		attempts: opshttp.Counter3(attempts), decision: decision, taskDur: opshttp.Observer1(taskDur),
		dead: opshttp.Counter1(dead), admitted: opshttp.Counter1(admitted), wait: opshttp.Observer1(wait),
		cost: opshttp.Counter2(cost), tenantCost: opshttp.Counter1(tenantCost), pipeSteps: opshttp.Counter2(pipeSteps)}
	for _, k := range []string{"invalid", "exhausted", "outcome"} {
		m.dead.Get(k) // present at 0 from the start, so that rate() and alerts see the first one
	}
	for _, b := range []string{"high", "normal", "low"} {
		m.admitted.Get(b)
		m.wait.Get(b)
	}
	return m
}

// snapshotCollector reports what the replica derives from its statistics
// snapshot, node registry, backlog sampler and counters, when scraped.
type snapshotCollector struct{ d *Dispatcher }

var (
	descSuccess = prometheus.NewDesc("mlsched_model_success_ratio",
		"Share of judged outcomes (successes, model errors, timeouts) that succeeded in the statistics window, by model; absent before the first judged outcome.",
		[]string{"model"}, nil)
	descBreaker = prometheus.NewDesc("mlsched_breaker_open",
		"1 while the model's circuit breaker is open (0 closed or half-open: probing).", []string{"model"}, nil)
	descModelInflight = prometheus.NewDesc("mlsched_model_inflight",
		"Attempts dispatched to the model and not yet finished (from the shared statistics).", []string{"model"}, nil)
	descNodeInflight = prometheus.NewDesc("mlsched_node_inflight",
		"Tasks running on the node, as its last heartbeat announced.", []string{"node"}, nil)
	descNodeCapacity = prometheus.NewDesc("mlsched_node_capacity",
		"Tasks the node runs at once, as its last heartbeat announced.", []string{"node"}, nil)
	descNodes = prometheus.NewDesc("mlsched_nodes",
		"Live worker nodes this replica routes to.", nil, nil)
	descBacklog = prometheus.NewDesc("mlsched_backlog_tasks",
		"Tasks waiting in MLSCHED_TASKS (not yet dispatched), by type, sampled every few seconds.", []string{"type"}, nil)
	descDegraded = prometheus.NewDesc("mlsched_stats_degraded",
		"1 while the replica cannot reach the statistics store and decides on its last snapshot.", nil, nil)
	descEvents = prometheus.NewDesc("mlsched_dispatcher_events_total",
		"Replica events by kind: dispatched, redispatched, suppressed (a second result refused), late (outcome of a superseded attempt), lost (attempt unanswered at its deadline), panic (decision with every breaker open), cancelled (tasks an operator cancelled), saturated (task held back: every candidate's queue too long for its deadline), store_reset (the Redis statistics store was found reset, restarted empty or failed over, and re-seeded from this replica's snapshot); flow control: expired (deadline_ms passed before the task started), shed_sheddable (a negative-priority task shed, code shed), over_quota (a task found over its tenant's rate quota), inversions (a lower-priority task dispatched while a higher one of its candidate set was held: must stay 0).",
		[]string{"event"}, nil)
	descQuotaDegraded = prometheus.NewDesc("mlsched_quota_degraded",
		"1 while Redis does not answer the tenants' rate quotas and this replica enforces its share, the quota divided by the live replicas it last saw.", nil, nil)
	descBudgetSpent = prometheus.NewDesc("mlsched_budget_spent",
		"Cost spent in the current period of each budget (MLSCHED_TENANT_BUDGETS, MLSCHED_TYPE_BUDGETS), by scope (tenant, type) and name, as read from Redis when scraped (every replica reports the same: max, not sum).",
		[]string{"scope", "name"}, nil)
	descBudgetLimit = prometheus.NewDesc("mlsched_budget_limit",
		"Each budget's limit per period, by scope (tenant, type) and name.", []string{"scope", "name"}, nil)
	descFlowEnded = prometheus.NewDesc("mlsched_flow_ended_total",
		"Tasks this replica ended without starting them, by priority band (high, normal, low) and code (shed, expired, quota_exceeded).",
		[]string{"band", "code"}, nil)
	descHeldBand = prometheus.NewDesc("mlsched_held_tasks",
		"Tasks this replica holds, by priority band (high, normal, low) and tenant (the 20 holding most, the rest as other).", []string{"band", "tenant"}, nil)
	descNodeOutage = prometheus.NewDesc("mlsched_node_outage",
		"An outage of the nodes this replica sees, by cause: registry_silent (1 while no node has been heard from for half the node TTL although some are known: the bucket or its watch failing, not deaths) and types_without_nodes (the task types that had a live node within the no-node wait plus the node TTL and have none now). Their tasks wait for nodes instead of being rejected.",
		[]string{"cause"}, nil)
	descSnapshotAge = prometheus.NewDesc("mlsched_stats_snapshot_age_seconds",
		"Age of the statistics snapshot decisions are made on.", nil, nil)
	descRolloutShare = prometheus.NewDesc("mlsched_rollout_share",
		"The share of its family's tasks a rollout's new version may take now (0 rolled back or aborted, 1 promoted), by family and version.",
		[]string{"family", "model"}, nil)
	descRolloutState = prometheus.NewDesc("mlsched_rollout_state",
		"1 for a family's rollout's current state (running, paused, promoted, rolled_back, aborted), by family and version.",
		[]string{"family", "model", "state"}, nil)
	descRolloutStep = prometheus.NewDesc("mlsched_rollout_step_seconds",
		"How long the rollout has been at its current step, by family and version (for a stalled rollout).",
		[]string{"family", "model", "state"}, nil)
	descRolloutTasks = prometheus.NewDesc("mlsched_rollout_step_tasks",
		"First-attempt outcomes in the rollout's current step, by family, side (new, incumbent) and outcome (success, failure).",
		[]string{"family", "side", "outcome"}, nil)
	descRolloutTransitions = prometheus.NewDesc("mlsched_rollout_transitions_total",
		"Rollout transitions this replica saw in the bucket since it started, by the state they led to (every replica sees every transition: take max, not sum).",
		[]string{"to"}, nil)
)

func (c *snapshotCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descSuccess, descBreaker, descModelInflight, descNodeInflight, descNodeCapacity,
		descNodes, descBacklog, descDegraded, descEvents, descSnapshotAge, descQuotaDegraded, descBudgetSpent, descBudgetLimit, descHeldBand, descFlowEnded, descNodeOutage,
		descRolloutShare, descRolloutState, descRolloutStep, descRolloutTasks, descRolloutTransitions} {
		ch <- d
	}
}

func (c *snapshotCollector) Collect(ch chan<- prometheus.Metric) {
	d := c.d
	gauge := func(desc *prometheus.Desc, v float64, labels ...string) {
		for i := range labels {
			labels[i] = opshttp.LabelValue(labels[i])
		}
		ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, v, labels...)
	}
	counter := func(desc *prometheus.Desc, v *atomic.Int64, label string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, float64(v.Load()), label)
	}
	cs := &d.counters
	counter(descEvents, &cs.Dispatched, "dispatched")
	counter(descEvents, &cs.Redispatched, "redispatched")
	counter(descEvents, &cs.Suppressed, "suppressed")
	counter(descEvents, &cs.Late, "late")
	counter(descEvents, &cs.Lost, "lost")
	counter(descEvents, &cs.Panic, "panic")
	counter(descEvents, &cs.Cancelled, "cancelled")
	counter(descEvents, &cs.Saturated, "saturated")
	counter(descEvents, &cs.StoreResets, "store_reset")
	counter(descEvents, &cs.Expired, "expired")
	counter(descEvents, &cs.ShedFlow, "shed_sheddable")
	counter(descEvents, &cs.OverQuota, "over_quota")
	counter(descEvents, &cs.OverBudget, "over_budget")
	counter(descEvents, &cs.Inversions, "inversions")
	counter(descEvents, &cs.ShedInversions, "shed_inversions")
	counter(descEvents, &cs.Parked, "parked")
	for b := range cs.Ended {
		for k := range cs.Ended[b] {
			ch <- prometheus.MustNewConstMetric(descFlowEnded, prometheus.CounterValue, float64(cs.Ended[b][k].Load()), finish.FlowBands[b], string(finish.FlowCodes[k]))
		}
	}
	p := d.parts.Load()
	if !d.live.Load() || p == nil {
		return
	}
	degraded := 0.0
	if p.degradedReason() != "" {
		degraded = 1
	}
	gauge(descDegraded, degraded)
	quotaDegraded := 0.0
	if p.adm.Quota.Degraded() != "" {
		quotaDegraded = 1
	}
	gauge(descQuotaDegraded, quotaDegraded)
	if p.adm.Budgets != nil {
		_ = p.adm.Budgets.Refresh(context.Background()) // down: this replica's last figures
	}
	for _, b := range p.adm.Budgets.Statuses() {
		gauge(descBudgetSpent, b.Spent, string(b.Scope), b.Name)
		gauge(descBudgetLimit, b.Limit, string(b.Scope), b.Name)
	}
	for _, w := range p.adm.HeldBy(20) {
		gauge(descHeldBand, float64(w.Held), w.Band, w.Tenant)
	}
	if snap := p.snaps.snap.Load(); snap != nil {
		gauge(descSnapshotAge, max(0, time.Since(snap.Taken).Seconds()))
		for name, m := range snap.Models {
			if j := m.Judged(); j > 0 {
				gauge(descSuccess, float64(m.Successes)/float64(j), name)
			}
			b := 0.0
			if m.Breaker.State == stats.BreakerOpen {
				b = 1
			}
			gauge(descBreaker, b, name)
			gauge(descModelInflight, float64(max(0, m.InFlight)), name)
		}
	}
	collectRollouts(p.rolls, gauge, ch)
	silent := 0.0
	if p.reg.Silent() {
		silent = 1
	}
	gauge(descNodeOutage, silent, "registry_silent")
	_, gone := p.adm.Outage(time.Now())
	gauge(descNodeOutage, float64(gone), "types_without_nodes")
	nodes := p.reg.Live()
	gauge(descNodes, float64(len(nodes)))
	for _, n := range nodes {
		gauge(descNodeInflight, float64(n.InFlight), n.Node)
		gauge(descNodeCapacity, float64(n.Capacity), n.Node)
	}
	if b := p.backlog.get(); b != nil {
		types := make([]string, 0, len(b))
		for t := range b {
			types = append(types, t)
		}
		sort.Strings(types)
		var other int64
		for i, t := range types {
			if i >= opshttp.DefaultMaxChildren { // junk types published at random must not grow series
				other += b[t]
				continue
			}
			gauge(descBacklog, float64(b[t]), t)
		}
		if len(types) > opshttp.DefaultMaxChildren {
			gauge(descBacklog, float64(other), opshttp.Overflow)
		}
	}
}

// collectRollouts reports the rollouts a replica follows.
func collectRollouts(ro *rollouts, gauge func(*prometheus.Desc, float64, ...string), ch chan<- prometheus.Metric) {
	for _, st := range []rollout.State{rollout.Running, rollout.Paused, rollout.Promoted, rollout.RolledBack, rollout.Aborted} {
		ch <- prometheus.MustNewConstMetric(descRolloutTransitions, prometheus.CounterValue, float64(ro.transitionCounts()[st]), string(st))
	}
	for _, v := range ro.list() {
		r := v.Rollout
		gauge(descRolloutShare, r.Share(), v.Family, r.Model)
		gauge(descRolloutState, 1, v.Family, r.Model, string(r.State))
		gauge(descRolloutStep, max(0, time.Since(r.StepSince).Seconds()), v.Family, r.Model, string(r.State))
		gauge(descRolloutTasks, float64(r.New.Successes), v.Family, "new", "success")
		gauge(descRolloutTasks, float64(r.New.Failures), v.Family, "new", "failure")
		gauge(descRolloutTasks, float64(r.Incumbent.Successes), v.Family, "incumbent", "success")
		gauge(descRolloutTasks, float64(r.Incumbent.Failures), v.Family, "incumbent", "failure")
	}
}

// Result counts a stored final result and observes the task's duration
// (finish.Metrics).
func (m *metrics) Result(typ string, status protocol.Status, latencyMs float64) {
	m.results.Get(opshttp.L2{A: typ, B: string(status)}).Inc()
	if latencyMs > 0 {
		m.taskDur.Get(typ).Observe(latencyMs / 1000)
	}
}

// PipelineStep counts a pipeline's step that ended (finish.Metrics).
func (m *metrics) PipelineStep(typ string, status protocol.Status) {
	m.pipeSteps.Get(opshttp.L2{A: typ, B: string(status)}).Inc()
}

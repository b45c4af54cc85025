package protocol

import "time"

// SubjectAdminStats is a core-NATS request subject: every dispatcher replica
// answers it with its StatsReport (a JSON body). `mlsched stats` uses it.
const SubjectAdminStats = "mlsched.admin.stats"

// StatsReport is a dispatcher's view of the cluster: the statistics snapshot
// it decides on, its breakers, the live nodes, and whether it is degraded.
type StatsReport struct {
	Dispatcher string `json:"dispatcher"`
	// Policies maps task types to policy names; "*" is the default.
	Policies map[string]string `json:"policies"`
	// Store is "redis" or "memory".
	Store string `json:"store"`
	// Degraded is set while the statistics store cannot be reached: the
	// dispatcher decides on its last snapshot.
	Degraded       bool          `json:"degraded"`
	DegradedReason string        `json:"degraded_reason,omitempty"`
	SnapshotAt     time.Time     `json:"snapshot_at"`
	Window         time.Duration `json:"window_ns"`
	// Buffered and Dropped count statistics updates waiting for, or lost
	// because of, an unreachable store.
	Buffered int64         `json:"buffered"`
	Dropped  int64         `json:"dropped"`
	Models   []ModelReport `json:"models"`
	// Counters are this replica's cumulative counts since it started:
	// dispatched, redispatched, results, rejected, dead_lettered,
	// suppressed (second results refused), late (outcomes of superseded
	// attempts), lost (attempts found unanswered at their deadline), panic
	// (decisions routed in panic mode: every candidate's breaker open),
	// saturated (tasks held back because every candidate's nodes held more
	// work than they could start before the deadline), forged (outcomes
	// refused), unserved_refused (tasks no node served rejected at once
	// because MLSCHED_UNSERVED_MAX tasks were already waiting).
	Counters map[string]int64 `json:"counters"`
	// Held is how many tasks the replica holds back now, for want of
	// capacity.
	Held int `json:"held"`
	// HeldBy breaks Held down by priority band and tenant (the tenants
	// holding most; the rest as "other").
	HeldBy []HeldCount `json:"held_by,omitempty"`
	// EndedBy counts, by priority band and error code (shed, expired,
	// quota_exceeded), the tasks this replica ended without starting them
	// since it started: where flow control sheds.
	EndedBy []EndedCount `json:"ended_by,omitempty"`
	// QuotaDegraded says why the replica enforces the tenants' rate
	// quotas alone, its share of them ("" when Redis answers).
	QuotaDegraded string `json:"quota_degraded,omitempty"`
	// Unserved is how many tasks the replica keeps waiting now for a node
	// to serve their type (at most MLSCHED_UNSERVED_MAX).
	Unserved int         `json:"unserved"`
	Nodes    []Heartbeat `json:"nodes"`
	// Backlog maps task types to the number of tasks waiting in
	// MLSCHED_TASKS (submitted, not yet dispatched). It is absent when the
	// stream could not be read in time.
	Backlog map[string]int64 `json:"backlog,omitempty"`
	// Types counts the final results this replica stored per task type
	// since it started (at most 256 types; the rest under "(other)").
	Types map[string]TypeCounts `json:"types,omitempty"`
	// Rollouts are the model rollouts this replica follows (dispatcher/rollout).
	Rollouts []RolloutReport `json:"rollouts,omitempty"`
	// QueueTargets are the queue targets the replica's decisions apply
	// now, per (model, node) (MLSCHED_QUEUE_TARGET; docs/policies.md, "The
	// queue target").
	QueueTargets []QueueTargetReport `json:"queue_targets,omitempty"`
	// Budgets are the cost budgets (MLSCHED_TENANT_BUDGETS,
	// MLSCHED_TYPE_BUDGETS) and their spending in the current period,
	// shared by every replica.
	Budgets []BudgetReport `json:"budgets,omitempty"`
	// Cost is the declared cost of the attempts this replica dispatched
	// since it started, by type, model and tenant (absent when no model
	// declares a cost).
	Cost *CostReport `json:"cost,omitempty"`
}

// BudgetReport is one cost budget's state.
type BudgetReport struct {
	Scope  string        `json:"scope"` // tenant or type
	Name   string        `json:"name"`
	Limit  float64       `json:"limit"`
	Period time.Duration `json:"period_ns"`
	// Action at the limit: refuse (budget_exceeded) or degrade.
	Action string  `json:"action"`
	Spent  float64 `json:"spent"`
	// Ends is when the current period ends and the budget renews.
	Ends time.Time `json:"ends"`
}

// CostReport sums declared costs.
type CostReport struct {
	ByType   map[string]float64 `json:"by_type,omitempty"`
	ByModel  map[string]float64 `json:"by_model,omitempty"`
	ByTenant map[string]float64 `json:"by_tenant,omitempty"`
}

// QueueTargetReport is one (model, node)'s queue target: a new attempt
// there may wait plus run this long before the pair counts as saturated
// and the replica holds its tasks back instead.
type QueueTargetReport struct {
	Model string `json:"model"`
	Node  string `json:"node"`
	// ServiceMs is the model's mean attempt time on the node over the
	// statistics window, the target's base; Samples the attempts it rests
	// on (0: borrowed from the model's other nodes, or assumed).
	ServiceMs float64 `json:"service_ms"`
	Samples   int64   `json:"samples"`
	// TargetMs is the target (0 when Mode is "off").
	TargetMs float64 `json:"target_ms"`
	// Mode: "auto" (3x the service time), "floor" (auto, raised to its
	// floor while few attempts are measured, or to 20 ms), "fixed"
	// (MLSCHED_QUEUE_TARGET) or "off".
	Mode string `json:"mode"`
}

// RolloutReport is a family's rollout as a replica follows it.
type RolloutReport struct {
	Family string    `json:"family"`
	Model  string    `json:"model"`
	State  string    `json:"state"`
	Step   int       `json:"step"`
	Steps  []float64 `json:"steps"`
	// Share is the new version's share of the family's tasks now (0..1).
	Share     float64   `json:"share"`
	Split     bool      `json:"split,omitempty"`
	StepSince time.Time `json:"step_since"`
	// New and Incumbent are the step's first-attempt outcomes.
	New       RolloutCounts `json:"new"`
	Incumbent RolloutCounts `json:"incumbent"`
	LLR       float64       `json:"llr"`
	Verdict   string        `json:"verdict"`
	// Last is the last transition: when, to what, and why.
	LastAt     time.Time `json:"last_at"`
	LastTo     string    `json:"last_to"`
	LastReason string    `json:"last_reason"`
}

// RolloutCounts are first-attempt outcomes of one side of a rollout.
type RolloutCounts struct {
	Successes int64 `json:"successes"`
	Failures  int64 `json:"failures"`
	Timeouts  int64 `json:"timeouts"`
}

// TypeCounts are final results of one task type, by status.
type TypeCounts struct {
	Succeeded int64 `json:"succeeded"`
	Failed    int64 `json:"failed"`
	Rejected  int64 `json:"rejected"`
	Cancelled int64 `json:"cancelled,omitempty"`
}

// ModelReport is one model's line in a StatsReport.
type ModelReport struct {
	Name         string  `json:"name"`
	Dispatched   int64   `json:"dispatched"`
	Successes    int64   `json:"successes"`
	ModelErrors  int64   `json:"model_errors"`
	Timeouts     int64   `json:"timeouts"`
	TaskErrors   int64   `json:"task_errors"`
	Expired      int64   `json:"expired"`
	Late         int64   `json:"late"`
	SuccessRate  float64 `json:"success_rate"`
	P50Ms        float64 `json:"p50_ms"`
	P95Ms        float64 `json:"p95_ms"`
	InFlight     int64   `json:"in_flight"`
	Breaker      string  `json:"breaker"`
	TrafficShare float64 `json:"traffic_share"`
}

// SubjectAdminCancel is a core-NATS request subject: one dispatcher replica
// (queue group QueueAdminCancel) answers a CancelRequest with a CancelReply.
// `mlsched cancel` uses it.
const (
	SubjectAdminCancel = "mlsched.admin.cancel"
	QueueAdminCancel   = "mlsched-dispatchers"
)

// CancelRequest asks to cancel the task with that id.
type CancelRequest struct {
	ID     string `json:"id"`
	Reason string `json:"reason,omitempty"`
}

// CancelOutcome says what a cancel request did.
type CancelOutcome string

const (
	// CancelDone: the task had no result; it now has a cancelled one.
	CancelDone CancelOutcome = "cancelled"
	// CancelFinished: the task already had a final result (Status says
	// which); nothing changed.
	CancelFinished CancelOutcome = "finished"
	// CancelUnknown: no task with that id is waiting, running or finished.
	CancelUnknown CancelOutcome = "unknown"
	// CancelInvalid: the request was malformed (Error says why).
	CancelInvalid CancelOutcome = "invalid"
)

// CancelReply answers a CancelRequest.
type CancelReply struct {
	ID      string        `json:"id"`
	Outcome CancelOutcome `json:"outcome"`
	// Status is the task's final status: cancelled, or the one it already had.
	Status Status `json:"status,omitempty"`
	// Where lists where the task was found: waiting, dispatched, retrying.
	Where      []string `json:"where,omitempty"`
	Error      string   `json:"error,omitempty"`
	Dispatcher string   `json:"dispatcher"`
}

// EndedCount is how many tasks of one priority band a replica ended with
// one flow-control code (shed, expired, quota_exceeded).
type EndedCount struct {
	Band  string `json:"band"`
	Code  Code   `json:"code"`
	Tasks int64  `json:"tasks"`
}

// HeldCount is how many tasks of one priority band ("high", "normal",
// "low") and tenant a replica holds.
type HeldCount struct {
	Band   string `json:"band"`
	Tenant string `json:"tenant"`
	Held   int    `json:"held"`
}

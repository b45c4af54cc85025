package admission

import (
	"sync/atomic"
	"time"

	"github.com/mlsched/mlsched/dispatcher/internal/policy"
	"github.com/mlsched/mlsched/shared/jsplumb"
	"github.com/mlsched/mlsched/shared/protocol"
)

// Config is the dispatcher configuration admission reads.
type Config struct {
	// TaskTimeout is an attempt's timeout when neither the task nor the
	// model sets one; DeadlineSlack is added to form its deadline.
	TaskTimeout, DeadlineSlack time.Duration
	// MaxAttempts when the task sets none.
	MaxAttempts int
	// AckWait of the dispatcher's consumers: how long a kept message lives
	// between its keep-alives.
	AckWait time.Duration
	// NoNodeWait bounds an attempt's wait for a node that serves it;
	// NodeTTL is a node's heartbeat lifetime (a silent registry is an
	// outage, not an absence).
	NoNodeWait, NodeTTL time.Duration
	// UnservedMax bounds the attempts waiting for a node.
	UnservedMax int
	// QueueTargetOn: the nodes' queues are capped at their queue target,
	// so a held task whose hold time ran out may still be waiting only for
	// the queue target (MLSCHED_QUEUE_TARGET not off).
	QueueTargetOn bool
	// QuotaReject rejects an attempt over its tenant's quota or cap at
	// once instead of holding it.
	QuotaReject bool
}

// Tables gives the decision table the attempts are decided on, rebuilt
// from the statistics, and the models' announced timeouts (ms).
type Tables interface {
	Table() *policy.Table
	Timeouts() *map[string]int64
}

// Sealer seals a dispatch, so that an outcome can prove it answers one.
type Sealer interface {
	Seal(d *protocol.Dispatch) string
}

// Superseded answers whether a task was cancelled.
type Superseded interface {
	Cancelled(task, submission string) bool
}

// Keeper keeps a task in progress (unacknowledged) for as long as any
// attempt of it is alive.
type Keeper interface {
	// Dispatched keeps the task until the attempt's deadline, and returns
	// the message to settle once the dispatch is stored.
	Dispatched(msg jsplumb.Msg, taskAck string, deadline time.Time, rec Record) jsplumb.Msg
	// Keep keeps the task in progress until at least until.
	Keep(msg jsplumb.Msg, taskAck string, until time.Time)
}

// noKeeper acknowledges a task with its dispatch (no keeper: tests).
type noKeeper struct{}

func (noKeeper) Dispatched(msg jsplumb.Msg, _ string, _ time.Time, _ Record) jsplumb.Msg { return msg }
func (noKeeper) Keep(jsplumb.Msg, string, time.Time)                                     {}

// Record is what the keeper records of a dispatched attempt: enough to go
// on from it when the attempt streams are lost.
type Record struct {
	Task        string             `json:"task"`
	Type        string             `json:"type"`
	Submission  string             `json:"submission"`
	Attempt     int                `json:"attempt"`
	MaxAttempts int                `json:"max_attempts"`
	Model       string             `json:"model"`
	Node        string             `json:"node"`
	History     []protocol.Attempt `json:"history,omitempty"` // the attempts before this one
	Dispatched  time.Time          `json:"dispatched"`
}

// Rules are flow control's rules: deadlines by type, tenants' weights,
// rate quotas and concurrency caps.
type Rules interface {
	// Expiry is when the task's deadline passes (zero: none).
	Expiry(t *protocol.Task, submitted time.Time) time.Time
	// Weight is a tenant's share inside a band.
	Weight(tenant string) float64
	// Rate is a tenant's rate quota (tasks/s), Cap its concurrency cap.
	Rate(tenant string) float64
	Cap(tenant string) int
}

// noRules: no deadlines by type, every weight 1, no quotas or caps.
type noRules struct{}

func (noRules) Expiry(t *protocol.Task, submitted time.Time) time.Time {
	if t.DeadlineMs <= 0 || submitted.IsZero() {
		return time.Time{}
	}
	return submitted.Add(time.Duration(t.DeadlineMs) * time.Millisecond)
}
func (noRules) Weight(string) float64 { return 1 }
func (noRules) Rate(string) float64   { return 0 }
func (noRules) Cap(string) int        { return 0 }

// Metrics hears of admission's decisions and dispatches.
type Metrics interface {
	// Decision: one decision took seconds.
	Decision(seconds float64)
	// Admitted: a first attempt of the band was dispatched, after waiting
	// seconds from its submission (Waited).
	Admitted(band string)
	Waited(band string, seconds float64)
	// Spent: an attempt's cost, charged to its tenant.
	Spent(typ, tenant, model string, cost float64)
}

type noMetrics struct{}

func (noMetrics) Decision(float64)                      {}
func (noMetrics) Admitted(string)                       {}
func (noMetrics) Waited(string, float64)                {}
func (noMetrics) Spent(string, string, string, float64) {}

// Tallies are admission's counters (the dispatcher's Counters embed
// them).
type Tallies struct {
	// Dispatched counts first attempts dispatched, Redispatched retries.
	Dispatched, Redispatched atomic.Int64
	// Panic counts decisions made in panic mode: every candidate's breaker
	// was open and the engine routed among all of them anyway.
	Panic atomic.Int64
	// Saturated counts tasks held back because every candidate was
	// saturated (hold.go).
	Saturated atomic.Int64
	// UnservedRefused counts tasks no node served that were rejected at
	// once because MLSCHED_UNSERVED_MAX tasks were waiting (unserved.go).
	UnservedRefused atomic.Int64
	// ShedFlow the sheddable tasks shed (code shed); OverQuota the tasks
	// found over their tenant's quota; Inversions the dispatches of a
	// lower-priority task while a higher-priority held task of the same
	// type could have used the slot (flow control: it must stay 0).
	ShedFlow, OverQuota, Inversions atomic.Int64
	// OverBudget counts the attempts found over their tenant's or type's
	// cost budget (refused with budget_exceeded, or degraded).
	OverBudget atomic.Int64
	// ShedInversions counts the non-sheddable tasks that ended for want
	// of capacity (expired, or failed saturated) while a sheddable task of
	// their candidate set was still held (shedorder.go: it must stay 0).
	ShedInversions atomic.Int64
}

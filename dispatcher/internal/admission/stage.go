package admission

import (
	"context"
	"sync"
	"time"

	"github.com/mlsched/mlsched/dispatcher/internal/budget"
	"github.com/mlsched/mlsched/dispatcher/internal/finish"
	"github.com/mlsched/mlsched/dispatcher/internal/lograte"
	"github.com/mlsched/mlsched/dispatcher/internal/outcome"
	"github.com/mlsched/mlsched/dispatcher/internal/policy"
	"github.com/mlsched/mlsched/dispatcher/internal/quota"
	"github.com/mlsched/mlsched/dispatcher/internal/registry"
	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/shared/jsplumb"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/tracing"
	"github.com/rs/zerolog"
)

// Stage is admission: it takes an attempt (a task from intake, or a retry
// from the outcome stage) through the chain of steps (admission.go) to a
// dispatch, or to its ending. It owns the attempts it keeps: those held
// back for want of capacity (hold.go) and those waiting for a node to serve
// them (unserved.go); nothing else edits their queues.
type Stage struct {
	Params
	held      *holdRoom
	unserved  *unservedRoom
	drain     *drainMeter       // for retry_after_ms
	quotaLog  lograte.Sometimes // bounded-rate log of degraded quotas
	budgetLog lograte.Sometimes // and of degraded budgets
	chain     []admitStep       // the steps, in order (admission.go)
}

// Params is what admission needs: what it decides with and on, where a
// dispatch goes, and where an attempt ends.
type Params struct {
	Config Config
	Log    zerolog.Logger
	Engine *policy.Engine
	Tables Tables             // the decision table and model timeouts
	Reg    *registry.Registry // which nodes serve what, and read the compact dispatch
	Pub    *jsplumb.Publisher // dispatches
	// Complete settles the attempt's message once its dispatch is stored.
	Complete   *jsplumb.Completer
	Batch      *stats.Batcher
	Sealer     Sealer
	Superseded Superseded       // cancelled tasks are not dispatched
	Keeper     Keeper           // tasks stay in progress until their result
	Fin        *finish.Finisher // attempts that end here (rejected, failed, expired, shed)
	Counters   *Tallies
	Metrics    Metrics
	Tracer     *tracing.Tracer
	Rules      Rules          // deadlines, tenants' weights, quotas and caps
	Quota      *quota.Limiter // the tenants' rate quotas and concurrency caps
	Budgets    *budget.Ledger // nil: no budgets
	// Reconnects counts the NATS connection's reconnections (unserved.go:
	// while it was down no heartbeat could arrive).
	Reconnects func() uint64
}

// New builds the admission stage.
func New(p Params) *Stage {
	if p.Metrics == nil {
		p.Metrics = noMetrics{}
	}
	if p.Keeper == nil {
		p.Keeper = noKeeper{}
	}
	if p.Rules == nil {
		p.Rules = noRules{}
	}
	in := &Stage{Params: p, held: newHoldRoom(), unserved: &unservedRoom{}, drain: &drainMeter{}}
	in.quotaLog.Every = 10 * time.Second
	in.budgetLog.Every = 10 * time.Second
	in.chain = newChain(in)
	return in
}

var _ outcome.Retrier = (*Stage)(nil)

// Retry is the outcome stage's way back (outcome.Retrier): the next
// attempt runs through admission.
func (in *Stage) Retry(next finish.Spec, msg jsplumb.Msg) { in.Dispatch(Attempt{Spec: next}, msg) }

// Wake: an outcome freed a slot (outcome.Retrier).
func (in *Stage) Wake() { in.wake() }

// wake prompts the hold loop (hold.go).
func (in *Stage) wake() { in.held.wake() }

// Attempt is one attempt to dispatch: the attempt as every stage
// knows it (finish.Spec, which also builds its ending), and what admission
// marks on it.
type Attempt struct {
	finish.Spec
	// admissionMarks: where admission's steps left it, in the hold or
	// the waiting room.
	admissionMarks
	// PipeStep: a pipeline step after the first (a task message of the
	// dispatcher's, not parked).
	PipeStep bool
}

// admissionMarks are what admission's steps (admission.go) mark on an
// attempt they keep: its place in the hold and the waiting room, and its
// standing with its tenant's quota and cap.
type admissionMarks struct {
	// heldSince is when the task was first held for want of capacity
	// (hold.go); zero if it was not.
	heldSince time.Time
	// noNodeSince is when this attempt first found no live node that
	// serves it (unserved.go); MLSCHED_NO_NODE_WAIT counts from there, not
	// from the submission, so that a retry after a lost attempt, or a task
	// that waited in a backlog, still gets the whole wait. Zero if it has
	// not.
	noNodeSince time.Time
	// fromHold: the hold's pass sends it on, in priority and fair order;
	// it does not queue behind held tasks of its own priority.
	fromHold bool
	// admitted: its tenant's rate quota let it in (charged once);
	// overQuota: it is held because the quota did not; overCap: it is
	// held because its tenant has its cap of tasks in flight.
	admitted, overQuota, overCap bool
}

// overLimit: held over its tenant's quota or cap, not for capacity (it
// holds back no other tenant's task).
func (a *Attempt) overLimit() bool { return a.overQuota || a.overCap }

// MaxAttemptsOr is the task's max_attempts, or def when it sets none.
func (a *Attempt) MaxAttemptsOr(def int) int {
	if a.Task.MaxAttempts > 0 {
		return a.Task.MaxAttempts
	}
	return def
}

// headerBufs holds the header storage of dispatches being published
// (the map and values of ~14 headers: most of a dispatch's allocations).
var headerBufs = sync.Pool{New: func() any { return new(protocol.HeaderBuf) }}

// request is what the policy engine needs to decide an attempt: the task's
// constraints and history, and the attempt's timeout and deadline for the
// load model.
func (in *Stage) request(a *Attempt) policy.Request { return in.requestAs(a, asIs) }

// asking is how the hold asks about a held task besides as it is.
type asking uint8

const (
	asIs asking = iota
	// fullDeadline: decide without MLSCHED_QUEUE_TARGET (whether a task
	// whose hold time ran out is saturated at all).
	fullDeadline
	// noExpiry: decide as if the task had no deadline_ms of its own
	// (whether a task is saturated only because little of its own
	// deadline is left).
	noExpiry
)

// requestAs is request, asked as the hold asks.
func (in *Stage) requestAs(a *Attempt, as asking) policy.Request {
	t := &a.Task
	timeout := in.attemptTimeout(t, "") // no model decided yet
	deadline := timeout + in.Config.DeadlineSlack
	if expiry := in.Rules.Expiry(t, a.Submitted); !expiry.IsZero() && as != noExpiry {
		// A task that cannot start before its own deadline makes its
		// candidates saturated: it is held, not sent to expire on a node.
		deadline = max(0, min(deadline, time.Until(expiry)))
	}
	// The engine caps each (model, node)'s queue at its queue target (the
	// rest waits in the hold, where priorities and tenants are ordered:
	// docs/policies.md); FullDeadline asks without it.
	return policy.Request{Type: t.Type, Models: t.Models, MaxLatencyMs: t.MaxLatencyMs,
		MinSuccessRate: t.MinSuccessRate, Size: t.Size, Tried: a.History, Timeout: timeout, Deadline: deadline, FullDeadline: as == fullDeadline,
		Priority: t.Priority}
}

// admit charges the task to its tenant's rate quota; over it, the task is
// held until its deadline (the hold asks again each pass) or, with
// MLSCHED_QUOTA_REJECT, rejected at once with CodeQuotaExceeded. It
// reports whether the task goes on now.
func (in *Stage) admit(a *Attempt, msg jsplumb.Msg, expiry time.Time) bool {
	ok, wait := in.Quota.Allow(context.Background(), a.Task.TenantName())
	in.logQuotaDegraded()
	if ok {
		a.admitted, a.overQuota = true, false
		return true
	}
	if !a.overQuota {
		in.Counters.OverQuota.Add(1)
	}
	if in.Config.QuotaReject {
		in.rejectQuota(a, msg, wait)
		return false
	}
	a.overQuota = true
	if !in.hold(*a, msg, policy.Decision{}, in.holdWait(a), expiry) {
		in.Complete.Retry(msg, 0) // shutting down
	}
	return false
}

// acquire counts the task in flight for its tenant's concurrency cap
// until the attempt's deadline; over the cap the task is held (the hold
// asks again each pass) or, with MLSCHED_QUOTA_REJECT, rejected at once
// with CodeQuotaExceeded. A retry (attempt > 1) was in flight already and
// is counted again whatever the cap. It reports whether the task goes on.
func (in *Stage) acquire(a *Attempt, msg jsplumb.Msg, deadline, expiry time.Time) bool {
	ok, wait := in.Quota.Acquire(context.Background(), a.Task.TenantName(), a.Task.ID, time.Until(deadline), a.Attempt > 1)
	in.logQuotaDegraded()
	if ok {
		a.overCap = false
		return true
	}
	if !a.overCap {
		in.Counters.OverQuota.Add(1)
	}
	a.overCap = true
	if in.Config.QuotaReject {
		in.rejectQuota(a, msg, min(wait, in.drain.retryAfter(in.held.len())))
		return false
	}
	if !in.hold(*a, msg, policy.Decision{}, in.holdWait(a), expiry) {
		in.Complete.Retry(msg, 0) // shutting down
	}
	return false
}

// spend charges the attempt's cost to its tenant's and type's budgets
// (dispatcher/internal/budget), each attempt of a task alike: the work is
// paid for when it runs. Over a budget that refuses, the task ends with
// CodeBudgetExceeded and retry_after_ms (the time left in the budget's
// period): rejected on a first attempt, failed on a retry (the task ran
// and failed, and there is no budget to try again). Over a budget that
// degrades, the attempt goes on degraded, not charged yet: the caller
// decides again with the cost policy (the cheapest model that clears the
// type's bar) and charges that past the limit. It reports whether the
// attempt goes on, and whether degraded.
func (in *Stage) spend(a *Attempt, msg jsplumb.Msg, cost float64) (goes, degrade bool) {
	t := &a.Task
	v := in.Budgets.Charge(context.Background(), t.TenantName(), t.Type, cost, false)
	if why := in.Budgets.Degraded(); why != "" {
		in.budgetLog.Log(&in.Log, func(e *zerolog.Event) *zerolog.Event { return e.Str("reason", why) },
			"budgets degraded: charging this replica's share of each budget")
	}
	if v.OK {
		return true, false
	}
	in.Counters.OverBudget.Add(1)
	if v.Over.Action == budget.Degrade {
		return true, true
	}
	err := protocol.Errorf(protocol.CodeBudgetExceeded, "%s %q has spent its budget of %g per %s (this attempt would cost %g); it renews in %s",
		v.Over.Scope, v.Over.Name, v.Over.Limit, v.Over.Period, cost, v.RetryAfter.Round(time.Second))
	status := protocol.StatusRejected
	if a.Attempt > 1 {
		status = protocol.StatusFailed
	}
	e := a.Ends(msg, err, status)
	e.RetryAfter = max(v.RetryAfter, time.Millisecond)
	in.Fin.End(e)
	return false, false
}

func (in *Stage) logQuotaDegraded() {
	if why := in.Quota.Degraded(); why != "" {
		in.quotaLog.Log(&in.Log, func(e *zerolog.Event) *zerolog.Event { return e.Str("reason", why) },
			"quota degraded: enforcing this replica's share of the tenants' quotas")
	}
}

func (in *Stage) rejectQuota(a *Attempt, msg jsplumb.Msg, wait time.Duration) {
	tenant := a.Task.TenantName()
	err := protocol.Errorf(protocol.CodeQuotaExceeded, "tenant %q is over its rate quota of %g tasks/s", tenant, in.Rules.Rate(tenant))
	if a.overCap {
		err = protocol.Errorf(protocol.CodeQuotaExceeded, "tenant %q has its concurrency cap of %d tasks in flight", tenant, in.Rules.Cap(tenant))
	}
	e := a.Ends(msg, err, protocol.StatusRejected)
	e.RetryAfter = max(wait, time.Millisecond)
	in.Fin.End(e)
}

// holdWait is how long a task may be held for want of capacity: its
// timeout plus the deadline slack (the hold also ends it at its own
// deadline).
func (in *Stage) holdWait(a *Attempt) time.Duration {
	return in.attemptTimeout(&a.Task, "") + in.Config.DeadlineSlack // held: no model decided
}

// expire ends a task whose deadline passed before it started: failed with
// CodeExpired, not dead-lettered (its answer is worthless now), with
// retry_after_ms.
func (in *Stage) expire(a *Attempt, msg jsplumb.Msg, expiry time.Time, where string) {
	in.Fin.Counts.Expired.Add(1)
	err := expiredError(&a.Task, expiry, where)
	in.Log.Info().Err(err).Str("task_id", a.Task.ID).Int("attempt", a.Attempt).Msg("task expired")
	e := a.Ends(msg, err, protocol.StatusFailed)
	e.RetryAfter = in.drain.retryAfter(in.held.len())
	in.Fin.End(e)
}

// attemptTimeout is the one rule for an attempt's timeout: the task's own
// timeout_ms; else, once a model is decided, the timeout its nodes announce
// for it; else MLSCHED_TASK_TIMEOUT. Before a model is decided (model "":
// the load model's deadline in request, the hold's wait) the configured
// timeout stands for the model's.
func (in *Stage) attemptTimeout(t *protocol.Task, model string) time.Duration {
	if t.TimeoutMs > 0 {
		return time.Duration(t.TimeoutMs) * time.Millisecond
	}
	if m := in.Tables.Timeouts(); m != nil && model != "" {
		if ms, ok := (*m)[model]; ok && ms > 0 {
			return time.Duration(ms) * time.Millisecond
		}
	}
	return in.Config.TaskTimeout
}

// Held is the number of tasks held for want of capacity, or over their
// tenant's quota or cap (those in a pass included).
func (in *Stage) Held() int { return in.held.len() }

// HeldBy is what is held by band and tenant, the top ones first.
func (in *Stage) HeldBy(top int) []protocol.HeldCount { return in.held.waiting(top) }

// TenantHeld is how many of a tenant's tasks of the band are held.
func (in *Stage) TenantHeld(band int, tenant string) int { return in.held.tenantHeld(band, tenant) }

// Unserved is the number of attempts waiting for a node.
func (in *Stage) Unserved() int { return in.unserved.len() }

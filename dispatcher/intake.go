package dispatcher

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

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
	"github.com/mlsched/mlsched/shared/topology"
	"github.com/mlsched/mlsched/shared/tracing"
)

// intake is the stage that takes a task in and sends it out: it validates a
// task of MLSCHED_TASKS, decides model and node with the policy engine and
// publishes the dispatch, settling the task once the dispatch is stored. It
// owns the tasks it keeps: those held back for want of capacity (hold.go)
// and those waiting for a node to serve them (unserved.go). The outcome
// stage sends retries back through Retry (outcome.Retrier).
type intake struct {
	intakeParams
	held      *holdRoom
	unserved  *unservedRoom
	redeliver *redeliveries     // result lookups of redelivered tasks
	park      *parking          // nil: never park
	quotaLog  lograte.Sometimes // bounded-rate log of degraded quotas
	budgetLog lograte.Sometimes // and of degraded budgets
	chain     []admitStep       // admission's steps, in order (admission.go)
}

// intakeParams is what the intake stage needs.
type intakeParams struct {
	cfg        Config
	log        zerolog.Logger
	engine     *policy.Engine
	snaps      *refresher         // the decision table and model timeouts
	reg        *registry.Registry // which nodes read the compact dispatch
	pub        *jsplumb.Publisher // dispatches
	complete   *jsplumb.Completer
	batch      *stats.Batcher
	sealer     *sealer
	superseded *supersededSet   // cancelled tasks are not dispatched
	keeper     *taskKeeper      // tasks stay unacknowledged until their result (taskack.go)
	fin        *finish.Finisher // tasks that end here (rejected, failed)
	counters   *Counters
	metrics    *metrics
	tracer     *tracing.Tracer
	flow       *flowRules  // deadlines and tenants' weights
	drain      *drainMeter // for retry_after_ms
	quota      *quota.Limiter
	budgets    *budget.Ledger // nil: no budgets
	// reconnects counts the NATS connection's reconnections (unserved.go:
	// while it was down no heartbeat could arrive).
	reconnects func() uint64
}

func newIntake(p intakeParams) *intake {
	in := &intake{intakeParams: p, held: newHoldRoom(), unserved: &unservedRoom{}, redeliver: newRedeliveries()}
	in.quotaLog.Every = 10 * time.Second
	in.budgetLog.Every = 10 * time.Second
	in.chain = newChain(in)
	return in
}

var _ outcome.Retrier = (*intake)(nil)

// Retry is the outcome stage's way back (outcome.Retrier): the next
// attempt runs through admission.
func (in *intake) Retry(next finish.Spec, msg jsplumb.Msg) { in.dispatch(attemptSpec{Spec: next}, msg) }

// Wake: an outcome freed a slot (outcome.Retrier).
func (in *intake) Wake() { in.wake() }

// wake prompts the hold loop (hold.go).
func (in *intake) wake() { in.held.wake() }

// taskOrigin is where a task message comes from: its band's stream, or its
// tenant's parked tasks (park.go), which carry the submission in headers.
type taskOrigin struct {
	subject     string // where the producer published it
	submitted   time.Time
	submission  string // its sequence in MLSCHED_TASKS: where it was stored, or parked
	traceparent string
	first       bool // its first delivery
	parked      bool
}

// handleTask is one message of a band of MLSCHED_TASKS.
func (in *intake) handleTask(msg jetstream.Msg) {
	o := taskOrigin{subject: msg.Subject(), first: true, traceparent: protocol.TraceparentOf(msg.Headers())}
	if meta, err := msg.Metadata(); err == nil {
		o.submitted, o.submission = meta.Timestamp, strconv.FormatUint(meta.Sequence.Stream, 10)
		o.first = meta.NumDelivered == 1
	} else {
		o.submitted = time.Now()
	}
	in.take(msg, o)
}

// handleParked is one parked task coming back (park.go).
func (in *intake) handleParked(msg jetstream.Msg) {
	o, err := parkedOrigin(msg)
	if err != nil {
		in.log.Warn().Err(err).Str("subject", msg.Subject()).Msg("task rejected")
		task, _ := protocol.DecodeTask(msg.Data(), in.cfg.Limits())
		a := attemptSpec{Spec: finish.Spec{Task: task, Data: msg.Data(), Attempt: 1, Submitted: time.Now(), Traceparent: o.traceparent}}
		e := a.Ends(msg, err, protocol.StatusRejected)
		e.Subject = msg.Subject()
		in.fin.End(e)
		return
	}
	in.take(msg, o)
}

// take validates a task and dispatches it (or holds, or parks it).
func (in *intake) take(msg jetstream.Msg, o taskOrigin) {
	data := msg.Data()
	task, err := protocol.DecodeTask(data, in.cfg.Limits())
	if err == nil {
		err = checkTaskSubject(o.subject, &task)
	}
	a := attemptSpec{Spec: finish.Spec{Task: task, Data: data, Attempt: 1, Submitted: o.submitted, Submission: o.submission,
		Traceparent: o.traceparent, TaskAck: msg.Reply()}}
	if err == nil && (task.Pipeline != nil || len(msg.Headers()[protocol.HdrPipeline]) > 0) {
		err = in.pipelineTake(msg.Headers(), &a) // pipeline.go
	}
	if o.first && !o.parked { // a task waiting for a node is redelivered: count it once
		typ := task.Type
		if err != nil {
			typ = "invalid"
		}
		in.metrics.received.Get(typ).Inc()
	}
	if err != nil {
		in.log.Warn().Err(err).Str("task_id", task.ID).Str("subject", o.subject).Msg("task rejected")
		e := a.Ends(msg, err, protocol.StatusRejected)
		e.Subject = o.subject
		in.fin.End(e)
		return
	}
	if in.superseded.Cancelled(task.ID, o.submission) || a.pipeStep && in.superseded.CancelledAny(task.ID) {
		// cancelled while it waited (a pipeline: at any step): it has its result
		in.fin.End(a.EndsStored(msg))
		return
	}
	if !o.first || o.parked {
		// Delivered before: its result may be stored (the ack of the task
		// was lost, or the replica that would have kept it alive is gone).
		// Looked up off this goroutine (redelivered.go).
		in.redelivered(msg, a, o)
		return
	}
	in.enter(msg, a, o)
}

// enter parks a task of a flooding tenant, or dispatches it.
func (in *intake) enter(msg jetstream.Msg, a attemptSpec, o taskOrigin) {
	if !o.parked && !a.pipeStep && in.park.shouldPark(topology.BandOf(a.Task.Priority), a.Task.TenantName()) {
		in.park.park(msg, &a.Task, a.Data, o)
		return
	}
	in.dispatch(a, msg)
}

// checkTaskSubject: a task is published on its type's subject, band 0
// (any priority: a producer of an earlier version), or its priority's band
// (topology.BandTaskSubject).
func checkTaskSubject(subject string, t *protocol.Task) error {
	typ, band, ok := topology.ParseTaskSubject(subject)
	if !ok || typ != t.Type {
		return protocol.Errorf(protocol.CodeTypeMismatch, "task of type %q was published on %s; publish it on %s",
			t.Type, subject, topology.BandTaskSubject(t.Type, t.Priority))
	}
	if band != topology.BandNormal && band != topology.BandOf(t.Priority) {
		return protocol.Errorf(protocol.CodeBandMismatch, "task of priority %d was published on %s, another band's subject; publish it on %s",
			t.Priority, subject, topology.BandTaskSubject(t.Type, t.Priority))
	}
	return nil
}

// attemptSpec is one attempt to dispatch: the attempt as every stage
// knows it (finish.Spec, which also builds its ending), and what admission
// marks on it.
type attemptSpec struct {
	finish.Spec
	// admissionMarks: where admission's steps left it, in the hold or
	// the waiting room.
	admissionMarks
	// pipeStep: a pipeline step after the first (a task message of the
	// dispatcher's, not parked).
	pipeStep bool
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
func (a *attemptSpec) overLimit() bool { return a.overQuota || a.overCap }

func (a *attemptSpec) maxAttempts(def int) int {
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
func (in *intake) request(a *attemptSpec) policy.Request { return in.requestAs(a, asIs) }

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
func (in *intake) requestAs(a *attemptSpec, as asking) policy.Request {
	t := &a.Task
	timeout := in.attemptTimeout(t, "") // no model decided yet
	deadline := timeout + in.cfg.DeadlineSlack
	if expiry := in.flow.expiry(t, a.Submitted); !expiry.IsZero() && as != noExpiry {
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
func (in *intake) admit(a *attemptSpec, msg jsplumb.Msg, expiry time.Time) bool {
	ok, wait := in.quota.Allow(context.Background(), a.Task.TenantName())
	in.logQuotaDegraded()
	if ok {
		a.admitted, a.overQuota = true, false
		return true
	}
	if !a.overQuota {
		in.counters.OverQuota.Add(1)
	}
	if in.cfg.QuotaReject {
		in.rejectQuota(a, msg, wait)
		return false
	}
	a.overQuota = true
	if !in.hold(*a, msg, policy.Decision{}, in.holdWait(a), expiry) {
		in.complete.Retry(msg, 0) // shutting down
	}
	return false
}

// acquire counts the task in flight for its tenant's concurrency cap
// until the attempt's deadline; over the cap the task is held (the hold
// asks again each pass) or, with MLSCHED_QUOTA_REJECT, rejected at once
// with CodeQuotaExceeded. A retry (attempt > 1) was in flight already and
// is counted again whatever the cap. It reports whether the task goes on.
func (in *intake) acquire(a *attemptSpec, msg jsplumb.Msg, deadline, expiry time.Time) bool {
	ok, wait := in.quota.Acquire(context.Background(), a.Task.TenantName(), a.Task.ID, time.Until(deadline), a.Attempt > 1)
	in.logQuotaDegraded()
	if ok {
		a.overCap = false
		return true
	}
	if !a.overCap {
		in.counters.OverQuota.Add(1)
	}
	a.overCap = true
	if in.cfg.QuotaReject {
		in.rejectQuota(a, msg, min(wait, in.drain.retryAfter(in.held.len())))
		return false
	}
	if !in.hold(*a, msg, policy.Decision{}, in.holdWait(a), expiry) {
		in.complete.Retry(msg, 0) // shutting down
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
func (in *intake) spend(a *attemptSpec, msg jsplumb.Msg, cost float64) (goes, degrade bool) {
	t := &a.Task
	v := in.budgets.Charge(context.Background(), t.TenantName(), t.Type, cost, false)
	if why := in.budgets.Degraded(); why != "" {
		in.budgetLog.Log(&in.log, func(e *zerolog.Event) *zerolog.Event { return e.Str("reason", why) },
			"budgets degraded: charging this replica's share of each budget")
	}
	if v.OK {
		return true, false
	}
	in.counters.OverBudget.Add(1)
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
	in.fin.End(e)
	return false, false
}

func (in *intake) logQuotaDegraded() {
	if why := in.quota.Degraded(); why != "" {
		in.quotaLog.Log(&in.log, func(e *zerolog.Event) *zerolog.Event { return e.Str("reason", why) },
			"quota degraded: enforcing this replica's share of the tenants' quotas")
	}
}

func (in *intake) rejectQuota(a *attemptSpec, msg jsplumb.Msg, wait time.Duration) {
	tenant := a.Task.TenantName()
	err := protocol.Errorf(protocol.CodeQuotaExceeded, "tenant %q is over its rate quota of %g tasks/s", tenant, in.flow.rates[tenant])
	if a.overCap {
		err = protocol.Errorf(protocol.CodeQuotaExceeded, "tenant %q has its concurrency cap of %d tasks in flight", tenant, in.flow.caps[tenant])
	}
	e := a.Ends(msg, err, protocol.StatusRejected)
	e.RetryAfter = max(wait, time.Millisecond)
	in.fin.End(e)
}

// holdWait is how long a task may be held for want of capacity: its
// timeout plus the deadline slack (the hold also ends it at its own
// deadline).
func (in *intake) holdWait(a *attemptSpec) time.Duration {
	return in.attemptTimeout(&a.Task, "") + in.cfg.DeadlineSlack // held: no model decided
}

// expire ends a task whose deadline passed before it started: failed with
// CodeExpired, not dead-lettered (its answer is worthless now), with
// retry_after_ms.
func (in *intake) expire(a *attemptSpec, msg jsplumb.Msg, expiry time.Time, where string) {
	in.counters.Expired.Add(1)
	err := expiredError(&a.Task, expiry, where)
	in.log.Info().Err(err).Str("task_id", a.Task.ID).Int("attempt", a.Attempt).Msg("task expired")
	e := a.Ends(msg, err, protocol.StatusFailed)
	e.RetryAfter = in.drain.retryAfter(in.held.len())
	in.fin.End(e)
}

// attemptTimeout is the one rule for an attempt's timeout: the task's own
// timeout_ms; else, once a model is decided, the timeout its nodes announce
// for it; else MLSCHED_TASK_TIMEOUT. Before a model is decided (model "":
// the load model's deadline in request, the hold's wait) the configured
// timeout stands for the model's.
func (in *intake) attemptTimeout(t *protocol.Task, model string) time.Duration {
	if t.TimeoutMs > 0 {
		return time.Duration(t.TimeoutMs) * time.Millisecond
	}
	if m := in.snaps.timeouts.Load(); m != nil && model != "" {
		if ms, ok := (*m)[model]; ok && ms > 0 {
			return time.Duration(ms) * time.Millisecond
		}
	}
	return in.cfg.TaskTimeout
}

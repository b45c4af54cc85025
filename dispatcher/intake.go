package dispatcher

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"

	"github.com/mlsched/mlsched/dispatcher/internal/budget"
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
// stage sends retries back through dispatch (the retrier interface).
type intake struct {
	intakeParams
	held      *holdRoom
	unserved  *unservedRoom
	redeliver *redeliveries // result lookups of redelivered tasks
	park      *parking      // nil: never park
	quotaLog  sometimes     // bounded-rate log of degraded quotas
	budgetLog sometimes     // and of degraded budgets
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
	superseded *supersededSet // cancelled tasks are not dispatched
	keeper     *taskKeeper    // tasks stay unacknowledged until their result (taskack.go)
	fin        *finisher      // tasks that end here (rejected, failed)
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
	in.quotaLog.every = 10 * time.Second
	in.budgetLog.every = 10 * time.Second
	return in
}

// retrier is how the outcome stage hands a failed attempt back to intake,
// and tells it that a slot is free.
type retrier interface {
	// dispatch decides and publishes the next attempt; msg is settled once
	// the dispatch is stored.
	dispatch(a attemptSpec, msg jsplumb.Msg)
	// wake: an outcome freed a slot, held tasks may go now.
	wake()
}

var _ retrier = (*intake)(nil)

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
		a := attemptSpec{task: task, data: msg.Data(), attempt: 1, submitted: time.Now(), traceparent: o.traceparent}
		e := a.ends(msg, err, protocol.StatusRejected)
		e.subject = msg.Subject()
		in.fin.end(e)
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
	a := attemptSpec{task: task, data: data, attempt: 1, submitted: o.submitted, submission: o.submission,
		traceparent: o.traceparent, taskAck: msg.Reply()}
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
		e := a.ends(msg, err, protocol.StatusRejected)
		e.subject = o.subject
		in.fin.end(e)
		return
	}
	if in.superseded.Cancelled(task.ID, o.submission) || a.pipeStep && in.superseded.CancelledAny(task.ID) {
		// cancelled while it waited (a pipeline: at any step): it has its result
		in.fin.end(a.endsStored(msg))
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
	if !o.parked && !a.pipeStep && in.park.shouldPark(topology.BandOf(a.task.Priority), a.task.TenantName()) {
		in.park.park(msg, &a.task, a.data, o)
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

// attemptSpec is one attempt to dispatch.
type attemptSpec struct {
	task      protocol.Task
	data      []byte // the task's original bytes, forwarded unchanged
	attempt   int
	history   []protocol.Attempt
	submitted time.Time
	// submission names this submission of the task (its sequence in the
	// task stream), carried in HdrTaskSeq through every attempt.
	submission string
	// traceparent is the W3C trace context of the task (the producer's, or
	// the previous attempt's dispatch span), "" when it has none.
	traceparent string
	// heldSince is when the task was first held for want of capacity
	// (hold.go); zero if it was not.
	heldSince time.Time
	// noNodeSince is when this attempt first found no live node that
	// serves it (unserved.go); MLSCHED_NO_NODE_WAIT counts from there, not
	// from the submission, so that a retry after a lost attempt, or a task
	// that waited in a backlog, still gets the whole wait. Zero if it has
	// not.
	noNodeSince time.Time
	// taskAck is the task message's ack subject (Dispatch.TaskAck), ""
	// for a task dispatched by an older dispatcher.
	taskAck string
	// fromHold: the hold's pass sends it on, in priority and fair order;
	// it does not queue behind held tasks of its own priority.
	fromHold bool
	// admitted: its tenant's rate quota let it in (charged once);
	// overQuota: it is held because the quota did not; overCap: it is
	// held because its tenant has its cap of tasks in flight.
	admitted, overQuota, overCap bool
	// fullDeadline: decide without MLSCHED_QUEUE_TARGET (the hold asks
	// whether a task whose hold time ran out is saturated at all).
	fullDeadline bool
	// noExpiry: decide as if the task had no deadline_ms of its own (the
	// hold asks whether a task is saturated only because little of its
	// own deadline is left).
	noExpiry bool
	// pipe is a pipeline step's sealed progress (pipeline.go), carried on
	// its dispatches; pipeStep: a step after the first (a task message of
	// the dispatcher's, not parked).
	pipe     string
	pipeStep bool
}

// overLimit: held over its tenant's quota or cap, not for capacity (it
// holds back no other tenant's task).
func (a *attemptSpec) overLimit() bool { return a.overQuota || a.overCap }

// ends is how this attempt ends, handled by msg: with err and status, or
// (endsStored) with the task's result stored already. The finisher ends it
// (finisher.end); this is the one place an ending is built.
func (a *attemptSpec) ends(msg jsplumb.Msg, err error, status protocol.Status) ending {
	return ending{msg: msg, taskAck: a.taskAck, subject: topology.TaskSubject(a.task.Type), data: a.data, task: a.task,
		err: err, status: status, history: a.history, attempts: a.attempt - 1, submitted: a.submitted,
		submission: a.submission, traceparent: a.traceparent, pipe: a.pipe}
}

// endsStored: the attempt ends with the task's result stored already (the
// task was cancelled, or its result found on a redelivery).
func (a *attemptSpec) endsStored(msg jsplumb.Msg) ending {
	e := a.ends(msg, nil, "")
	e.stored = true
	return e
}

func (a *attemptSpec) maxAttempts(def int) int {
	if a.task.MaxAttempts > 0 {
		return a.task.MaxAttempts
	}
	return def
}

// dispatch decides and publishes one attempt; msg (a task or an outcome) is
// settled once JetStream has acknowledged the dispatch.
func (in *intake) dispatch(a attemptSpec, msg jsplumb.Msg) {
	t := &a.task
	expiry := in.flow.expiry(t, a.submitted)
	if !expiry.IsZero() && !time.Now().Before(expiry) {
		if in.expireAfterShed(&a, msg, expiry) {
			return // the hold ends it, after the sheddable tasks of its set
		}
		in.expire(&a, msg, expiry, "before it could be dispatched")
		return
	}
	if a.attempt == 1 && !a.admitted && in.quota.Limited(t.TenantName()) && !in.admit(&a, msg, expiry) {
		return // held or rejected over its tenant's quota
	}
	key := ""
	if in.held.n.Load() > 0 || in.held.inPass.Load() > 0 {
		key = candidateKey(t)
	}
	req := in.request(&a)
	// A task that goes first in flow control's order (the first urgent
	// one, or a quiet tenant's) overtakes the held ones, and a node that
	// orders its queue starts it next: it need not wait for the queue
	// target (docs/policies.md, "Ordering at the node").
	req.Ahead = key != "" && in.held.leads(key, t.Priority, t.TenantName(), a.fromHold)
	req.AheadInBand = req.Ahead && in.held.bandHeld(key, t.Priority)
	table := in.snaps.table.Load()
	decision := in.tracer.Start(a.traceparent, "mlsched.decision")
	start := time.Now()
	dec, err := in.engine.Decide(table, &req)
	decided := time.Now() // also the deadline's start: one clock read fewer per task
	in.metrics.decision.Observe(decided.Sub(start).Seconds())
	if in.tracer.On() {
		decision.SetAttributes(attribute.String("mlsched.task_id", t.ID), attribute.String("mlsched.type", t.Type),
			attribute.Int("mlsched.attempt", a.attempt), attribute.String("mlsched.model", dec.Model),
			attribute.String("mlsched.node", dec.Node), attribute.Bool("mlsched.panic", dec.Panic))
	}
	decision.End(err)
	if err != nil {
		code := protocol.CodeOf(err)
		if code == protocol.CodeNoModel || code == protocol.CodeUnknownModel {
			// Nodes may be starting or restarting: wait, bounded, then
			// reject; at once when the only candidates are unready models.
			if why := unreadyOnly(in.reg.Live(), t.Type, t.Models); why != "" {
				err = protocol.Errorf(code, "%s: %s", err.(*protocol.Error).Msg, why)
			} else if !a.noNodeSince.IsZero() && time.Since(a.noNodeSince) >= in.cfg.NoNodeWait {
				err = protocol.Errorf(code, "%s (waited %s for a node)", err.(*protocol.Error).Msg, in.cfg.NoNodeWait)
			} else if err = in.waitForNode(a, msg, err); err == nil {
				return // bounded, so that no type stalls the others (unserved.go)
			}
		}
		status := protocol.StatusRejected
		if a.attempt > 1 {
			status = protocol.StatusFailed
		}
		in.log.Warn().Err(err).Str("task_id", t.ID).Int("attempt", a.attempt).Msg("no model for task")
		in.fin.end(a.ends(msg, err, status))
		return
	}
	// Backpressure (hold.go), and no overtaking: while a task of this
	// candidate set is held with a priority at least this one's (higher,
	// for a task the hold sends on, or one that goes first), this one waits
	// behind it.
	if (dec.Saturated || (key != "" && in.held.heldAtLeast(key, t.Priority, a.fromHold || req.Ahead))) &&
		in.hold(a, msg, dec, in.holdWait(&a), expiry) {
		if !dec.Saturated {
			in.held.wake() // a slot is free: the hold sends on what goes first
		}
		return
	}
	if key != "" && in.held.heldAtLeast(key, t.Priority, true) {
		// A higher-priority task of the set was held since this one's
		// check (by another goroutine, decided at the same moment): this
		// one waits behind it, and the pass sends that one first.
		if in.hold(a, msg, dec, in.holdWait(&a), expiry) {
			in.held.wake()
			return
		}
		in.counters.Inversions.Add(1) // only when the hold is closed: it must stay 0
	}
	if key != "" && !req.Ahead {
		in.held.sentPlain(key, t.Priority)
	}
	if dec.Panic {
		in.counters.Panic.Add(1)
		in.log.Warn().Str("task_id", t.ID).Str("model", dec.Model).Str("node", dec.Node).
			Msg("panic mode: every candidate's breaker is open, routing anyway")
	}
	timeout := in.attemptTimeout(t, dec.Model)
	deadline := decided.Add(timeout + in.cfg.DeadlineSlack)
	if !expiry.IsZero() && expiry.Before(deadline) {
		// The worker does not start an attempt past its deadline: nor,
		// then, a task past its own.
		deadline = expiry
	}
	if in.quota.Capped(t.TenantName()) && !in.acquire(&a, msg, deadline, expiry) {
		return // held or rejected over its tenant's concurrency cap
	}
	cost, priced := in.reg.Cost(dec.Node, dec.Model, t.Size)
	if in.budgets.Limited(t.TenantName(), t.Type) {
		goes, degrade := in.spend(&a, msg, cost)
		if !goes {
			return // refused over its tenant's or type's budget
		}
		if degrade {
			// Over a budget that degrades: the cheapest model that clears
			// the type's bar (the cost policy), charged past the limit.
			creq := req
			creq.Cheapest = true
			if cheap, err := in.engine.Decide(table, &creq); err == nil && !cheap.Saturated && cheap.Model != dec.Model {
				dec = cheap
				timeout = in.attemptTimeout(t, dec.Model)
				deadline = decided.Add(timeout + in.cfg.DeadlineSlack)
				if !expiry.IsZero() && expiry.Before(deadline) {
					deadline = expiry
				}
				cost, priced = in.reg.Cost(dec.Node, dec.Model, t.Size)
			}
			in.budgets.Charge(context.Background(), t.TenantName(), t.Type, cost, true)
		}
	}
	if priced {
		in.metrics.spent(t.Type, t.TenantName(), dec.Model, cost)
	}
	pd := protocol.Dispatch{TaskID: t.ID, Type: t.Type, Model: dec.Model, Node: dec.Node,
		Attempt: a.attempt, MaxAttempts: a.maxAttempts(in.cfg.MaxAttempts), Deadline: deadline, Timeout: timeout,
		Submitted: a.submitted, Submission: a.submission, History: a.history, TaskAck: a.taskAck, Pipeline: a.pipe}
	span := in.tracer.Start(a.traceparent, "mlsched.dispatch")
	pd.Traceparent = span.Traceparent() // the worker's spans are children of the dispatch
	if in.tracer.On() {
		span.SetAttributes(attribute.String("mlsched.task_id", t.ID), attribute.Int("mlsched.attempt", a.attempt),
			attribute.String("mlsched.model", dec.Model), attribute.String("mlsched.node", dec.Node))
	}
	in.seal(&pd, a.data)
	hb := headerBufs.Get().(*protocol.HeaderBuf)
	defer headerBufs.Put(hb) // once Publish has returned: nats.go has encoded the headers
	var h nats.Header
	if in.reg.CompactDispatch(dec.Node) { // one header instead of fourteen (protocol/compact.go)
		h = pd.CompactHeaderInto(hb)
	} else {
		h = pd.HeaderInto(hb)
	}
	out := &nats.Msg{Subject: topology.DispatchSubject(dec.Node), Data: a.data, Header: h}
	hb.Put(protocol.HdrMsgID, pd.MsgID("d"))
	id, attempt := t.ID, a.attempt
	model, node, redispatch := dec.Model, dec.Node, a.attempt > 1
	band, submitted := bandName(t.Priority), a.submitted
	table.Dispatched(dec.Model, dec.Node)
	// Publish-then-ack: msg is settled on the publisher's reply goroutine
	// once JetStream has stored the dispatch (or refused it).
	// The task itself is not acked when its dispatch is stored, but kept
	// until its result is (taskack.go).
	settled := in.keeper.dispatched(msg, a.taskAck, deadline, attemptRecord{Task: t.ID, Type: t.Type, Submission: a.submission,
		Attempt: a.attempt, MaxAttempts: pd.MaxAttempts, Model: dec.Model, Node: dec.Node, History: a.history})
	err = in.complete.Publish(context.Background(), in.pub, settled, out, "", func(ack *jetstream.PubAck, err error) error {
		span.End(err)
		if err != nil {
			in.log.Warn().Err(err).Str("task_id", id).Str("model", model).Str("node", node).Msg("dispatch not acknowledged, will retry")
			return err
		}
		if !ack.Duplicate {
			now := time.Now()
			in.drain.dispatched(now)
			in.batch.Add(stats.Event{Model: model, Node: node, Kind: stats.KindDispatched})
			if redispatch {
				in.counters.Redispatched.Add(1)
			} else {
				in.counters.Dispatched.Add(1)
				in.metrics.admitted.Get(band).Inc()
				in.metrics.wait.Get(band).Observe(now.Sub(submitted).Seconds())
			}
		}
		in.log.Debug().Str("task_id", id).Str("model", model).Str("node", node).Int("attempt", attempt).Msg("dispatched")
		return nil
	})
	if err != nil {
		table.Completed(dec.Model, dec.Node) // not sent after all
		in.log.Warn().Err(err).Str("task_id", id).Str("model", dec.Model).Str("node", dec.Node).Msg("dispatch publish failed, will retry")
		span.End(err)
		in.keeper.keep(msg, a.taskAck, time.Now().Add(time.Second+in.cfg.AckWait)) // a retry's task stays in progress
		in.complete.Retry(msg, time.Second)
	}
}

// headerBufs holds the header storage of dispatches being published
// (the map and values of ~14 headers: most of a dispatch's allocations).
var headerBufs = sync.Pool{New: func() any { return new(protocol.HeaderBuf) }}

// request is what the policy engine needs to decide an attempt: the task's
// constraints and history, and the attempt's timeout and deadline for the
// load model.
func (in *intake) request(a *attemptSpec) policy.Request {
	t := &a.task
	timeout := in.attemptTimeout(t, "") // no model decided yet
	deadline := timeout + in.cfg.DeadlineSlack
	if expiry := in.flow.expiry(t, a.submitted); !expiry.IsZero() && !a.noExpiry {
		// A task that cannot start before its own deadline makes its
		// candidates saturated: it is held, not sent to expire on a node.
		deadline = max(0, min(deadline, time.Until(expiry)))
	}
	// The engine caps each (model, node)'s queue at its queue target (the
	// rest waits in the hold, where priorities and tenants are ordered:
	// docs/policies.md); FullDeadline asks without it.
	return policy.Request{Type: t.Type, Models: t.Models, MaxLatencyMs: t.MaxLatencyMs,
		MinSuccessRate: t.MinSuccessRate, Size: t.Size, Tried: a.history, Timeout: timeout, Deadline: deadline, FullDeadline: a.fullDeadline,
		Priority: t.Priority}
}

// admit charges the task to its tenant's rate quota; over it, the task is
// held until its deadline (the hold asks again each pass) or, with
// MLSCHED_QUOTA_REJECT, rejected at once with CodeQuotaExceeded. It
// reports whether the task goes on now.
func (in *intake) admit(a *attemptSpec, msg jsplumb.Msg, expiry time.Time) bool {
	ok, wait := in.quota.Allow(context.Background(), a.task.TenantName())
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
	ok, wait := in.quota.Acquire(context.Background(), a.task.TenantName(), a.task.ID, time.Until(deadline), a.attempt > 1)
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
	t := &a.task
	v := in.budgets.Charge(context.Background(), t.TenantName(), t.Type, cost, false)
	if why := in.budgets.Degraded(); why != "" {
		in.budgetLog.log(&in.log, func(e *zerolog.Event) *zerolog.Event { return e.Str("reason", why) },
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
	if a.attempt > 1 {
		status = protocol.StatusFailed
	}
	e := a.ends(msg, err, status)
	e.retryAfter = max(v.RetryAfter, time.Millisecond)
	in.fin.end(e)
	return false, false
}

func (in *intake) logQuotaDegraded() {
	if why := in.quota.Degraded(); why != "" {
		in.quotaLog.log(&in.log, func(e *zerolog.Event) *zerolog.Event { return e.Str("reason", why) },
			"quota degraded: enforcing this replica's share of the tenants' quotas")
	}
}

func (in *intake) rejectQuota(a *attemptSpec, msg jsplumb.Msg, wait time.Duration) {
	tenant := a.task.TenantName()
	err := protocol.Errorf(protocol.CodeQuotaExceeded, "tenant %q is over its rate quota of %g tasks/s", tenant, in.flow.rates[tenant])
	if a.overCap {
		err = protocol.Errorf(protocol.CodeQuotaExceeded, "tenant %q has its concurrency cap of %d tasks in flight", tenant, in.flow.caps[tenant])
	}
	e := a.ends(msg, err, protocol.StatusRejected)
	e.retryAfter = max(wait, time.Millisecond)
	in.fin.end(e)
}

// holdWait is how long a task may be held for want of capacity: its
// timeout plus the deadline slack (the hold also ends it at its own
// deadline).
func (in *intake) holdWait(a *attemptSpec) time.Duration {
	return in.attemptTimeout(&a.task, "") + in.cfg.DeadlineSlack // held: no model decided
}

// expire ends a task whose deadline passed before it started: failed with
// CodeExpired, not dead-lettered (its answer is worthless now), with
// retry_after_ms.
func (in *intake) expire(a *attemptSpec, msg jsplumb.Msg, expiry time.Time, where string) {
	in.counters.Expired.Add(1)
	err := expiredError(&a.task, expiry, where)
	in.log.Info().Err(err).Str("task_id", a.task.ID).Int("attempt", a.attempt).Msg("task expired")
	e := a.ends(msg, err, protocol.StatusFailed)
	e.retryAfter = in.drain.retryAfter(in.held.len())
	in.fin.end(e)
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

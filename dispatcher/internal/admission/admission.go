package admission

import (
	"context"
	"time"

	"github.com/mlsched/mlsched/dispatcher/internal/policy"
	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/shared/jsplumb"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
	"github.com/mlsched/mlsched/shared/tracing"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
)

// Admission is the chain of steps one attempt passes on its way from a task
// (or a retry) to a dispatch, in the spirit of Nomad's scheduler stack: the
// order of chain below is the order they run, and each step is one decision.
//
//	expiry   the task's own deadline_ms has passed: it ends expired
//	quota    its tenant's rate quota (first attempt): held, or rejected
//	decide   the policy engine picks model and node; none serves it: it
//	         waits for a node (unserved.go), or ends
//	hold     every candidate is saturated, or a task of its set with a
//	         priority at least its own is held: it is held (hold.go)
//	cap      its tenant's concurrency cap: held, or rejected
//	budget   its tenant's and type's budgets: refused, or degraded to the
//	         cheapest model that clears the bar
//	publish  the dispatch is sealed and published; the message settles
//	         once JetStream has stored it
//
// A step returns goOn, or kept (the task is held or waits for a node, and
// the hold or the waiting room resumes it later), or ended (its ending went
// to the finisher, or the message back to the stream). A kept task resumes
// at the step that stopped it, not at the top: the hold's pass charges the
// quota and takes the cap place itself, and hands the decision it made to
// the chain at the hold step (resume), so that an attempt is decided once
// per pass, not once in the pass and again in the chain.
type admitStep interface {
	admit(ad *admission) verdict
}

// verdict is what a step says of the attempt.
type verdict uint8

const (
	goOn  verdict = iota // to the next step
	kept                 // held, or waiting for a node: resumed later
	ended                // ended, or given back to the stream
)

// step indexes the chain.
type step uint8

const (
	stepExpiry step = iota
	stepQuota
	stepDecide
	stepHold
	stepCap
	stepBudget
	stepPublish
)

// newChain lists the steps in the order they run (the const block above
// indexes it).
func newChain(in *Stage) []admitStep {
	return []admitStep{
		stepExpiry:  expiryStep{in},
		stepQuota:   quotaStep{in},
		stepDecide:  decideStep{in},
		stepHold:    holdStep{in},
		stepCap:     capStep{in},
		stepBudget:  budgetStep{in},
		stepPublish: publishStep{in},
	}
}

// admission is one attempt on its way through the chain: the attempt and
// the message that settles with it, and what the steps have found so far.
// It lives for one run of the chain.
type admission struct {
	a      Attempt
	msg    jsplumb.Msg
	expiry time.Time     // the task's own deadline (zero: none)
	key    string        // its candidate set, "" while nothing is held
	table  *policy.Table // the decision table it is decided on
	req    policy.Request
	dec    policy.Decision
	// decided is when it was decided: the attempt's deadline counts from
	// there.
	decided  time.Time
	timeout  time.Duration
	deadline time.Time
	cost     float64
	priced   bool // the node announced a price for the model
}

// Dispatch runs one attempt through the whole chain; msg (a task or an
// outcome) is settled once JetStream has acknowledged the dispatch.
func (in *Stage) Dispatch(a Attempt, msg jsplumb.Msg) {
	ad := admission{a: a, msg: msg}
	in.admitFrom(&ad, stepExpiry)
}

// admitFrom runs the chain from the step on.
func (in *Stage) admitFrom(ad *admission, from step) {
	ad.expiry = in.Rules.Expiry(&ad.a.Task, ad.a.Submitted)
	in.runFrom(ad, from)
}

// runFrom runs the steps from the step on until one stops the attempt.
func (in *Stage) runFrom(ad *admission, from step) {
	for _, s := range in.chain[from:] {
		if s.admit(ad) != goOn {
			return
		}
	}
}

// resume runs a kept attempt on from the hold step with the decision its
// room's pass made (dec, err, on table, for req), when the chain would ask
// the engine the same question; else from the decide step.
func (in *Stage) resume(a Attempt, msg jsplumb.Msg, table *policy.Table, req *policy.Request, dec policy.Decision, err error) {
	ad := admission{a: a, msg: msg}
	ad.expiry = in.Rules.Expiry(&ad.a.Task, ad.a.Submitted)
	in.standing(&ad)
	if table != in.Tables.Table() || ad.req.Ahead != req.Ahead || ad.req.AheadInBand != req.AheadInBand {
		in.admitFrom(&ad, stepDecide) // the table changed, or its standing in the hold: ask again
		return
	}
	ad.table = table
	ad.dec, ad.decided = dec, time.Now()
	if in.decided(&ad, err) == goOn {
		in.runFrom(&ad, stepHold)
	}
}

// expiryStep: a task whose own deadline has passed ends expired (after the
// sheddable tasks held ahead of it: shedorder.go).
type expiryStep struct{ in *Stage }

func (s expiryStep) admit(ad *admission) verdict {
	if ad.expiry.IsZero() || time.Now().Before(ad.expiry) {
		return goOn
	}
	if s.in.expireAfterShed(&ad.a, ad.msg, ad.expiry) {
		return kept // the hold ends it, after the sheddable tasks of its set
	}
	s.in.expire(&ad.a, ad.msg, ad.expiry, "before it could be dispatched")
	return ended
}

// quotaStep charges a first attempt to its tenant's rate quota (admit).
type quotaStep struct{ in *Stage }

func (s quotaStep) admit(ad *admission) verdict {
	a := &ad.a
	if a.Attempt != 1 || a.admitted || !s.in.Quota.Limited(a.Task.TenantName()) {
		return goOn
	}
	if s.in.admit(a, ad.msg, ad.expiry) {
		return goOn
	}
	return kept // held or rejected over its tenant's quota
}

// decideStep asks the policy engine for the model and the node.
type decideStep struct{ in *Stage }

func (s decideStep) admit(ad *admission) verdict {
	in := s.in
	in.standing(ad)
	ad.table = in.Tables.Table()
	t := &ad.a.Task
	span := in.Tracer.Start(ad.a.Traceparent, "mlsched.decision")
	start := time.Now()
	dec, err := in.Engine.Decide(ad.table, &ad.req)
	ad.dec, ad.decided = dec, time.Now() // also the deadline's start: one clock read fewer per task
	in.Metrics.Decision(ad.decided.Sub(start).Seconds())
	if in.Tracer.On() {
		span.SetAttributes(attribute.String("mlsched.task_id", t.ID), attribute.String("mlsched.type", t.Type),
			attribute.Int("mlsched.attempt", ad.a.Attempt), attribute.String("mlsched.model", dec.Model),
			attribute.String("mlsched.node", dec.Node), attribute.Bool("mlsched.panic", dec.Panic))
	}
	span.End(err)
	return in.decided(ad, err)
}

// standing sets the attempt's candidate set and policy request, with its
// standing in the hold: a task that goes first in flow control's order
// (the first urgent one, or a quiet tenant's) overtakes the held ones, and
// a node that orders its queue starts it next: it need not wait for the
// queue target (docs/policies.md, "Ordering at the node").
func (in *Stage) standing(ad *admission) {
	t := &ad.a.Task
	ad.key = ""
	if in.held.any() {
		ad.key = candidateKey(t)
	}
	ad.req = in.request(&ad.a)
	ad.req.Ahead = ad.key != "" && in.held.leads(ad.key, t.Priority, t.TenantName(), ad.a.fromHold)
	ad.req.AheadInBand = ad.req.Ahead && in.held.bandHeld(ad.key, t.Priority)
}

// decided handles the engine's error: a type no live node serves waits for
// one, bounded (unserved.go); any other error ends the attempt.
func (in *Stage) decided(ad *admission, err error) verdict {
	if err == nil {
		return goOn
	}
	a, t := &ad.a, &ad.a.Task
	code := protocol.CodeOf(err)
	if code == protocol.CodeNoModel || code == protocol.CodeUnknownModel {
		// Nodes may be starting or restarting: wait, bounded, then
		// reject; at once when the only candidates are unready models.
		if why := unreadyOnly(in.Reg.Live(), t.Type, t.Models); why != "" {
			err = protocol.Errorf(code, "%s: %s", err.(*protocol.Error).Msg, why)
		} else if !a.noNodeSince.IsZero() && time.Since(a.noNodeSince) >= in.Config.NoNodeWait {
			err = protocol.Errorf(code, "%s (waited %s for a node)", err.(*protocol.Error).Msg, in.Config.NoNodeWait)
		} else if err = in.waitForNode(*a, ad.msg, err); err == nil {
			return kept // bounded, so that no type stalls the others (unserved.go)
		}
	}
	status := protocol.StatusRejected
	if a.Attempt > 1 {
		status = protocol.StatusFailed
	}
	in.Log.Warn().Err(err).Str("task_id", t.ID).Int("attempt", a.Attempt).Msg("no model for task")
	in.Fin.End(a.Ends(ad.msg, err, status))
	return ended
}

// holdStep is backpressure (hold.go), and no overtaking: while a task of
// this candidate set is held with a priority at least this one's (higher,
// for a task the hold sends on, or one that goes first), this one waits
// behind it.
type holdStep struct{ in *Stage }

func (s holdStep) admit(ad *admission) verdict {
	in, t, key := s.in, &ad.a.Task, ad.key
	if (ad.dec.Saturated || (key != "" && in.held.heldAtLeast(key, t.Priority, ad.a.fromHold || ad.req.Ahead))) &&
		in.hold(ad.a, ad.msg, ad.dec, in.holdWait(&ad.a), ad.expiry) {
		if !ad.dec.Saturated {
			in.held.wake() // a slot is free: the hold sends on what goes first
		}
		return kept
	}
	if key != "" && in.held.heldAtLeast(key, t.Priority, true) {
		// A higher-priority task of the set was held since this one's
		// check (by another goroutine, decided at the same moment): this
		// one waits behind it, and the pass sends that one first.
		if in.hold(ad.a, ad.msg, ad.dec, in.holdWait(&ad.a), ad.expiry) {
			in.held.wake()
			return kept
		}
		in.Counters.Inversions.Add(1) // only when the hold is closed: it must stay 0
	}
	if key != "" && !ad.req.Ahead {
		in.held.sentPlain(key, t.Priority)
	}
	if ad.dec.Panic {
		in.Counters.Panic.Add(1)
		in.Log.Warn().Str("task_id", t.ID).Str("model", ad.dec.Model).Str("node", ad.dec.Node).
			Msg("panic mode: every candidate's breaker is open, routing anyway")
	}
	in.deadline(ad)
	return goOn
}

// deadline sets the attempt's timeout (attemptTimeout, the one rule) and
// deadline for the decided model: the worker does not start an attempt
// past its deadline, nor, then, a task past its own.
func (in *Stage) deadline(ad *admission) {
	ad.timeout = in.attemptTimeout(&ad.a.Task, ad.dec.Model)
	ad.deadline = ad.decided.Add(ad.timeout + in.Config.DeadlineSlack)
	if !ad.expiry.IsZero() && ad.expiry.Before(ad.deadline) {
		ad.deadline = ad.expiry
	}
	ad.cost, ad.priced = in.Reg.Cost(ad.dec.Node, ad.dec.Model, ad.a.Task.Size)
}

// capStep counts the attempt against its tenant's concurrency cap until
// its deadline (acquire).
type capStep struct{ in *Stage }

func (s capStep) admit(ad *admission) verdict {
	if !s.in.Quota.Capped(ad.a.Task.TenantName()) || s.in.acquire(&ad.a, ad.msg, ad.deadline, ad.expiry) {
		return goOn
	}
	return kept // held or rejected over its tenant's concurrency cap
}

// budgetStep charges the attempt's cost to its tenant's and type's
// budgets (spend); over one that degrades, the cheapest model that clears
// the type's bar (the cost policy) goes instead, charged past the limit.
type budgetStep struct{ in *Stage }

func (s budgetStep) admit(ad *admission) verdict {
	in, t := s.in, &ad.a.Task
	if in.Budgets.Limited(t.TenantName(), t.Type) {
		goes, degrade := in.spend(&ad.a, ad.msg, ad.cost)
		if !goes {
			return ended // refused over its tenant's or type's budget
		}
		if degrade {
			creq := ad.req
			creq.Cheapest = true
			if cheap, err := in.Engine.Decide(ad.table, &creq); err == nil && !cheap.Saturated && cheap.Model != ad.dec.Model {
				ad.dec = cheap
				in.deadline(ad)
			}
			in.Budgets.Charge(context.Background(), t.TenantName(), t.Type, ad.cost, true)
		}
	}
	if ad.priced {
		in.Metrics.Spent(t.Type, t.TenantName(), ad.dec.Model, ad.cost)
	}
	return goOn
}

// publishStep seals the dispatch and publishes it on the node's subject.
// Publish-then-ack: the message is settled on the publisher's reply
// goroutine once JetStream has stored the dispatch (or refused it); the
// task itself is not acked then but kept until its result is
// (the Keeper).
type publishStep struct{ in *Stage }

func (s publishStep) admit(ad *admission) verdict {
	in, a, t, dec := s.in, &ad.a, &ad.a.Task, ad.dec
	pd := protocol.Dispatch{TaskID: t.ID, Type: t.Type, Model: dec.Model, Node: dec.Node,
		Attempt: a.Attempt, MaxAttempts: a.MaxAttemptsOr(in.Config.MaxAttempts), Deadline: ad.deadline, Timeout: ad.timeout,
		Submitted: a.Submitted, Submission: a.Submission, History: a.History, TaskAck: a.TaskAck, Pipeline: a.Pipe}
	span := in.Tracer.Start(a.Traceparent, "mlsched.dispatch")
	pd.Traceparent = span.Traceparent() // the worker's spans are children of the dispatch
	if in.Tracer.On() {
		span.SetAttributes(attribute.String("mlsched.task_id", t.ID), attribute.Int("mlsched.attempt", a.Attempt),
			attribute.String("mlsched.model", dec.Model), attribute.String("mlsched.node", dec.Node))
	}
	in.seal(&pd, a.Data)
	hb := headerBufs.Get().(*protocol.HeaderBuf)
	defer headerBufs.Put(hb) // once Publish has returned: nats.go has encoded the headers
	var h nats.Header
	if in.Reg.CompactDispatch(dec.Node) { // one header instead of fourteen (protocol/compact.go)
		h = pd.CompactHeaderInto(hb)
	} else {
		h = pd.HeaderInto(hb)
	}
	out := &nats.Msg{Subject: topology.DispatchSubject(dec.Node), Data: a.Data, Header: h}
	hb.Put(protocol.HdrMsgID, pd.MsgID("d"))
	ad.table.Dispatched(dec.Model, dec.Node)
	settled := in.Keeper.Dispatched(ad.msg, a.TaskAck, ad.deadline, Record{Task: t.ID, Type: t.Type, Submission: a.Submission,
		Attempt: a.Attempt, MaxAttempts: pd.MaxAttempts, Model: dec.Model, Node: dec.Node, History: a.History})
	stored := in.dispatchStored(t.ID, a.Attempt, dec.Model, dec.Node, bandName(t.Priority), a.Submitted, span)
	if err := in.Complete.Publish(context.Background(), in.Pub, settled, out, "", stored); err != nil {
		ad.table.Completed(dec.Model, dec.Node) // not sent after all
		in.Log.Warn().Err(err).Str("task_id", t.ID).Str("model", dec.Model).Str("node", dec.Node).Msg("dispatch publish failed, will retry")
		span.End(err)
		in.Keeper.Keep(ad.msg, a.TaskAck, time.Now().Add(time.Second+in.Config.AckWait)) // a retry's task stays in progress
		in.Complete.Retry(ad.msg, time.Second)
	}
	return ended
}

// dispatchStored is the callback of a dispatch's acknowledgement: a stored
// dispatch (not a duplicate) is counted, its wait observed by band.
func (in *Stage) dispatchStored(id string, attempt int, model, node, band string, submitted time.Time, span tracing.Span) func(*jetstream.PubAck, error) error {
	return func(ack *jetstream.PubAck, err error) error {
		span.End(err)
		if err != nil {
			in.Log.Warn().Err(err).Str("task_id", id).Str("model", model).Str("node", node).Msg("dispatch not acknowledged, will retry")
			return err
		}
		if !ack.Duplicate {
			now := time.Now()
			in.drain.dispatched(now)
			in.Batch.Add(stats.Event{Model: model, Node: node, Kind: stats.KindDispatched})
			if attempt > 1 {
				in.Counters.Redispatched.Add(1)
			} else {
				in.Counters.Dispatched.Add(1)
				in.Metrics.Admitted(band)
				in.Metrics.Waited(band, now.Sub(submitted).Seconds())
			}
		}
		in.Log.Debug().Str("task_id", id).Str("model", model).Str("node", node).Int("attempt", attempt).Msg("dispatched")
		return nil
	}
}

// seal makes a dispatch verifiable when its outcome comes back.
func (in *Stage) seal(pd *protocol.Dispatch, task []byte) {
	pd.TaskSum = protocol.TaskSum(task)
	pd.Seal = in.Sealer.Seal(pd)
}

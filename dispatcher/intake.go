package dispatcher

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"

	"github.com/mlsched/mlsched/shared/policy"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/stats"
	"github.com/mlsched/mlsched/shared/topology"
)

// handleTask is the intake: one message of MLSCHED_TASKS.
func (d *Dispatcher) handleTask(msg jetstream.Msg) {
	data := msg.Data()
	submitted, submission, first := time.Now(), "", true
	if meta, err := msg.Metadata(); err == nil {
		submitted, submission = meta.Timestamp, strconv.FormatUint(meta.Sequence.Stream, 10)
		first = meta.NumDelivered == 1
	}
	task, err := protocol.DecodeTask(data, d.cfg.Limits())
	if err == nil {
		if subj := strings.TrimPrefix(msg.Subject(), "mlsched.tasks."); subj != task.Type {
			err = protocol.Errorf(protocol.CodeTypeMismatch, "task of type %q was published on %s; publish it on %s",
				task.Type, msg.Subject(), topology.TaskSubject(task.Type))
		}
	}
	if first { // a task waiting for a node is redelivered: count it once
		typ := task.Type
		if err != nil {
			typ = "invalid"
		}
		d.metrics.received.Get(typ).Inc()
	}
	if err != nil {
		d.log.Warn().Err(err).Str("task_id", task.ID).Str("subject", msg.Subject()).Msg("task rejected")
		d.reject(msg, ending{subject: msg.Subject(), data: data, task: task, err: err, status: protocol.StatusRejected,
			submitted: submitted, submission: submission, traceparent: protocol.TraceparentOf(msg.Headers())})
		return
	}
	if d.superseded.Cancelled(task.ID, submission) { // cancelled while it waited: it has its result
		_ = msg.Ack()
		return
	}
	d.dispatch(attemptSpec{task: task, data: data, attempt: 1, submitted: submitted, submission: submission,
		traceparent: protocol.TraceparentOf(msg.Headers())}, msg)
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
}

func (a *attemptSpec) maxAttempts(def int) int {
	if a.task.MaxAttempts > 0 {
		return a.task.MaxAttempts
	}
	return def
}

// dispatch decides and publishes one attempt; msg (a task or an outcome) is
// settled once JetStream has acknowledged the dispatch.
func (d *Dispatcher) dispatch(a attemptSpec, msg jetstream.Msg) {
	t := &a.task
	req := d.request(&a)
	table := d.snaps.table.Load()
	decision := d.tracer.Start(a.traceparent, "mlsched.decision")
	start := time.Now()
	dec, err := d.engine.Decide(table, &req)
	d.metrics.decision.Observe(time.Since(start).Seconds())
	if d.tracer.On() {
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
			if why := unreadyOnly(d.reg.Live(), t.Type, t.Models); why != "" {
				err = protocol.Errorf(code, "%s: %s", err.(*protocol.Error).Msg, why)
			} else if time.Since(a.submitted) >= d.cfg.NoNodeWait {
				err = protocol.Errorf(code, "%s (waited %s for a node)", err.(*protocol.Error).Msg, d.cfg.NoNodeWait)
			} else if err = d.waitForNode(a, msg, err); err == nil {
				return // bounded, so that no type stalls the others (unserved.go)
			}
		}
		status := protocol.StatusRejected
		if a.attempt > 1 {
			status = protocol.StatusFailed
		}
		d.log.Warn().Err(err).Str("task_id", t.ID).Int("attempt", a.attempt).Msg("no model for task")
		d.reject(msg, ending{subject: topology.TaskSubject(t.Type), data: a.data, task: a.task, err: err, status: status,
			history: a.history, attempts: a.attempt - 1, submitted: a.submitted, submission: a.submission,
			traceparent: a.traceparent})
		return
	}
	if dec.Saturated && d.hold(a, msg, dec, req.Deadline) {
		return // backpressure (hold.go)
	}
	if dec.Panic {
		d.counters.Panic.Add(1)
		d.log.Warn().Str("task_id", t.ID).Str("model", dec.Model).Str("node", dec.Node).
			Msg("panic mode: every candidate's breaker is open, routing anyway")
	}
	timeout := time.Duration(t.TimeoutMs) * time.Millisecond
	if timeout <= 0 {
		timeout = d.modelTimeout(dec.Model)
	}
	deadline := time.Now().Add(timeout + d.cfg.DeadlineSlack)
	pd := protocol.Dispatch{TaskID: t.ID, Type: t.Type, Model: dec.Model, Node: dec.Node,
		Attempt: a.attempt, MaxAttempts: a.maxAttempts(d.cfg.MaxAttempts), Deadline: deadline, Timeout: timeout,
		Submitted: a.submitted, Submission: a.submission, History: a.history}
	span := d.tracer.Start(a.traceparent, "mlsched.dispatch")
	pd.Traceparent = span.Traceparent() // the worker's spans are children of the dispatch
	if d.tracer.On() {
		span.SetAttributes(attribute.String("mlsched.task_id", t.ID), attribute.Int("mlsched.attempt", a.attempt),
			attribute.String("mlsched.model", dec.Model), attribute.String("mlsched.node", dec.Node))
	}
	d.seal(&pd, a.data)
	hb := headerBufs.Get().(*protocol.HeaderBuf)
	defer headerBufs.Put(hb) // once Publish has returned: nats.go has encoded the headers
	var h nats.Header
	if d.reg.CompactDispatch(dec.Node) { // one header instead of fourteen (protocol/compact.go)
		h = pd.CompactHeaderInto(hb)
	} else {
		h = pd.HeaderInto(hb)
	}
	out := &nats.Msg{Subject: topology.DispatchSubject(dec.Node), Data: a.data, Header: h}
	hb.Put(protocol.HdrMsgID, pd.MsgID("d"))
	id, attempt := t.ID, a.attempt
	model, node, redispatch := dec.Model, dec.Node, a.attempt > 1
	table.Dispatched(dec.Model, dec.Node)
	// Publish-then-ack: msg is settled on the publisher's reply goroutine
	// once JetStream has stored the dispatch (or refused it).
	err = d.pub.Publish(context.Background(), out, "", func(ack *jetstream.PubAck, err error) {
		span.End(err)
		if err != nil {
			d.log.Warn().Err(err).Str("task_id", id).Str("model", model).Str("node", node).Msg("dispatch not acknowledged, will retry")
			d.settler.Settle(msg, err)
			return
		}
		if !ack.Duplicate {
			d.batch.Add(stats.Event{Model: model, Node: node, Kind: stats.KindDispatched})
			if redispatch {
				d.counters.Redispatched.Add(1)
			} else {
				d.counters.Dispatched.Add(1)
			}
		}
		d.log.Debug().Str("task_id", id).Str("model", model).Str("node", node).Int("attempt", attempt).Msg("dispatched")
		d.settler.Settle(msg, nil)
	})
	if err != nil {
		table.Completed(dec.Model, dec.Node) // not sent after all
		d.log.Warn().Err(err).Str("task_id", id).Str("model", dec.Model).Str("node", dec.Node).Msg("dispatch publish failed, will retry")
		span.End(err)
		_ = msg.NakWithDelay(time.Second)
	}
}

// headerBufs holds the header storage of dispatches being published
// (the map and values of ~14 headers: most of a dispatch's allocations).
var headerBufs = sync.Pool{New: func() any { return new(protocol.HeaderBuf) }}

// request is what the policy engine needs to decide an attempt: the task's
// constraints and history, and the attempt's timeout and deadline for the
// load model.
func (d *Dispatcher) request(a *attemptSpec) policy.Request {
	t := &a.task
	timeout := time.Duration(t.TimeoutMs) * time.Millisecond
	if timeout <= 0 {
		timeout = d.cfg.TaskTimeout
	}
	return policy.Request{Type: t.Type, Models: t.Models, MaxLatencyMs: t.MaxLatencyMs,
		MinSuccessRate: t.MinSuccessRate, Tried: a.history, Timeout: timeout, Deadline: timeout + d.cfg.DeadlineSlack}
}

func (d *Dispatcher) modelTimeout(model string) time.Duration {
	if m := d.snaps.timeouts.Load(); m != nil {
		if ms, ok := (*m)[model]; ok && ms > 0 {
			return time.Duration(ms) * time.Millisecond
		}
	}
	return d.cfg.TaskTimeout
}

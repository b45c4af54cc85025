package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/shared/opshttp"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// publishResult publishes a task's final result. JetStream refuses it when
// the task already has one (expected last subject sequence 0), which is what
// makes the result final: a duplicate delivery, a racing replica or a late
// outcome cannot publish a second or changed result. settle runs once the
// result is stored or refused; when then is set it runs first, off the
// settle loop (it may publish), told whether this result was the one stored,
// and its error goes to settle.
func (d *Dispatcher) publishResult(res *protocol.Result, settle func(error), then func(stored bool) error) {
	res.FinishedAt = time.Now().UTC()
	data, err := json.Marshal(res)
	if err != nil { // cannot happen with our types; never drop the message
		settle(err)
		return
	}
	m := &nats.Msg{Subject: topology.ResultSubject(res.ID), Data: data, Header: protocol.ResultHeader(res.ID)}
	// No Nats-Msg-Id: the expected sequence alone refuses a retried publish
	// that was in fact stored, and an id would outlive a purged result inside
	// the duplicate window, swallowing the result of a replayed task.
	fut, err := d.js.PublishMsgAsync(m, jetstream.WithExpectLastSequencePerSubject(0))
	if err != nil {
		settle(err)
		return
	}
	id, status, model, node, typ, latency := res.ID, res.Status, res.Model, res.Node, res.Type, res.LatencyMs
	finish := func(stored bool) {
		if then == nil {
			settle(nil)
			return
		}
		d.wg.Add(1)
		go func() { defer d.wg.Done(); settle(then(stored)) }()
	}
	d.pending <- pendingAck{fut: fut, done: func(ack *jetstream.PubAck, err error) {
		switch {
		case isWrongLastSequence(err), err == nil && ack.Duplicate:
			d.counters.Suppressed.Add(1)
			d.log.Info().Str("task_id", id).Str("model", model).Str("node", node).Msg("task already has a final result: suppressed a second one")
			finish(false)
		case err != nil:
			d.log.Warn().Err(err).Str("task_id", id).Msg("result publish failed, will retry")
			settle(err)
		default:
			d.counters.Results.Add(1)
			d.metrics.results.Get(opshttp.L2{A: typ, B: string(status)}).Inc()
			if latency > 0 {
				d.metrics.taskDur.Get(typ).Observe(latency / 1000)
			}
			if status == protocol.StatusRejected {
				d.counters.Rejected.Add(1)
			}
			d.log.Debug().Str("task_id", id).Str("model", model).Str("node", node).Str("status", string(status)).Msg("result published")
			finish(true)
		}
	}}
}

func isWrongLastSequence(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
	}
	return false
}

// ending is a task that ends without a success: rejected before it ran, or
// failed after its attempts.
type ending struct {
	subject string // where the task was submitted
	data    []byte // its original bytes
	task    protocol.Task
	err     error // why it ends (a *protocol.Error carries the code)
	status  protocol.Status
	history []protocol.Attempt
	// attempts made; submitted and submission as in attemptSpec.
	attempts   int
	submitted  time.Time
	submission string
}

// reject ends a task that cannot run or succeed: a keyed task gets a result
// with the error; an unkeyable message (no usable id) goes to the
// dead-letter stream with its original bytes, and so does, besides its
// result, a task that exhausted its attempts.
func (d *Dispatcher) reject(e ending, settle func(error)) {
	code := protocol.CodeOf(e.err)
	if e.task.ID == "" {
		d.deadLetter("invalid", protocol.DeadLetter{Reason: e.err.Error(), Code: code, Subject: e.subject,
			Original: e.data}, "", settle)
		return
	}
	res := &protocol.Result{ID: e.task.ID, Type: e.task.Type, Status: e.status, Attempts: e.attempts,
		Error: e.err.Error(), ErrorCode: code, History: e.history, LatencyMs: msSince(e.submitted)}
	var then func(stored bool) error
	if e.status == protocol.StatusFailed && code == protocol.CodeAttemptsExhausted {
		// Keep the task for an operator to inspect and replay, but only if
		// this failure is the task's result: a racing attempt may have
		// succeeded. On a redelivery our result may already be stored, so a
		// refused publish looks at what is stored (the entry's Nats-Msg-Id
		// makes a second write harmless).
		dl := protocol.DeadLetter{Reason: res.Error, Code: code, Subject: e.subject,
			TaskID: e.task.ID, History: e.history, Original: e.data}
		then = func(stored bool) error {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if !stored {
				if ours, err := d.storedResultIs(ctx, res.ID, protocol.StatusFailed, code); err != nil || !ours {
					return err
				}
			}
			return d.deadLetterSync(ctx, "exhausted", dl, e.submission)
		}
	}
	d.publishResult(res, settle, then)
}

// storedResultIs reports whether the task's stored result has that status
// and error code.
func (d *Dispatcher) storedResultIs(ctx context.Context, id string, status protocol.Status, code protocol.Code) (bool, error) {
	m, err := d.resultsStream.GetLastMsgForSubject(ctx, topology.ResultSubject(id))
	if err != nil {
		return false, err
	}
	var r protocol.Result
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return false, nil
	}
	return r.Status == status && r.ErrorCode == code, nil
}

// deadLetterMsg builds an entry of MLSCHED_DLQ under mlsched.dlq.<kind>; an
// entry about a task is deduplicated per submission of it.
func deadLetterMsg(kind string, dl protocol.DeadLetter, submission string) (*nats.Msg, []jetstream.PublishOpt, error) {
	dl.At = time.Now().UTC()
	data, err := json.Marshal(dl)
	if err != nil {
		return nil, nil, err
	}
	var opts []jetstream.PublishOpt
	if dl.TaskID != "" {
		opts = append(opts, jetstream.WithMsgID(protocol.MsgID("x", dl.TaskID, submission, 0)+":"+kind))
	}
	return &nats.Msg{Subject: topology.DLQSubject(kind), Data: data}, opts, nil
}

// deadLetter stores an entry asynchronously; settle runs once it is stored.
func (d *Dispatcher) deadLetter(kind string, dl protocol.DeadLetter, submission string, settle func(error)) {
	m, opts, err := deadLetterMsg(kind, dl, submission)
	if err != nil {
		settle(err)
		return
	}
	fut, err := d.js.PublishMsgAsync(m, opts...)
	if err != nil {
		settle(err)
		return
	}
	d.pending <- pendingAck{fut: fut, done: func(ack *jetstream.PubAck, err error) {
		if err == nil {
			d.deadLettered(kind, dl, ack)
		}
		settle(err)
	}}
}

// deadLetterSync stores an entry and waits for it.
func (d *Dispatcher) deadLetterSync(ctx context.Context, kind string, dl protocol.DeadLetter, submission string) error {
	m, opts, err := deadLetterMsg(kind, dl, submission)
	if err != nil {
		return err
	}
	ack, err := d.js.PublishMsg(ctx, m, opts...)
	if err == nil {
		d.deadLettered(kind, dl, ack)
	}
	return err
}

func (d *Dispatcher) deadLettered(kind string, dl protocol.DeadLetter, ack *jetstream.PubAck) {
	if !ack.Duplicate {
		d.counters.DeadLettered.Add(1)
		d.metrics.dead.Get(kind).Inc()
		d.log.Warn().Str("task_id", dl.TaskID).Str("code", string(dl.Code)).Str("reason", dl.Reason).Msg("dead-lettered")
	}
}

func msSince(t time.Time) float64 {
	if t.IsZero() {
		return 0
	}
	return float64(time.Since(t).Microseconds()) / 1000
}

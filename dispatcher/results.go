package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"

	"github.com/mlsched/mlsched/shared/opshttp"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
	"github.com/mlsched/mlsched/shared/tracing"
)

// resultMsg is a task's final result message. JetStream refuses it when
// the task already has one (expected last subject sequence 0), which is
// what makes the result final: a duplicate delivery, a racing replica or a
// late outcome cannot publish a second or changed result. resultStored
// reads the acknowledgement. The result's headers carry the task's W3C
// traceparent, so that whoever reads the result continues its trace.
func (d *Dispatcher) resultMsg(res *protocol.Result, traceparent string) (*nats.Msg, error) {
	res.FinishedAt = time.Now().UTC()
	// json.Marshal's bytes, without reflection.
	data, err := res.AppendJSON(make([]byte, 0, 320+len(res.Output)))
	if err != nil { // cannot happen with our types; never drop the message
		return nil, err
	}
	h := protocol.ResultHeader(res.ID, traceparent)
	// No Nats-Msg-Id: the expected sequence alone refuses a retried publish
	// that was in fact stored, and an id would outlive a purged result inside
	// the duplicate window, swallowing the result of a replayed task.
	h[jetstream.ExpectedLastSubjSeqHeader] = []string{"0"}
	return &nats.Msg{Subject: topology.ResultSubject(res.ID), Data: data, Header: h}, nil
}

// resultStored reads a result publish's acknowledgement: stored (this is
// the task's result), refused because the task already had one (nil error,
// not stored), or an error (to retry).
func (d *Dispatcher) resultStored(res *protocol.Result, ack *jetstream.PubAck, err error) (bool, error) {
	switch {
	case isWrongLastSequence(err), err == nil && ack.Duplicate:
		d.counters.Suppressed.Add(1)
		d.log.Info().Str("task_id", res.ID).Str("model", res.Model).Str("node", res.Node).Msg("task already has a final result: suppressed a second one")
		return false, nil
	case err != nil:
		d.log.Warn().Err(err).Str("task_id", res.ID).Msg("result publish failed, will retry")
		return false, err
	}
	d.counters.Results.Add(1)
	d.metrics.results.Get(opshttp.L2{A: res.Type, B: string(res.Status)}).Inc()
	if res.LatencyMs > 0 {
		d.metrics.taskDur.Get(res.Type).Observe(res.LatencyMs / 1000)
	}
	switch res.Status {
	case protocol.StatusRejected:
		d.counters.Rejected.Add(1)
	case protocol.StatusSucceeded:
		d.counters.Succeeded.Add(1)
	case protocol.StatusFailed:
		d.counters.Failed.Add(1)
		if res.ErrorCode == protocol.CodeSaturated {
			d.counters.Shed.Add(1)
		}
	}
	d.counters.types.add(res.Type, res.Status)
	d.log.Debug().Str("task_id", res.ID).Str("model", res.Model).Str("node", res.Node).Str("status", string(res.Status)).Msg("result published")
	return true, nil
}

// finish publishes the task's final result, then settles msg: acked once
// the result is stored (or refused as a second one), on the publisher's
// reply goroutine, with no future or settling goroutine in between.
// traceparent is the task's trace context ("" for none); with tracing on, a
// result span covers the publish.
func (d *Dispatcher) finish(msg jetstream.Msg, res *protocol.Result, traceparent string) {
	span := d.resultSpan(res, traceparent)
	m, err := d.resultMsg(res, span.Traceparent())
	if err == nil {
		err = d.resPub.Publish(context.Background(), m, "", func(ack *jetstream.PubAck, err error) {
			_, err = d.resultStored(res, ack, err)
			span.End(err)
			d.settler.Settle(msg, err)
		})
	}
	if err != nil {
		d.log.Warn().Err(err).Str("task_id", res.ID).Msg("result publish failed, will retry")
		span.End(err)
		d.settler.Settle(msg, err)
	}
}

// resultSpan starts the result span of a task (a no-op with tracing off).
func (d *Dispatcher) resultSpan(res *protocol.Result, traceparent string) tracing.Span {
	if !d.tracer.On() {
		return d.tracer.Start(traceparent, "")
	}
	return d.tracer.Start(traceparent, "mlsched.result", attribute.String("mlsched.task_id", res.ID),
		attribute.String("mlsched.status", string(res.Status)), attribute.Int("mlsched.attempts", res.Attempts))
}

// failExhausted publishes the failed result of a task that exhausted its
// attempts and keeps the task in the dead-letter stream for an operator to
// inspect and replay, then settles msg. The dead letter is written only if
// this failure is the task's result (a racing attempt may have succeeded);
// on a redelivery our result may already be stored, so a refused publish
// looks at what is stored, and the entry's id makes a second write harmless.
func (d *Dispatcher) failExhausted(msg jetstream.Msg, res *protocol.Result, dl protocol.DeadLetter, submission, traceparent string) {
	span := d.resultSpan(res, traceparent)
	m, err := d.resultMsg(res, span.Traceparent())
	var fut jetstream.PubAckFuture
	if err == nil {
		fut, err = d.js.PublishMsgAsync(m)
	}
	if err != nil {
		span.End(err)
		d.settler.Settle(msg, err)
		return
	}
	d.settler.AfterSlow(msg, fut, func(ack *jetstream.PubAck, err error) error {
		stored, err := d.resultStored(res, ack, err)
		span.End(err)
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if !stored {
			if ours, err := d.storedResultIs(ctx, res.ID, res.Status, res.ErrorCode); err != nil || !ours {
				return err
			}
		}
		return d.dlq.Publish(ctx, "exhausted", dl, taskEntry("exhausted", res.ID, submission))
	})
}

// deadLetter stores an entry about msg (which has no task to give a result
// to), then settles msg.
func (d *Dispatcher) deadLetter(msg jetstream.Msg, kind string, dl protocol.DeadLetter) {
	fut, then, err := d.dlq.PublishAsync(kind, dl, messageEntryOf(kind, msg))
	if err != nil {
		d.settler.Settle(msg, err)
		return
	}
	d.settler.After(msg, fut, then)
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
	// traceparent is the task's trace context, carried to the result.
	traceparent string
}

// reject ends a task that cannot run or succeed, then settles msg: a keyed
// task gets a result with the error; an unkeyable message (no usable id)
// goes to the dead-letter stream with its original bytes, and so does,
// besides its result, a task that exhausted its attempts.
func (d *Dispatcher) reject(msg jetstream.Msg, e ending) {
	code := protocol.CodeOf(e.err)
	if e.task.ID == "" {
		d.deadLetter(msg, "invalid", protocol.DeadLetter{Reason: protocol.Message(e.err), Code: code, Subject: e.subject, Original: e.data})
		return
	}
	res := &protocol.Result{ID: e.task.ID, Type: e.task.Type, Status: e.status, Attempts: e.attempts,
		Error: protocol.Message(e.err), ErrorCode: code, History: e.history, LatencyMs: msSince(e.submitted)}
	if e.status == protocol.StatusFailed && (code == protocol.CodeAttemptsExhausted || code == protocol.CodeSaturated) {
		d.failExhausted(msg, res, protocol.DeadLetter{Reason: res.Error, Code: code, Subject: e.subject,
			TaskID: e.task.ID, History: e.history, Original: e.data}, e.submission, e.traceparent)
		return
	}
	d.finish(msg, res, e.traceparent)
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

func msSince(t time.Time) float64 {
	if t.IsZero() {
		return 0
	}
	return float64(time.Since(t).Microseconds()) / 1000
}

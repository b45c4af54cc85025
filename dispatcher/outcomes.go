package dispatcher

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/stats"
	"github.com/mlsched/mlsched/shared/topology"
)

// handleOutcome is one message of MLSCHED_OUTCOMES: a worker's report of an
// attempt, or the sweeper's report of a lost one. The dispatch headers the
// worker echoes carry everything the dispatcher needs, so any replica can
// handle any outcome.
func (d *Dispatcher) handleOutcome(msg jetstream.Msg) {
	data := msg.Data()
	var o protocol.Outcome
	if err := json.Unmarshal(data, &o); err != nil || o.TaskID == "" || o.Status == "" {
		reason := "outcome has no task_id or status"
		if err != nil {
			reason = "outcome is not valid JSON: " + err.Error()
		}
		d.deadLetter("outcome", protocol.DeadLetter{Reason: reason, Code: protocol.CodeMalformedJSON,
			Subject: msg.Subject(), Original: data}, "", settleMsg(msg))
		return
	}
	pd, err := protocol.ParseDispatch(msg.Headers())
	if err != nil {
		// Only a dispatch the dispatcher did not build has bad headers.
		d.deadLetter("outcome", protocol.DeadLetter{Reason: "outcome echoes an invalid dispatch: " + err.Error(),
			Code: protocol.CodeOf(err), Subject: msg.Subject(), Original: data}, "", settleMsg(msg))
		return
	}
	attempt, maxAttempts, submitted, submission := pd.Attempt, pd.MaxAttempts, pd.Submitted, pd.Submission
	history := append(pd.History, protocol.Attempt{Attempt: attempt, Model: o.Model, Node: o.Node,
		Status: o.Status, Error: o.Error, LatencyMs: o.LatencyMs})

	first := true
	if meta, err := msg.Metadata(); err == nil {
		first = meta.NumDelivered == 1
	}
	log := d.log.With().Str("task_id", o.TaskID).Str("model", o.Model).Str("node", o.Node).Int("attempt", attempt).Logger()

	late := (o.Status != protocol.OutcomeLost && d.superseded.Is(o.TaskID, submission, attempt)) ||
		d.superseded.Cancelled(o.TaskID, submission)
	if first {
		d.batch.Add(stats.Event{Model: o.Model, Node: o.Node, Kind: eventKind(o.Status),
			Latency: time.Duration(o.LatencyMs * float64(time.Millisecond)), Late: late})
	}
	if late {
		// The attempt was declared lost and re-dispatched: its outcome counts
		// in the statistics, but the task's result comes from a later attempt.
		d.counters.Late.Add(1)
		log.Info().Str("status", string(o.Status)).Msg("late outcome of a superseded attempt: counted, not final")
		_ = msg.Ack()
		return
	}
	if o.Status == protocol.OutcomeLost {
		if first { // a retried outcome is first nak'ed for backoff, then handled again
			d.counters.Lost.Add(1)
		}
		d.superseded.Mark(o.TaskID, submission, attempt)
	}

	switch o.Status {
	case protocol.OutcomeSuccess:
		log.Debug().Msg("attempt succeeded")
		d.publishResult(&protocol.Result{ID: o.TaskID, Type: o.Type, Status: protocol.StatusSucceeded, Model: o.Model,
			Node: o.Node, Attempts: attempt, Output: o.Output, LatencyMs: msSince(submitted), History: history}, settleMsg(msg), nil)
		return
	case protocol.OutcomeTaskError:
		// Bad input: not the model's fault, and another attempt would fail too.
		log.Info().Str("error", o.Error).Msg("task error: not retried")
		d.publishResult(&protocol.Result{ID: o.TaskID, Type: o.Type, Status: protocol.StatusFailed, Model: o.Model,
			Node: o.Node, Attempts: attempt, Error: o.Error, ErrorCode: protocol.CodeTaskError,
			LatencyMs: msSince(submitted), History: history}, settleMsg(msg), nil)
		return
	}

	// A failed, timed-out, lost or expired attempt.
	var task protocol.Task
	var taskErr error
	if len(o.Task) == 0 {
		taskErr = fmt.Errorf("the outcome carries no task bytes")
	} else {
		task, taskErr = protocol.DecodeTask(o.Task, d.cfg.Limits())
	}
	if attempt < maxAttempts && taskErr == nil {
		if backoff := d.backoff(attempt); first && backoff > 0 && o.Status != protocol.OutcomeExpired {
			_ = msg.NakWithDelay(backoff) // durable backoff: the redelivery re-dispatches
			return
		}
		log.Info().Str("status", string(o.Status)).Str("error", o.Error).Msg("attempt failed, failing over")
		d.dispatch(attemptSpec{task: task, data: o.Task, attempt: attempt + 1, history: history, submitted: submitted,
			submission: submission}, msg)
		return
	}
	err = protocol.Errorf(protocol.CodeAttemptsExhausted, "all %d attempts failed; the last, on model %s node %s, ended %s: %s",
		attempt, o.Model, o.Node, o.Status, o.Error)
	if taskErr != nil && attempt < maxAttempts {
		err = protocol.Errorf(protocol.CodeAttemptsExhausted, "attempt %d on model %s node %s ended %s (%s) and cannot be retried: %v",
			attempt, o.Model, o.Node, o.Status, o.Error, taskErr)
	}
	log.Warn().Err(err).Msg("task failed")
	task.ID, task.Type = o.TaskID, o.Type
	d.reject(ending{subject: topology.TaskSubject(o.Type), data: o.Task, task: task, err: err, status: protocol.StatusFailed,
		history: history, attempts: attempt, submitted: submitted, submission: submission}, settleMsg(msg))
}

func (d *Dispatcher) backoff(attempt int) time.Duration {
	b := d.cfg.RetryBackoff
	for i := 1; i < attempt && b < d.cfg.RetryBackoffMax; i++ {
		b *= 2
	}
	return min(b, d.cfg.RetryBackoffMax)
}

func eventKind(s protocol.OutcomeStatus) stats.Kind {
	switch s {
	case protocol.OutcomeSuccess:
		return stats.KindSuccess
	case protocol.OutcomeTaskError:
		return stats.KindTaskError
	case protocol.OutcomeExpired:
		return stats.KindExpired
	case protocol.OutcomeTimeout, protocol.OutcomeLost:
		return stats.KindTimeout
	default:
		return stats.KindModelError
	}
}

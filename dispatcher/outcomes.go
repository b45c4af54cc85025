package dispatcher

import (
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/shared/jspub"
	"github.com/mlsched/mlsched/shared/opshttp"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/settle"
	"github.com/mlsched/mlsched/shared/stats"
	"github.com/mlsched/mlsched/shared/topology"
)

// handleOutcome is one message of MLSCHED_OUTCOMES: a worker's report of an
// attempt, or the sweeper's report of a lost one. The dispatch headers the
// worker echoes carry everything the dispatcher needs, so any replica can
// handle any outcome.
func (d *Dispatcher) handleOutcome(msg jetstream.Msg) {
	data := msg.Data()
	o, err := protocol.DecodeOutcome(data) // as json.Unmarshal would, in one pass
	if err != nil || o.TaskID == "" || o.Status == "" {
		reason := "outcome has no task_id or status"
		if err != nil {
			reason = "outcome is not valid JSON: " + err.Error()
		}
		d.deadLetter(msg, "outcome", protocol.DeadLetter{Reason: reason, Code: protocol.CodeMalformedJSON,
			Subject: msg.Subject(), Original: data})
		return
	}
	pd, err := protocol.ParseDispatch(msg.Headers())
	if err != nil {
		// Only a dispatch the dispatcher did not build has bad headers:
		// forged, and kept for an operator.
		d.counters.Forged.Add(1)
		d.deadLetter(msg, "outcome", protocol.DeadLetter{Reason: "outcome echoes an invalid dispatch: " + err.Error(),
			Code: protocol.CodeOf(err), Subject: msg.Subject(), Original: data})
		return
	}
	first := true
	if meta, err := msg.Metadata(); err == nil {
		first = meta.NumDelivered == 1
	}
	d.settleOutcome(msg, msg.Subject(), o, pd, first)
}

// settleOutcome acts on a decoded outcome whose dispatch headers parse,
// whether it came from MLSCHED_OUTCOMES or as a direct report (first: this
// is its first delivery; subject: where it was published).
func (d *Dispatcher) settleOutcome(msg jspub.Msg, subject string, o protocol.Outcome, pd protocol.Dispatch, first bool) {
	if err := d.checkOutcome(subject, &o, &pd); err != nil {
		// Counted and ignored: a forged outcome must not touch the task,
		// the statistics or the logs' volume.
		d.counters.Forged.Add(1)
		d.forgedLog.log(&d.log, func(e *zerolog.Event) *zerolog.Event {
			return e.Err(err).Str("subject", subject).Str("task_id", truncateID(o.TaskID))
		}, "outcome refused")
		d.complete.Settle(msg, nil)
		return
	}
	attempt, submitted, submission := pd.Attempt, pd.Submitted, pd.Submission
	history := append(pd.History, protocol.Attempt{Attempt: attempt, Model: o.Model, Node: o.Node,
		Status: o.Status, Error: o.Error, LatencyMs: o.LatencyMs})

	// Built only for a line that is logged: successes are the bulk, and
	// logged at debug level.
	log := func(e *zerolog.Event) *zerolog.Event {
		return e.Str("task_id", o.TaskID).Str("model", o.Model).Str("node", o.Node).Int("attempt", attempt)
	}

	state := settle.State{Redelivered: !first, Cancelled: d.superseded.Cancelled(o.TaskID, submission),
		Superseded: o.Status != protocol.OutcomeLost && d.superseded.Is(o.TaskID, submission, attempt)}
	var task protocol.Task
	if o.Status != protocol.OutcomeSuccess && o.Status != protocol.OutcomeTaskError { // the bytes matter for a retry only
		if len(o.Task) == 0 {
			state.TaskErr = fmt.Errorf("the outcome carries no task bytes")
		} else {
			task, state.TaskErr = protocol.DecodeTask(o.Task, d.cfg.Limits())
		}
	}
	dec := settle.Settle(d.cfg.Retry(), pd, o, state)
	if dec.Record {
		d.metrics.attempts.Get(opshttp.L3{A: o.Model, B: o.Node, C: string(o.Status)}).Inc()
		d.batch.Add(stats.Event{Model: o.Model, Node: o.Node, Kind: dec.Kind,
			Latency: time.Duration(o.LatencyMs * float64(time.Millisecond)), Late: dec.Action == settle.Late})
		d.snaps.table.Load().Completed(o.Model, o.Node) // the slot is free: tell the load model now
		d.held.wake()
	}
	if dec.Supersede {
		if first { // a retried outcome is first nak'ed for backoff, then handled again
			d.counters.Lost.Add(1)
		}
		d.superseded.Mark(o.TaskID, submission, attempt)
	}
	switch dec.Action {
	case settle.Late:
		// The attempt was declared lost and re-dispatched, or the task was
		// cancelled: its outcome counts in the statistics, but the task's
		// result comes from a later attempt or the cancellation.
		d.counters.Late.Add(1)
		log(d.log.Info()).Str("status", string(o.Status)).Msg("late outcome of a superseded attempt: counted, not final")
		d.complete.Settle(msg, nil)
	case settle.Finish:
		if dec.Status == protocol.StatusSucceeded {
			log(d.log.Debug()).Msg("attempt succeeded") // a nil event when debug is off: nothing built
		} else {
			log(d.log.Info()).Str("error", o.Error).Msg("task error: not retried")
		}
		d.finish(msg, &protocol.Result{ID: o.TaskID, Type: o.Type, Status: dec.Status, Model: o.Model,
			Node: o.Node, Attempts: attempt, Output: o.Output, Error: dec.Error, ErrorCode: dec.Code,
			LatencyMs: msSince(submitted), History: history}, pd.Traceparent)
	case settle.Retry:
		if dec.Backoff > 0 {
			d.complete.Retry(msg, dec.Backoff) // durable backoff: the redelivery re-dispatches
			return
		}
		log(d.log.Info()).Str("status", string(o.Status)).Str("error", o.Error).Msg("attempt failed, failing over")
		d.dispatch(attemptSpec{task: task, data: o.Task, attempt: attempt + 1, history: history, submitted: submitted,
			submission: submission, traceparent: pd.Traceparent}, msg)
	default: // settle.DeadLetter
		err := &protocol.Error{Code: dec.Code, Msg: dec.Error}
		log(d.log.Warn()).Err(err).Msg("task failed")
		task.ID, task.Type = o.TaskID, o.Type
		d.reject(msg, ending{subject: topology.TaskSubject(o.Type), data: o.Task, task: task, err: err, status: dec.Status,
			history: history, attempts: attempt, submitted: submitted, submission: submission,
			traceparent: pd.Traceparent})
	}
}

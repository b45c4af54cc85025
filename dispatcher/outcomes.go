package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/dispatcher/internal/settle"
	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/shared/jsplumb"
	"github.com/mlsched/mlsched/shared/lifecycle"
	"github.com/mlsched/mlsched/shared/opshttp"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// outcomes is the stage that acts on what a worker reports: a stored
// outcome of MLSCHED_OUTCOMES or a direct report (below). It checks
// that the outcome answers a dispatch a dispatcher made (trust.go), records
// it in the statistics, and settles it by the rule of dispatcher/internal/settle: the
// final result or a dead letter (through the finisher), a retry (back to
// intake, through retrier), or a late outcome of a superseded attempt,
// which it marks in the superseded set.
type outcomes struct {
	outcomesParams
	forgedLog sometimes // bounded-rate log of refused outcomes
}

// outcomesParams is what the outcome stage needs.
type outcomesParams struct {
	cfg        Config
	log        zerolog.Logger
	nc         *nats.Conn // answers direct reports
	complete   *jsplumb.Completer
	batch      *stats.Batcher
	snaps      *refresher // the load model learns of freed slots
	sealer     *sealer
	superseded *supersededSet
	keeper     *taskKeeper // the task is acked with its result (taskack.go)
	retry      retrier     // failed attempts go back to intake
	fin        *finisher   // results and dead letters
	counters   *Counters
	metrics    *metrics
	rollouts   *rollouts  // counts first attempts of rolling families (rollouts.go); nil: none
	flow       *flowRules // a task past its deadline is not retried
}

func newOutcomes(p outcomesParams) *outcomes {
	oc := &outcomes{outcomesParams: p}
	oc.forgedLog.every = 10 * time.Second
	return oc
}

// handleOutcome is one message of MLSCHED_OUTCOMES: a worker's report of an
// attempt, or the sweeper's report of a lost one. The dispatch headers the
// worker echoes carry everything the dispatcher needs, so any replica can
// handle any outcome.
func (oc *outcomes) handleOutcome(msg jetstream.Msg) {
	data := msg.Data()
	o, err := protocol.DecodeOutcome(data) // as json.Unmarshal would, in one pass
	if err != nil || o.TaskID == "" || o.Status == "" {
		reason := "outcome has no task_id or status"
		if err != nil {
			reason = "outcome is not valid JSON: " + err.Error()
		}
		oc.fin.deadLetter(msg, "outcome", protocol.DeadLetter{Reason: reason, Code: protocol.CodeMalformedJSON,
			Subject: msg.Subject(), Original: data})
		return
	}
	pd, err := protocol.ParseDispatch(msg.Headers())
	if err != nil {
		// Only a dispatch the dispatcher did not build has bad headers:
		// forged, and kept for an operator.
		oc.counters.Forged.Add(1)
		oc.fin.deadLetter(msg, "outcome", protocol.DeadLetter{Reason: "outcome echoes an invalid dispatch: " + err.Error(),
			Code: protocol.CodeOf(err), Subject: msg.Subject(), Original: data})
		return
	}
	first := true
	if meta, err := msg.Metadata(); err == nil {
		first = meta.NumDelivered == 1
	}
	oc.settleOutcome(msg, msg.Subject(), o, pd, first)
}

// settleOutcome acts on a decoded outcome whose dispatch headers parse,
// whether it came from MLSCHED_OUTCOMES or as a direct report (first: this
// is its first delivery; subject: where it was published).
func (oc *outcomes) settleOutcome(msg jsplumb.Msg, subject string, o protocol.Outcome, pd protocol.Dispatch, first bool) {
	if err := oc.checkOutcome(subject, &o, &pd); err != nil {
		// Counted and ignored: a forged outcome must not touch the task,
		// the statistics or the logs' volume.
		oc.counters.Forged.Add(1)
		oc.forgedLog.log(&oc.log, func(e *zerolog.Event) *zerolog.Event {
			return e.Err(err).Str("subject", subject).Str("task_id", truncateID(o.TaskID))
		}, "outcome refused")
		oc.complete.Settle(msg, nil)
		return
	}
	attempt, submitted, submission := pd.Attempt, pd.Submitted, pd.Submission
	history := append(pd.History, protocol.Attempt{Attempt: attempt, Model: o.Model, Node: o.Node,
		Status: o.Status, Error: o.Error, LatencyMs: o.LatencyMs, BatchWaitMs: o.BatchWaitMs, DeadlineLeftMs: o.DeadlineLeftMs})

	// Built only for a line that is logged: successes are the bulk, and
	// logged at debug level.
	log := func(e *zerolog.Event) *zerolog.Event {
		return e.Str("task_id", o.TaskID).Str("model", o.Model).Str("node", o.Node).Int("attempt", attempt)
	}

	state := settle.State{Redelivered: !first, Cancelled: oc.superseded.Cancelled(o.TaskID, submission),
		Superseded: !o.Status.IsLost() && oc.superseded.Is(o.TaskID, submission, attempt)}
	var task protocol.Task
	if o.Status != protocol.OutcomeSuccess && o.Status != protocol.OutcomeTaskError { // the bytes matter for a retry only
		if len(o.Task) == 0 {
			state.TaskErr = fmt.Errorf("the outcome carries no task bytes")
		} else {
			task, state.TaskErr = protocol.DecodeTask(o.Task, oc.cfg.Limits())
		}
		// Past the task's own deadline, or an attempt the node did not
		// start because that deadline (the dispatch's, capped at it; ms on
		// the wire) left too little time for the model's run: retrying it
		// would only meet the same deadline, and end attempts_exhausted.
		if exp := oc.flow.expiry(&task, submitted); state.TaskErr == nil && !exp.IsZero() &&
			(!time.Now().Before(exp) || o.Status == protocol.OutcomeExpired && !pd.Deadline.Before(exp.Add(-time.Millisecond))) {
			state.Expired = true
			oc.counters.Expired.Add(1)
		}
	}
	// next is the attempt after this one: the retry, or (named by the
	// outcome) what ends the task, whose ending counts this attempt (ends).
	next := attemptSpec{task: task, data: o.Task, attempt: attempt + 1, history: history, submitted: submitted,
		submission: submission, traceparent: pd.Traceparent, taskAck: taskAckFor(&pd), pipe: pd.Pipeline}
	oc.retryStep(&next) // a pipeline step's constraints (pipeline.go)
	dec := settle.Settle(oc.cfg.Retry(), pd, o, state)
	if dec.Record {
		oc.metrics.attempts.Get(opshttp.L3{A: o.Model, B: o.Node, C: string(o.Status)}).Inc()
		oc.batch.Add(stats.Event{Model: o.Model, Node: o.Node, Kind: dec.Kind,
			Latency: time.Duration(o.LatencyMs * float64(time.Millisecond)), Late: dec.Action == settle.Late})
		oc.snaps.table.Load().Completed(o.Model, o.Node) // the slot is free: tell the load model now
		oc.rollouts.observe(o.Model, dec.Kind, attempt)
		oc.retry.wake()
	}
	if dec.Supersede {
		if first { // a retried outcome is first nak'ed for backoff, then handled again
			oc.counters.Lost.Add(1)
		}
		oc.superseded.Mark(o.TaskID, submission, attempt)
	}
	switch dec.Action {
	case settle.Late:
		// The attempt was declared lost and re-dispatched, or the task was
		// cancelled: its outcome counts in the statistics, but the task's
		// result comes from a later attempt or the cancellation.
		oc.counters.Late.Add(1)
		log(oc.log.Info()).Str("status", string(o.Status)).Msg("late outcome of a superseded attempt: counted, not final")
		if state.Cancelled { // the cancellation stored the task's result
			next.task.ID, next.task.Type = o.TaskID, o.Type
			oc.fin.end(next.endsStored(msg))
			return
		}
		oc.complete.Settle(msg, nil)
	case settle.Finish:
		if dec.Status == protocol.StatusSucceeded {
			log(oc.log.Debug()).Msg("attempt succeeded") // a nil event when debug is off: nothing built
		} else {
			log(oc.log.Info()).Str("error", o.Error).Msg("task error: not retried")
		}
		next.task.ID, next.task.Type = o.TaskID, o.Type
		e := next.ends(msg, nil, dec.Status)
		e.result = &protocol.Result{ID: o.TaskID, Type: o.Type, Status: dec.Status, Model: o.Model,
			Node: o.Node, Attempts: attempt, Output: o.Output, Error: dec.Error, ErrorCode: dec.Code,
			LatencyMs: msSince(submitted), History: history}
		oc.fin.end(e)
	case settle.Retry:
		if dec.Backoff > 0 {
			// Durable backoff: the redelivery re-dispatches. The task stays
			// in progress meanwhile (its attempt's keeping ended with it).
			oc.keeper.keep(msg, next.taskAck, time.Now().Add(dec.Backoff+oc.cfg.AckWait))
			oc.complete.Retry(msg, dec.Backoff)
			return
		}
		log(oc.log.Info()).Str("status", string(o.Status)).Str("error", o.Error).Msg("attempt failed, failing over")
		oc.retry.dispatch(next, msg)
	default: // settle.DeadLetter
		err := &protocol.Error{Code: dec.Code, Msg: dec.Error}
		log(oc.log.Warn()).Err(err).Msg("task failed")
		next.task.ID, next.task.Type = o.TaskID, o.Type
		oc.fin.end(next.ends(msg, err, dec.Status))
	}
}

// Direct reports (docs/protocol.md): a worker sends a successful outcome as
// a core-NATS request on mlsched.report.<node>, to one dispatcher replica of
// the queue group. The replica settles it exactly as it settles a stored
// outcome (same checks, same settle rules, same publish-then-ack), and its
// "ack" is the answer to the request, sent once the task's result is
// stored: only then does the worker ack its dispatch, so the dispatch stays
// the record of the attempt until the result exists, as with a stored
// outcome. Whatever cannot be settled at once (not a success, headers that
// do not parse, a failed result publish) is answered ReportDeferred, and
// the worker stores the outcome in MLSCHED_OUTCOMES instead, where the
// usual path handles it. A lost answer (a replica killed mid-report) costs
// the worker a timeout, then the same fallback; the result's expected
// sequence refuses the second result.
//
// This saves, per task, the outcome's store, its delivery to a consumer and
// its removal: three stored messages per task instead of four.

// deferredReply answers what the stored path must handle.
var deferredReply = protocol.ReportReply{Status: protocol.ReportDeferred,
	Reason: "not settled at once: store this outcome in MLSCHED_OUTCOMES"}.AppendJSON(nil)

// handleReport is one direct report.
func (oc *outcomes) handleReport(m *nats.Msg) {
	if m.Reply == "" {
		return // nobody to answer: a worker always asks for an answer
	}
	r := &report{m: m, nc: oc.nc, ack: reportAckSubject(m)}
	o, err := protocol.DecodeOutcome(m.Data)
	if err != nil || o.TaskID == "" || o.Status != protocol.OutcomeSuccess {
		// Not for this path: the stored path dead-letters or retries it,
		// with the stream's ids and redelivery.
		r.deferToStream(oc.counters)
		return
	}
	pd, err := protocol.ParseDispatch(m.Header)
	if err != nil {
		r.deferToStream(oc.counters)
		return
	}
	oc.counters.Reports.Add(1)
	oc.settleOutcome(r, m.Subject, o, pd, true)
}

// reportsService serves direct reports while running. Stopping drains the
// subscription: reports already received are settled and answered (the
// publishers stop after it), later ones find no responder and are stored.
func (oc *outcomes) reportsService() lifecycle.Service {
	var sub *nats.Subscription
	return &lifecycle.Func{
		OnStart: func(context.Context) (err error) {
			sub, err = oc.nc.QueueSubscribe(topology.SubjectReportsAll, topology.QueueDispatchers, oc.handleReport)
			return err
		},
		OnStop: func() error {
			closed := sub.StatusChanged(nats.SubscriptionClosed)
			if err := sub.Drain(); err != nil {
				return sub.Unsubscribe()
			}
			select { // every report received is handled; bounded, should the connection hang
			case <-closed:
			case <-time.After(10 * time.Second):
			}
			return nil
		},
	}
}

// report is a direct report, settled by the outcome path through the same
// seam as a stored outcome (jsplumb.Completer, whose jsplumb.Msg it is): Ack
// answers "settled", a nak answers "store it" (ReportDeferred). It answers
// once; what comes after is ignored.
//
// When the report names its dispatch's acknowledgement subject (HdrAck),
// Ack first acknowledges the dispatch itself, then answers ReportAcked:
// the worker acks nothing, one message less per task than answering and
// letting the worker ack. Both go out on one connection, in that order, and
// are as reliable as the worker's own plain ack would be: a lost one costs
// a redelivery of the dispatch, whose second result is refused.
type report struct {
	m    *nats.Msg
	nc   *nats.Conn
	ack  string // the dispatch's ack subject, or "" to answer ReportSettled
	once sync.Once
}

var _ jsplumb.Msg = (*report)(nil)

// reportAckSubject is the report's HdrAck when it acknowledges a dispatch
// of the reporting node's own consumer (anything else a node could ack
// itself anyway, but the dispatcher publishes nothing else for it), else "".
func reportAckSubject(m *nats.Msg) string {
	subj := m.Header.Get(protocol.HdrAck)
	node, ok := strings.CutPrefix(m.Subject, topology.ReportSubject(""))
	if subj == "" || !ok {
		return ""
	}
	rest, ok := strings.CutPrefix(subj, "$JS.ACK."+topology.StreamDispatch+"."+topology.NodeConsumer(node)+".")
	if !ok || rest == "" || strings.ContainsAny(rest, "*> \t\r\n") {
		return ""
	}
	return subj
}

func (r *report) answer(b []byte) error {
	err := errAnswered
	r.once.Do(func() { err = r.nc.Publish(r.m.Reply, b) })
	return err
}

func (r *report) deferToStream(c *Counters) {
	c.ReportsDeferred.Add(1)
	_ = r.answer(deferredReply)
}

// errAnswered: a report is answered once.
var errAnswered = errors.New("report answered already")

// Ack answers that the report is settled (its result stored).
func (r *report) Ack() error {
	if r.ack == "" {
		return r.answer(protocol.ReportReply{Status: protocol.ReportSettled}.AppendJSON(nil))
	}
	err := errAnswered
	r.once.Do(func() {
		if err = r.nc.Publish(r.ack, []byte("+ACK")); err == nil {
			err = r.nc.Publish(r.m.Reply, protocol.ReportReply{Status: protocol.ReportAcked}.AppendJSON(nil))
		}
	})
	return err
}

// NakWithDelay answers "store it": the stored path redelivers and backs
// off, which a request cannot.
func (r *report) NakWithDelay(time.Duration) error { return r.answer(deferredReply) }

// InProgress keeps the dispatch alive when the report named its ack
// subject; the worker does so anyway until it is answered.
func (r *report) InProgress() error {
	if r.ack == "" {
		return nil
	}
	return r.nc.Publish(r.ack, []byte("+WPI"))
}

// Package outcome is the stage that acts on what a worker reports, third on
// a task's path (intake, admission, outcome, finish): a stored outcome of
// MLSCHED_OUTCOMES or a direct report. It imports only the finish stage
// after it; the one way back, a retry to admission, is the Retrier it
// declares, and what it tells the rest of the dispatcher (metrics, the load
// model, rollouts) goes through the Observer it declares.
package outcome

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/dispatcher/internal/finish"
	"github.com/mlsched/mlsched/dispatcher/internal/lograte"
	"github.com/mlsched/mlsched/dispatcher/internal/pipeline"
	"github.com/mlsched/mlsched/dispatcher/internal/settle"
	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/shared/jsplumb"
	"github.com/mlsched/mlsched/shared/lifecycle"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// Stage is the stage that acts on what a worker reports: a stored
// outcome of MLSCHED_OUTCOMES or a direct report (below). It checks
// that the outcome answers a dispatch a dispatcher made (trust.go), records
// it in the statistics, and settles it by the rule of dispatcher/internal/settle: the
// final result or a dead letter (through the finisher), a retry (back to
// admission, through Retrier), or a late outcome of a superseded attempt,
// which it marks in the superseded set.
type Stage struct {
	Params
	forgedLog lograte.Sometimes // bounded-rate log of refused outcomes
}

// Params is what the outcome stage needs.
type Params struct {
	Rules    settle.Rules    // the retry rule (Config.Retry)
	Limits   protocol.Limits // a task's bounds, to decode it for a retry
	AckWait  time.Duration
	Log      zerolog.Logger
	NC       *nats.Conn // answers direct reports
	Complete *jsplumb.Completer
	Batch    *stats.Batcher
	// Sealer checks that an outcome answers a dispatch a dispatcher made;
	// Pipelines opens a pipeline step's progress for its retry.
	Sealer     Sealer
	Pipelines  finish.Pipelines
	Superseded Superseded
	Keeper     Keeper  // keeps a task in progress through a durable backoff
	Retry      Retrier // failed attempts go back to admission
	Fin        *finish.Finisher
	Counts     *Counters
	Observer   Observer
	// Expiry is a task's own deadline (zero: none); past it a task is not
	// retried.
	Expiry func(t *protocol.Task, submitted time.Time) time.Time
}

// Retrier is the one back edge of the path: a failed attempt goes back to
// admission.
type Retrier interface {
	// Retry decides and publishes the next attempt; msg is settled once
	// its dispatch is stored.
	Retry(next finish.Spec, msg jsplumb.Msg)
	// Wake: an outcome freed a slot, held tasks may go now.
	Wake()
}

// Sealer verifies a dispatch's seal (the dispatcher's trust.go).
type Sealer interface {
	Valid(d *protocol.Dispatch) bool
}

// Superseded is the set of superseded attempts and cancelled tasks.
type Superseded interface {
	Cancelled(task, submission string) bool
	Is(task, submission string, attempt int) bool
	Mark(task, submission string, attempt int)
}

// Keeper keeps a task unacknowledged, in progress, until a time.
type Keeper interface {
	Keep(msg jsplumb.Msg, taskAck string, until time.Time)
}

// Observer learns of every attempt the stage records: the metrics, the
// load model (the attempt's slot is free now), the rollouts.
type Observer interface {
	Observed(o *protocol.Outcome, kind stats.Kind, attempt int)
}

// Counters are the outcome stage's counters (the dispatcher's Counters
// embed them).
type Counters struct {
	// Forged counts outcomes refused because they answer no dispatch a
	// dispatcher made, or disagree with it.
	Forged atomic.Int64
	// Late counts outcomes of attempts that had been superseded; Lost the
	// attempts found unanswered at their deadline.
	Late, Lost atomic.Int64
	// Reports counts the direct reports this replica settled;
	// ReportsDeferred those it sent back to be stored as outcomes.
	Reports, ReportsDeferred atomic.Int64
}

// New builds the outcome stage.
func New(p Params) *Stage {
	oc := &Stage{Params: p}
	oc.forgedLog.Every = 10 * time.Second
	return oc
}

// HandleOutcome is one message of MLSCHED_OUTCOMES: a worker's report of an
// attempt, or the sweeper's report of a lost one. The dispatch headers the
// worker echoes carry everything the dispatcher needs, so any replica can
// handle any outcome.
func (oc *Stage) HandleOutcome(msg jetstream.Msg) {
	data := msg.Data()
	o, err := protocol.DecodeOutcome(data) // as json.Unmarshal would, in one pass
	if err != nil || o.TaskID == "" || o.Status == "" {
		reason := "outcome has no task_id or status"
		if err != nil {
			reason = "outcome is not valid JSON: " + err.Error()
		}
		oc.Fin.DeadLetter(msg, "outcome", protocol.DeadLetter{Reason: reason, Code: protocol.CodeMalformedJSON,
			Subject: msg.Subject(), Original: data})
		return
	}
	pd, err := protocol.ParseDispatch(msg.Headers())
	if err != nil {
		// Only a dispatch the dispatcher did not build has bad headers:
		// forged, and kept for an operator.
		oc.Counts.Forged.Add(1)
		oc.Fin.DeadLetter(msg, "outcome", protocol.DeadLetter{Reason: "outcome echoes an invalid dispatch: " + err.Error(),
			Code: protocol.CodeOf(err), Subject: msg.Subject(), Original: data})
		return
	}
	first := true
	if meta, err := msg.Metadata(); err == nil {
		first = meta.NumDelivered == 1
	}
	oc.Settle(msg, msg.Subject(), o, pd, first)
}

// Settle acts on a decoded outcome whose dispatch headers parse,
// whether it came from MLSCHED_OUTCOMES or as a direct report (first: this
// is its first delivery; subject: where it was published): checked, then
// settled by the rule (internal/settle), recorded, and acted on.
func (oc *Stage) Settle(msg jsplumb.Msg, subject string, o protocol.Outcome, pd protocol.Dispatch, first bool) {
	if err := oc.checkOutcome(subject, &o, &pd); err != nil {
		// Counted and ignored: a forged outcome must not touch the task,
		// the statistics or the logs' volume.
		oc.Counts.Forged.Add(1)
		oc.forgedLog.Log(&oc.Log, func(e *zerolog.Event) *zerolog.Event {
			return e.Err(err).Str("subject", subject).Str("task_id", truncateID(o.TaskID))
		}, "outcome refused")
		oc.Complete.Settle(msg, nil)
		return
	}
	next, state := oc.nextAttempt(&o, &pd, first)
	dec := settle.Settle(oc.Rules, pd, o, state)
	if dec.Record {
		oc.record(&o, dec, pd.Attempt)
	}
	if dec.Supersede {
		if first { // a retried outcome is first nak'ed for backoff, then handled again
			oc.Counts.Lost.Add(1)
		}
		oc.Superseded.Mark(o.TaskID, pd.Submission, pd.Attempt)
	}
	oc.act(msg, &o, dec, state, next)
}

// nextAttempt is the attempt after the outcome's: the retry, or (named by
// the outcome) what ends the task, whose ending counts this attempt
// (ends); and the task's state for the settle rule.
func (oc *Stage) nextAttempt(o *protocol.Outcome, pd *protocol.Dispatch, first bool) (finish.Spec, settle.State) {
	attempt, submitted, submission := pd.Attempt, pd.Submitted, pd.Submission
	history := append(pd.History, protocol.Attempt{Attempt: attempt, Model: o.Model, Node: o.Node,
		Status: o.Status, Error: o.Error, LatencyMs: o.LatencyMs, BatchWaitMs: o.BatchWaitMs, DeadlineLeftMs: o.DeadlineLeftMs})
	state := settle.State{Redelivered: !first, Cancelled: oc.Superseded.Cancelled(o.TaskID, submission),
		Superseded: !o.Status.IsLost() && oc.Superseded.Is(o.TaskID, submission, attempt)}
	var task protocol.Task
	if o.Status != protocol.OutcomeSuccess && o.Status != protocol.OutcomeTaskError { // the bytes matter for a retry only
		if len(o.Task) == 0 {
			state.TaskErr = fmt.Errorf("the outcome carries no task bytes")
		} else {
			task, state.TaskErr = protocol.DecodeTask(o.Task, oc.Limits)
		}
		// Past the task's own deadline, or an attempt the node did not
		// start because that deadline (the dispatch's, capped at it; ms on
		// the wire) left too little time for the model's run: retrying it
		// would only meet the same deadline, and end attempts_exhausted.
		if exp := oc.Expiry(&task, submitted); state.TaskErr == nil && !exp.IsZero() &&
			(!time.Now().Before(exp) || o.Status == protocol.OutcomeExpired && !pd.Deadline.Before(exp.Add(-time.Millisecond))) {
			state.Expired = true
			oc.Fin.Counts.Expired.Add(1)
		}
	}
	next := finish.Spec{Task: task, Data: o.Task, Attempt: attempt + 1, History: history, Submitted: submitted,
		Submission: submission, Traceparent: pd.Traceparent, TaskAck: finish.TaskAckFor(pd), Pipe: pd.Pipeline}
	oc.retryStep(&next) // a pipeline step's constraints
	return next, state
}

// record counts the attempt in the statistics and the metrics, and frees
// its slot in the load model at once.
func (oc *Stage) record(o *protocol.Outcome, dec settle.Decision, attempt int) {
	oc.Batch.Add(stats.Event{Model: o.Model, Node: o.Node, Kind: dec.Kind,
		Latency: time.Duration(o.LatencyMs * float64(time.Millisecond)), Late: dec.Action == settle.Late})
	oc.Observer.Observed(o, dec.Kind, attempt) // the metrics, and the load model learns the slot is free now
	oc.Retry.Wake()
}

// act carries out the settle rule's decision: a late outcome is only
// counted, a final one ends the task, a retry goes back to admission (now,
// or after a durable backoff), and the rest ends the task failed.
func (oc *Stage) act(msg jsplumb.Msg, o *protocol.Outcome, dec settle.Decision, state settle.State, next finish.Spec) {
	// Built only for a line that is logged: successes are the bulk, and
	// logged at debug level.
	log := func(e *zerolog.Event) *zerolog.Event {
		return e.Str("task_id", o.TaskID).Str("model", o.Model).Str("node", o.Node).Int("attempt", next.Attempt-1)
	}
	switch dec.Action {
	case settle.Late:
		// The attempt was declared lost and re-dispatched, or the task was
		// cancelled: its outcome counts in the statistics, but the task's
		// result comes from a later attempt or the cancellation.
		oc.Counts.Late.Add(1)
		log(oc.Log.Info()).Str("status", string(o.Status)).Msg("late outcome of a superseded attempt: counted, not final")
		if state.Cancelled { // the cancellation stored the task's result
			next.Task.ID, next.Task.Type = o.TaskID, o.Type
			oc.Fin.End(next.EndsStored(msg))
			return
		}
		oc.Complete.Settle(msg, nil)
	case settle.Finish:
		if dec.Status == protocol.StatusSucceeded {
			log(oc.Log.Debug()).Msg("attempt succeeded") // a nil event when debug is off: nothing built
		} else {
			log(oc.Log.Info()).Str("error", o.Error).Msg("task error: not retried")
		}
		next.Task.ID, next.Task.Type = o.TaskID, o.Type
		e := next.Ends(msg, nil, dec.Status)
		e.Result = &protocol.Result{ID: o.TaskID, Type: o.Type, Status: dec.Status, Model: o.Model,
			Node: o.Node, Attempts: next.Attempt - 1, Output: o.Output, Error: dec.Error, ErrorCode: dec.Code,
			LatencyMs: pipeline.MsSince(next.Submitted), History: next.History}
		oc.Fin.End(e)
	case settle.Retry:
		if dec.Backoff > 0 {
			// Durable backoff: the redelivery re-dispatches. The task stays
			// in progress meanwhile (its attempt's keeping ended with it).
			oc.Keeper.Keep(msg, next.TaskAck, time.Now().Add(dec.Backoff+oc.AckWait))
			oc.Complete.Retry(msg, dec.Backoff)
			return
		}
		log(oc.Log.Info()).Str("status", string(o.Status)).Str("error", o.Error).Msg("attempt failed, failing over")
		oc.Retry.Retry(next, msg)
	default: // settle.DeadLetter
		err := &protocol.Error{Code: dec.Code, Msg: dec.Error}
		log(oc.Log.Warn()).Err(err).Msg("task failed")
		next.Task.ID, next.Task.Type = o.TaskID, o.Type
		oc.Fin.End(next.Ends(msg, err, dec.Status))
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

// HandleReport is one direct report.
func (oc *Stage) HandleReport(m *nats.Msg) {
	if m.Reply == "" {
		return // nobody to answer: a worker always asks for an answer
	}
	r := &report{m: m, nc: oc.NC, ack: reportAckSubject(m)}
	o, err := protocol.DecodeOutcome(m.Data)
	if err != nil || o.TaskID == "" || o.Status != protocol.OutcomeSuccess {
		// Not for this path: the stored path dead-letters or retries it,
		// with the stream's ids and redelivery.
		r.deferToStream(oc.Counts)
		return
	}
	pd, err := protocol.ParseDispatch(m.Header)
	if err != nil {
		r.deferToStream(oc.Counts)
		return
	}
	oc.Counts.Reports.Add(1)
	oc.Settle(r, m.Subject, o, pd, true)
}

// ReportsService serves direct reports while running. Stopping drains the
// subscription: reports already received are settled and answered (the
// publishers stop after it), later ones find no responder and are stored.
func (oc *Stage) ReportsService() lifecycle.Service {
	var sub *nats.Subscription
	return &lifecycle.Func{
		OnStart: func(context.Context) (err error) {
			sub, err = oc.NC.QueueSubscribe(topology.SubjectReportsAll, topology.QueueDispatchers, oc.HandleReport)
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

// errForged is wrapped by checkOutcome's errors.
var errForged = errors.New("forged outcome")

// checkOutcome accepts an outcome only when its subject's node, its body's
// node and the dispatch it answers (sealed by a dispatcher) agree on task
// id, type, attempt, node, model and submission, and its task bytes are the
// dispatched ones.
func (oc *Stage) checkOutcome(subject string, o *protocol.Outcome, pd *protocol.Dispatch) error {
	node, ok := strings.CutPrefix(subject, topology.OutcomeSubject(""))
	if !ok {
		node, ok = strings.CutPrefix(subject, topology.ReportSubject(""))
	}
	switch {
	case !ok || node == "" || strings.Contains(node, "."):
		return fmt.Errorf("%w: subject %q names no node", errForged, subject)
	case pd.Seal == "":
		return fmt.Errorf("%w: the dispatch it answers is not sealed", errForged)
	case !oc.Sealer.Valid(pd):
		return fmt.Errorf("%w: the dispatch it answers was not made by a dispatcher (bad seal)", errForged)
	case pd.Node != node || o.Node != node:
		return fmt.Errorf("%w: subject node %q, body node %q, dispatch node %q", errForged, node, o.Node, pd.Node)
	case o.TaskID != pd.TaskID || o.Type != pd.Type:
		return fmt.Errorf("%w: body task %q (%s), dispatch task %q (%s)", errForged, o.TaskID, o.Type, pd.TaskID, pd.Type)
	case o.Attempt != pd.Attempt:
		return fmt.Errorf("%w: body attempt %d, dispatch attempt %d", errForged, o.Attempt, pd.Attempt)
	case o.Model != pd.Model:
		return fmt.Errorf("%w: body model %q, dispatch model %q", errForged, o.Model, pd.Model)
	case len(o.Task) > 0 && protocol.TaskSum(o.Task) != pd.TaskSum:
		return fmt.Errorf("%w: the task bytes are not the dispatched ones", errForged)
	}
	return nil
}

// truncateID bounds an untrusted id in a log line.
func truncateID(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// retryStep gives a retry of a pipeline step its step's constraints again
// (the task bytes of a first step are the producer's).
func (oc *Stage) retryStep(a *finish.Spec) {
	if a.Pipe == "" || a.Task.ID == "" {
		return
	}
	if p, err := oc.Pipelines.Open(a.Pipe); err == nil {
		p.ApplyStep(&a.Task)
	}
}

// Package finish is the last stage of a task's path (intake, admission,
// outcome, finish): the one way an attempt of a task ends. It imports no
// other stage; what it needs of the others (the task keeper, the
// pipelines' seal, the metrics) it declares as small interfaces.
//
// End, the model of which is River's job completer, takes one value,
// Ending, built by the attempt that ends (dispatcher's attemptSpec.ends
// alone), and does everything an ending means: it releases what the
// attempt held, stores the task's final result (and dead letter) unless it
// is stored already, or the next step of a pipeline, and then settles the
// message whose handling ended it together with the task's ack, so that
// whichever stage ends a task, the task leaves MLSCHED_TASKS with its
// result (docs/protocol.md).
package finish

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"

	"github.com/mlsched/mlsched/dispatcher/internal/pipeline"
	"github.com/mlsched/mlsched/dispatcher/internal/quota"
	"github.com/mlsched/mlsched/shared/jsplumb"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
	"github.com/mlsched/mlsched/shared/tracing"
)

// Finisher is the stage that ends tasks: it publishes the one final result
// of a task (results), the failed result and dead letter of a task that
// exhausted its attempts, and dead letters of messages that are no task,
// each settling the message that caused it once stored.
type Finisher struct{ Params }

// Params is what the finisher needs.
type Params struct {
	Log    zerolog.Logger
	ResPub *jsplumb.Publisher // results and dead letters, with room of their own
	// Results publishes the results: a group commit over ResPub, or
	// (nil) ResPub itself.
	Results  jsplumb.Sender
	Complete *jsplumb.Completer
	DLQ      *DeadLetters
	// ResultsStream reads a stored result (failExhausted).
	ResultsStream jetstream.Stream
	Counts        *Counts
	Metrics       Metrics // nil: none
	Tracer        *tracing.Tracer
	// Quota is told of every task that ends, for the tenants' concurrency
	// caps (tasks in flight).
	Quota *quota.Limiter
	// Keeper keeps tasks in progress; a task's ack takes it out. Nil: none.
	Keeper Keeper
	// Pipelines opens and seals a pipeline's progress.
	Pipelines Pipelines
}

// Keeper keeps a task unacknowledged, in progress, until its result is
// stored (the dispatcher's taskack.go).
type Keeper interface {
	// Release is msg, whose settling also acks the task taskAck
	// acknowledges; the keeper forgets the task then (at once when msg is
	// the task itself).
	Release(msg jsplumb.Msg, taskAck string) jsplumb.Msg
}

// Pipelines reads and writes a pipeline's sealed progress (the
// dispatcher's seal, trust.go).
type Pipelines interface {
	Open(sealed string) (*pipeline.Progress, error)
	Seal(p *pipeline.Progress) (string, error)
	// StoreMember stores a parallel ensemble member's output under its
	// key (pipeline.MemberKey, in MLSCHED_PIPELINE) and returns its
	// revision (the bucket's sequence); LoadMember reads one (found
	// false: not stored yet).
	StoreMember(ctx context.Context, key string, out []byte) (rev uint64, err error)
	LoadMember(ctx context.Context, key string) (out []byte, rev uint64, found bool, err error)
}

// Metrics is what the finisher observes.
type Metrics interface {
	// Result: a task's final result was stored.
	Result(typ string, status protocol.Status, latencyMs float64)
	// PipelineStep: a pipeline's step ended.
	PipelineStep(typ string, status protocol.Status)
}

type noMetrics struct{}

func (noMetrics) Result(string, protocol.Status, float64) {}
func (noMetrics) PipelineStep(string, protocol.Status)    {}

func (f *Finisher) metric() Metrics {
	if f.Metrics == nil {
		return noMetrics{}
	}
	return f.Metrics
}

// New builds the finish stage.
func New(p Params) *Finisher {
	if p.Results == nil {
		p.Results = p.ResPub
	}
	return &Finisher{p}
}

// resultMsg is a task's final result message. JetStream refuses it when
// the task already has one (expected last subject sequence 0), which is
// what makes the result final: a duplicate delivery, a racing replica or a
// late outcome cannot publish a second or changed result. resultStored
// reads the acknowledgement. The result's headers carry the task's W3C
// traceparent, so that whoever reads the result continues its trace.
func (f *Finisher) resultMsg(res *protocol.Result, traceparent string) (*nats.Msg, error) {
	res.FinishedAt = time.Now().UTC()
	data, err := protocol.EncodeResult(res)
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
func (f *Finisher) resultStored(res *protocol.Result, ack *jetstream.PubAck, err error) (bool, error) {
	switch {
	case IsWrongLastSequence(err), err == nil && ack.Duplicate:
		f.Counts.Suppressed.Add(1)
		f.Log.Info().Str("task_id", res.ID).Str("model", res.Model).Str("node", res.Node).Msg("task already has a final result: suppressed a second one")
		return false, nil
	case err != nil:
		f.Log.Warn().Err(err).Str("task_id", res.ID).Msg("result publish failed, will retry")
		return false, err
	}
	f.Counts.Results.Add(1)
	f.metric().Result(res.Type, res.Status, res.LatencyMs)
	switch res.Status {
	case protocol.StatusRejected:
		f.Counts.Rejected.Add(1)
	case protocol.StatusSucceeded:
		f.Counts.Succeeded.Add(1)
	case protocol.StatusFailed:
		f.Counts.Failed.Add(1)
		if res.ErrorCode == protocol.CodeSaturated {
			f.Counts.Shed.Add(1)
		}
	}
	f.Counts.Types.Add(res.Type, res.Status)
	f.Log.Debug().Str("task_id", res.ID).Str("model", res.Model).Str("node", res.Node).Str("status", string(res.Status)).Msg("result published")
	return true, nil
}

// finish publishes the task's final result (end), then settles msg: acked once
// the result is stored (or refused as a second one), on the publisher's
// reply goroutine, with no future or settling goroutine in between.
// traceparent is the task's trace context ("" for none); with tracing on, a
// result span covers the publish.
func (f *Finisher) finish(msg jsplumb.Msg, res *protocol.Result, traceparent string) {
	span := f.resultSpan(res, traceparent)
	m, err := f.resultMsg(res, span.Traceparent())
	if err == nil {
		err = f.Complete.Publish(context.Background(), f.Results, msg, m, "", func(ack *jetstream.PubAck, err error) error {
			_, err = f.resultStored(res, ack, err)
			span.End(err)
			return err
		})
	}
	if err != nil {
		f.Log.Warn().Err(err).Str("task_id", res.ID).Msg("result publish failed, will retry")
		span.End(err)
		f.Complete.Settle(msg, err)
	}
}

// ended: the task is no longer in flight for its tenant's concurrency cap.
// Taken out before its result is stored, on the caller's goroutine (one
// Redis round trip, only when some tenant is capped): a publish retried
// meanwhile lets another task in a little early, never one too many for
// long; a task whose removal fails leaves at its attempt's deadline.
func (f *Finisher) ended(id string) {
	if f.Quota.HasCaps() {
		f.Quota.Release(context.Background(), id)
	}
}

// resultSpan starts the result span of a task (a no-op with tracing off).
func (f *Finisher) resultSpan(res *protocol.Result, traceparent string) tracing.Span {
	if !f.Tracer.On() {
		return f.Tracer.Start(traceparent, "")
	}
	return f.Tracer.Start(traceparent, "mlsched.result", attribute.String("mlsched.task_id", res.ID),
		attribute.String("mlsched.status", string(res.Status)), attribute.Int("mlsched.attempts", res.Attempts))
}

// failExhausted publishes the failed result of a task that exhausted its
// attempts and keeps the task in the dead-letter stream for an operator to
// inspect and replay, then settles msg. The dead letter is written only if
// this failure is the task's result (a racing attempt may have succeeded);
// on a redelivery our result may already be stored, so a refused publish
// looks at what is stored, and the entry's id makes a second write harmless.
func (f *Finisher) failExhausted(msg jsplumb.Msg, res *protocol.Result, dl protocol.DeadLetter, submission, traceparent string) {
	span := f.resultSpan(res, traceparent)
	m, err := f.resultMsg(res, span.Traceparent())
	if err == nil {
		err = f.Complete.PublishSlow(context.Background(), f.Results, msg, m, "", func(ack *jetstream.PubAck, err error) error {
			stored, err := f.resultStored(res, ack, err)
			span.End(err)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if !stored {
				if ours, err := f.storedResultIs(ctx, res.ID, res.Status, res.ErrorCode); err != nil || !ours {
					return err
				}
			}
			return f.DLQ.Publish(ctx, "exhausted", dl, TaskEntry("exhausted", res.ID, submission))
		})
	}
	if err != nil {
		span.End(err)
		f.Complete.Settle(msg, err)
	}
}

// deadLetter stores an entry about msg (which has no task to give a result
// to), then settles msg.
func (f *Finisher) DeadLetter(msg jsplumb.Msg, kind string, dl protocol.DeadLetter) {
	m, err := f.DLQ.message(kind, dl)
	if err == nil {
		err = f.Complete.Publish(context.Background(), f.ResPub, msg, m, MessageEntryOf(kind, msg),
			func(ack *jetstream.PubAck, err error) error { return f.DLQ.stored(kind, dl, ack, err) })
	}
	if err != nil {
		f.Complete.Settle(msg, err)
	}
}

func IsWrongLastSequence(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
	}
	return false
}

// Spec is one attempt of a task as every stage knows it: the task, its
// bytes and history, where it was submitted, its trace and the ack subject
// of its task message. Admission carries it with marks of its own, the
// outcome stage builds the next attempt's from an outcome, and its Ends is
// the one place an ending is built.
type Spec struct {
	Task    protocol.Task
	Data    []byte // the task's original bytes, forwarded unchanged
	Attempt int
	History []protocol.Attempt
	// Submitted is when the task was submitted, Submission names this
	// submission of it (its sequence in the task stream), carried in
	// HdrTaskSeq through every attempt.
	Submitted  time.Time
	Submission string
	// Traceparent is the W3C trace context of the task (the producer's, or
	// the previous attempt's dispatch span), "" when it has none.
	Traceparent string
	// TaskAck is the task message's ack subject (Dispatch.TaskAck), ""
	// for a task dispatched by an older dispatcher.
	TaskAck string
	// Pipe is a pipeline step's sealed progress, carried on its
	// dispatches.
	Pipe string
}

// Ends is how this attempt ends, handled by msg: with err and status, or
// (EndsStored) with the task's result stored already. The finisher ends it
// (Finisher.End); this is the one place an ending is built.
func (a *Spec) Ends(msg jsplumb.Msg, err error, status protocol.Status) Ending {
	return Ending{Msg: msg, TaskAck: a.TaskAck, Subject: topology.TaskSubject(a.Task.Type), Data: a.Data, Task: a.Task,
		Err: err, Status: status, History: a.History, Attempts: a.Attempt - 1, Submitted: a.Submitted,
		Submission: a.Submission, Traceparent: a.Traceparent, Pipe: a.Pipe}
}

// EndsStored: the attempt ends with the task's result stored already (the
// task was cancelled, or its result found on a redelivery).
func (a *Spec) EndsStored(msg jsplumb.Msg) Ending {
	e := a.Ends(msg, nil, "")
	e.Stored = true
	return e
}

// Ending is how an attempt of a task ends, and the one value the finisher
// ends it from (end): the message whose handling ends it, the task's ack
// subject, and either the attempt's result (a success, a task error), the
// reason it ends without one (rejected before it ran, failed after its
// attempts: a result with the error, and a dead letter when it exhausted
// them), or that its result is stored already (cancelled, or found on a
// redelivery). Built by Spec.Ends alone.
type Ending struct {
	// Msg is the message whose handling ends the attempt (the task, the
	// previous attempt's outcome, a report); taskAck the task's ack subject
	// ("" when the dispatch named none, or msg is the task).
	Msg     jsplumb.Msg
	TaskAck string
	// Result, when set, is the task's result as the attempt reported it.
	Result *protocol.Result
	// Stored: the task's result exists already; the attempt only settles.
	Stored bool

	Subject string // where the task was submitted
	Data    []byte // its original bytes
	Task    protocol.Task
	Err     error // why it ends (a *protocol.Error carries the code)
	Status  protocol.Status
	History []protocol.Attempt
	// Attempts made; submitted and submission as in attemptSpec.
	Attempts   int
	Submitted  time.Time
	Submission string
	// Traceparent is the task's trace context, carried to the result.
	Traceparent string
	// RetryAfter, when positive, is the result's retry_after_ms: a task
	// shed, expired or over its quota.
	RetryAfter time.Duration
	// Pipe is a pipeline step's sealed progress: a success goes on to the
	// next step, an ending is the pipeline's (pipeline.go).
	Pipe string
}

// End is the one way an attempt of a task ends (the model is River's job
// completer): it releases what the attempt held (its tenant's concurrency
// slot; the keeper's entry goes with the task's ack), stores the task's
// final result (and dead letter) unless it is stored already, and then
// settles e.Msg together with the task's ack, so that whichever stage ends
// a task, the task leaves MLSCHED_TASKS with its result (docs/protocol.md).
// Nothing else acks a task or builds a result of one.
func (f *Finisher) End(e Ending) {
	msg := e.Msg
	if f.Keeper != nil {
		msg = f.Keeper.Release(e.Msg, e.TaskAck) // the keeper lets the task go with its ack
	}
	if e.Task.ID != "" {
		f.ended(e.Task.ID)
	}
	switch {
	case e.Stored:
		f.Complete.Settle(msg, nil)
	case e.Result != nil && e.Pipe != "":
		f.pipelineStep(msg, &e)
	case e.Result != nil:
		f.finish(msg, e.Result, e.Traceparent)
	default:
		f.reject(msg, e)
	}
}

// reject ends a task that cannot run or succeed (end), then settles msg: a keyed
// task gets a result with the error; an unkeyable message (no usable id)
// goes to the dead-letter stream with its original bytes, and so does,
// besides its result, a task that exhausted its attempts.
func (f *Finisher) reject(msg jsplumb.Msg, e Ending) {
	code := protocol.CodeOf(e.Err)
	if c := slices.Index(FlowCodes[:], code); c >= 0 && e.Task.ID != "" {
		f.Counts.Ended[topology.BandIndex(e.Task.Priority)][c].Add(1)
	}
	if e.Task.ID == "" {
		f.DeadLetter(msg, "invalid", protocol.DeadLetter{Reason: protocol.Message(e.Err), Code: code, Subject: e.Subject, Original: e.Data})
		return
	}
	res := &protocol.Result{ID: e.Task.ID, Type: e.Task.Type, Status: e.Status, Attempts: e.Attempts,
		Error: protocol.Message(e.Err), ErrorCode: code, History: e.History, LatencyMs: pipeline.MsSince(e.Submitted),
		RetryAfterMs: int(e.RetryAfter.Milliseconds())}
	if e.Pipe != "" { // the pipeline's result, naming the step (no dead letter: a replay would run the step alone)
		f.pipelineFailed(&e, res)
		f.finish(msg, res, e.Traceparent)
		return
	}
	if e.Status == protocol.StatusFailed && (code == protocol.CodeAttemptsExhausted || code == protocol.CodeSaturated) {
		f.failExhausted(msg, res, protocol.DeadLetter{Reason: res.Error, Code: code, Subject: e.Subject,
			TaskID: e.Task.ID, History: e.History, Original: e.Data}, e.Submission, e.Traceparent)
		return
	}
	f.finish(msg, res, e.Traceparent)
}

// hasResult reports whether the task has a stored result (false when the
// lookup fails: dispatching again is harmless, the second result is
// refused).
func (f *Finisher) HasResult(ctx context.Context, id string) bool {
	_, found, _ := Lookup(ctx, f.ResultsStream, id)
	return found
}

// storedResultIs reports whether the task's stored result has that status
// and error code.
func (f *Finisher) storedResultIs(ctx context.Context, id string, status protocol.Status, code protocol.Code) (bool, error) {
	r, found, err := Lookup(ctx, f.ResultsStream, id)
	if !found {
		if err == nil {
			err = fmt.Errorf("no result stored for %q", id)
		}
		return false, err
	}
	if err != nil { // stored, but not ours to read
		return false, nil
	}
	return r.Status == status && r.ErrorCode == code, nil
}

// Lookup is the one reader of MLSCHED_RESULTS: the stored result of
// the task, decoded with the protocol's codec. found is false when the task
// has none or the lookup failed (err says which); a stored result that does
// not decode is found, with the error.
func Lookup(ctx context.Context, results jetstream.Stream, id string) (res protocol.Result, found bool, err error) {
	m, err := results.GetLastMsgForSubject(ctx, topology.ResultSubject(id))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return protocol.Result{}, false, nil
	}
	if err != nil {
		return protocol.Result{}, false, fmt.Errorf("reading the result of %q: %w", id, err)
	}
	if res, err = protocol.DecodeResult(m.Data); err != nil {
		return protocol.Result{}, true, fmt.Errorf("decoding the result of %q: %w", id, err)
	}
	return res, true, nil
}

// pipelineFailed makes res, the failure of the running step, the
// pipeline's result: the step named, pipeline_error unless the pipeline
// was cancelled, expired or refused by flow control (whose codes stay).
func (f *Finisher) pipelineFailed(e *Ending, res *protocol.Result) {
	p, err := f.Pipelines.Open(e.Pipe)
	if err != nil {
		res.Error, res.ErrorCode = err.Error(), protocol.CodePipelineError
		return
	}
	rec := p.StepRecord(e.Submitted, res)
	f.metric().PipelineStep(rec.Type, protocol.StatusFailed)
	f.stepSpan(p, rec, e.Submitted, res.ID)
	p.FinalResult(res, append(p.Steps, rec))
	res.FailedStep = rec.Name
	code := res.ErrorCode
	switch code {
	case protocol.CodeCancelled, protocol.CodeExpired, protocol.CodeShed, protocol.CodeQuotaExceeded, protocol.CodeBudgetExceeded, protocol.CodeSaturated:
		res.Error = fmt.Sprintf("step %s (%s): %s", rec.Name, rec.Type, res.Error)
	default:
		res.Error = fmt.Sprintf("step %s (%s) failed: %s: %s", rec.Name, rec.Type, code, res.Error)
		res.ErrorCode = protocol.CodePipelineError
	}
	if p.Seq > 1 || res.Attempts > 0 {
		res.Status = protocol.StatusFailed // it ran
	}
	f.pipelineSpan(p, res)
}

// stepSpan records the span of the pipeline step that ended with rec,
// from its start (its task message stored) until now: named after the
// step, under the pipeline's span, the parent of its attempts' decisions
// and dispatches (they started from its reserved traceparent). Nothing
// with tracing off.
func (f *Finisher) stepSpan(p *pipeline.Progress, rec protocol.StepRecord, start time.Time, id string) {
	if p.StepTrace == "" || !f.Tracer.On() {
		return
	}
	var err error
	if rec.Status != protocol.StatusSucceeded {
		err = errors.New(rec.Error)
	}
	attrs := []attribute.KeyValue{attribute.String("mlsched.task_id", id), attribute.String("mlsched.step", rec.Name),
		attribute.String("mlsched.type", rec.Type), attribute.String("mlsched.model", rec.Model),
		attribute.String("mlsched.node", rec.Node), attribute.Int("mlsched.attempts", rec.Attempts),
		attribute.String("mlsched.status", string(rec.Status))}
	if rec.Ensemble != "" {
		attrs = append(attrs, attribute.String("mlsched.ensemble", rec.Ensemble))
	}
	f.Tracer.Record(p.StepTrace, p.Trace, "mlsched.step "+rec.Name, start, err, attrs...)
}

// pipelineSpan records the span of the whole pipeline as it ends with
// res, from its submission, under the pipeline task's own trace context.
func (f *Finisher) pipelineSpan(p *pipeline.Progress, res *protocol.Result) {
	if p.Trace == "" || !f.Tracer.On() {
		return
	}
	var err error
	if res.Status != protocol.StatusSucceeded {
		err = errors.New(res.Error)
	}
	f.Tracer.Record(p.Trace, p.Parent, "mlsched.pipeline", time.UnixMilli(p.Submitted), err,
		attribute.String("mlsched.task_id", res.ID), attribute.String("mlsched.type", p.Type),
		attribute.Int("mlsched.steps", len(res.Steps)), attribute.Int("mlsched.attempts", res.Attempts),
		attribute.String("mlsched.status", string(res.Status)), attribute.String("mlsched.failed_step", res.FailedStep))
}

// pipelineStep ends a pipeline step's attempt that has a result (end):
// a success goes on to the next step, or ends the pipeline with its one
// result; a failure ends it. A member of a parallel ensemble goes on
// through memberEnded.
func (f *Finisher) pipelineStep(msg jsplumb.Msg, e *Ending) {
	res := e.Result
	if res.Status != protocol.StatusSucceeded {
		f.pipelineFailed(e, res)
		f.finish(msg, res, e.Traceparent)
		return
	}
	p, err := f.Pipelines.Open(e.Pipe)
	if err != nil {
		res.Status, res.Error, res.ErrorCode, res.Output = protocol.StatusFailed, err.Error(), protocol.CodePipelineError, nil
		f.finish(msg, res, e.Traceparent)
		return
	}
	rec := p.StepRecord(e.Submitted, res)
	f.metric().PipelineStep(rec.Type, protocol.StatusSucceeded)
	f.stepSpan(p, rec, e.Submitted, res.ID)
	if p.Fan > 0 {
		f.memberEnded(msg, e, p, rec)
		return
	}
	f.goOn(msg, e, p, rec, res.Output)
}

// memberEnded: a member of a parallel ensemble succeeded. Its record and
// output are stored under its key (MLSCHED_PIPELINE) before anything
// else; then, when every member's are there and this one's was stored
// last (the highest revision: exactly one member sees both, since the
// last store's member reads after every other's), it merges them and goes
// on after the ensemble; otherwise the step is acked and the members
// still running go on. A failed member has failed the pipeline (its
// result): the others' outputs are then never all there. Nothing stored,
// or a read that failed: the outcome comes back, and stores again (a
// newer revision: a redelivery after the ensemble went on goes on again,
// and its next step's message is then a duplicate, or its result
// refused).
func (f *Finisher) memberEnded(msg jsplumb.Msg, e *Ending, p *pipeline.Progress, rec protocol.StepRecord) {
	res := e.Result
	ctx, cancel := context.WithTimeout(context.Background(), memberTimeout)
	defer cancel()
	mine := pipeline.MemberOut{Rec: rec, Output: res.Output}
	data, err := json.Marshal(&mine)
	var rev uint64
	if err == nil {
		rev, err = f.Pipelines.StoreMember(ctx, p.MemberKey(res.ID, p.Member), data)
	}
	if err != nil {
		f.Log.Warn().Err(err).Str("task_id", res.ID).Str("step", rec.Name).Msg("ensemble member's output not stored, will retry")
		f.Complete.Settle(msg, err)
		return
	}
	outs := make([]pipeline.MemberOut, p.Members())
	for i := range outs {
		if i == p.Member {
			outs[i] = mine
			continue
		}
		b, other, found, err := f.Pipelines.LoadMember(ctx, p.MemberKey(res.ID, i))
		if err == nil && found {
			err = json.Unmarshal(b, &outs[i])
		}
		if err != nil {
			f.Complete.Settle(msg, err)
			return
		}
		if !found || other > rev { // a member still runs (or failed the pipeline), or goes on: this one is done
			f.Complete.Settle(msg, nil)
			return
		}
	}
	last := outs[len(outs)-1]
	f.goOn(msg, e, p.Join(outs), last.Rec, last.Output)
}

// memberTimeout bounds an ensemble member's store and reads.
const memberTimeout = 10 * time.Second

// goOn: the step of p ended with rec and output; the pipeline goes on to
// its next step (every member of an ensemble at once), or ends with its
// result.
func (f *Finisher) goOn(msg jsplumb.Msg, e *Ending, p *pipeline.Progress, rec protocol.StepRecord, output json.RawMessage) {
	res := e.Result
	next, payload, final, failedAt, err := p.Advance(rec, output)
	fail := func(code protocol.Code, err error, at string) {
		p.FinalResult(res, next.Steps)
		res.Status, res.Output, res.FailedStep = protocol.StatusFailed, nil, at
		res.Error, res.ErrorCode = err.Error(), code
		f.pipelineSpan(p, res)
		f.finish(msg, res, e.Traceparent)
	}
	if err != nil {
		fail(protocol.CodePipelineError, err, failedAt)
		return
	}
	if next == nil { // the end: the pipeline's result
		p.FinalResult(res, append(p.Steps, rec))
		res.Output = final
		f.pipelineSpan(p, res)
		f.finish(msg, res, e.Traceparent)
		return
	}
	nst, _ := next.Step()
	var remaining int64
	if p.Deadline > 0 {
		if remaining = p.Deadline - time.Now().UnixMilli(); remaining <= 0 {
			fail(protocol.CodeExpired, fmt.Errorf("step %s (%s): the pipeline's deadline_ms passed before it could start", nst.Name, nst.Type), nst.Name)
			return
		}
	}
	steps, payloads := []*pipeline.Progress{next}, []json.RawMessage{payload}
	if next.Starts() { // an ensemble: its members run at once
		if steps, payloads, failedAt, err = next.Fanout(); err != nil {
			fail(protocol.CodePipelineError, err, failedAt)
			return
		}
	}
	msgs := make([]*nats.Msg, len(steps))
	for i, st := range steps {
		if msgs[i], err = f.stepMsg(st, res.ID, payloads[i], remaining, e.Traceparent); err != nil {
			f.Complete.Settle(msg, err)
			return
		}
	}
	if len(msgs) == 1 {
		err = f.Complete.Publish(context.Background(), f.ResPub, msg, msgs[0], "", func(ack *jetstream.PubAck, err error) error {
			if err != nil {
				f.Log.Warn().Err(err).Str("task_id", res.ID).Str("step", nst.Name).Msg("pipeline step publish failed, will retry")
			}
			return err
		})
		if err != nil {
			f.Complete.Settle(msg, err)
		}
		return
	}
	f.publishAll(msg, res.ID, msgs)
}

// publishAll publishes the step messages of an ensemble's members and
// settles msg once every one is stored (nak'ed for redelivery at the first
// that is not: the ones stored are then duplicates, refused by their
// Nats-Msg-Id).
func (f *Finisher) publishAll(msg jsplumb.Msg, id string, msgs []*nats.Msg) {
	var left atomic.Int32
	var failed atomic.Bool
	left.Store(int32(len(msgs)))
	fail := func(err error) {
		if failed.CompareAndSwap(false, true) {
			f.Log.Warn().Err(err).Str("task_id", id).Msg("ensemble members' publish failed, will retry")
			f.Complete.Settle(msg, err)
		}
	}
	for _, m := range msgs {
		err := f.ResPub.Publish(context.Background(), m, "", func(_ *jetstream.PubAck, err error) {
			if err != nil {
				fail(err)
				return
			}
			if left.Add(-1) == 0 && !failed.Load() {
				f.Complete.Settle(msg, nil)
			}
		})
		if err != nil {
			fail(err)
			return
		}
	}
}

// stepMsg is the task message of next's running step.
func (f *Finisher) stepMsg(next *pipeline.Progress, id string, payload json.RawMessage, deadlineMs int64, traceparent string) (*nats.Msg, error) {
	st, _ := next.Step()
	if next.Trace != "" { // the next step's span, under the pipeline's
		next.StepTrace = f.Tracer.Reserve(next.Trace)
		traceparent = next.StepTrace
	}
	t := protocol.Task{ID: id, Type: st.Type, Payload: payload, Models: st.Models, TimeoutMs: st.TimeoutMs,
		MaxAttempts: st.MaxAttempts, Priority: next.Priority, Tenant: next.Tenant, Size: next.Size, DeadlineMs: deadlineMs}
	data, err := json.Marshal(&t)
	if err != nil {
		return nil, err
	}
	sealed, err := f.Pipelines.Seal(next)
	if err != nil {
		return nil, err
	}
	h := nats.Header{protocol.HdrPipeline: {sealed},
		protocol.HdrMsgID: {"p:" + id + ":" + strconv.FormatInt(next.Submitted, 10) + ":" + strconv.Itoa(next.Seq)}}
	if traceparent != "" {
		h[protocol.HdrTraceparent] = []string{traceparent}
	}
	return &nats.Msg{Subject: topology.BandTaskSubject(st.Type, next.Priority), Data: data, Header: h}, nil
}

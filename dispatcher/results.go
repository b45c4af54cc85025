package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"

	"github.com/mlsched/mlsched/dispatcher/internal/quota"
	"github.com/mlsched/mlsched/shared/jsplumb"
	"github.com/mlsched/mlsched/shared/opshttp"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
	"github.com/mlsched/mlsched/shared/tracing"
)

// finisher is the stage that ends tasks: it publishes the one final result
// of a task (results), the failed result and dead letter of a task that
// exhausted its attempts, and dead letters of messages that are no task,
// each settling the message that caused it once stored.
type finisher struct{ finisherParams }

// finisherParams is what the finisher needs.
type finisherParams struct {
	log    zerolog.Logger
	resPub *jsplumb.Publisher // results and dead letters, with room of their own
	// results publishes the results: a group commit over resPub, or
	// (nil) resPub itself.
	results  jsplumb.Sender
	complete *jsplumb.Completer
	dlq      *deadLetters
	// resultsStream reads a stored result (failExhausted).
	resultsStream jetstream.Stream
	counters      *Counters
	metrics       *metrics
	tracer        *tracing.Tracer
	// quota is told of every task that ends, for the tenants' concurrency
	// caps (tasks in flight).
	quota *quota.Limiter
	// keeper keeps tasks in progress; a task's ack takes it out (taskack.go).
	keeper *taskKeeper
	// sealer opens a pipeline's progress (pipeline.go).
	sealer *sealer
}

func newFinisher(p finisherParams) *finisher {
	if p.results == nil {
		p.results = p.resPub
	}
	return &finisher{p}
}

// resultMsg is a task's final result message. JetStream refuses it when
// the task already has one (expected last subject sequence 0), which is
// what makes the result final: a duplicate delivery, a racing replica or a
// late outcome cannot publish a second or changed result. resultStored
// reads the acknowledgement. The result's headers carry the task's W3C
// traceparent, so that whoever reads the result continues its trace.
func (f *finisher) resultMsg(res *protocol.Result, traceparent string) (*nats.Msg, error) {
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
func (f *finisher) resultStored(res *protocol.Result, ack *jetstream.PubAck, err error) (bool, error) {
	switch {
	case isWrongLastSequence(err), err == nil && ack.Duplicate:
		f.counters.Suppressed.Add(1)
		f.log.Info().Str("task_id", res.ID).Str("model", res.Model).Str("node", res.Node).Msg("task already has a final result: suppressed a second one")
		return false, nil
	case err != nil:
		f.log.Warn().Err(err).Str("task_id", res.ID).Msg("result publish failed, will retry")
		return false, err
	}
	f.counters.Results.Add(1)
	f.metrics.results.Get(opshttp.L2{A: res.Type, B: string(res.Status)}).Inc()
	if res.LatencyMs > 0 {
		f.metrics.taskDur.Get(res.Type).Observe(res.LatencyMs / 1000)
	}
	switch res.Status {
	case protocol.StatusRejected:
		f.counters.Rejected.Add(1)
	case protocol.StatusSucceeded:
		f.counters.Succeeded.Add(1)
	case protocol.StatusFailed:
		f.counters.Failed.Add(1)
		if res.ErrorCode == protocol.CodeSaturated {
			f.counters.Shed.Add(1)
		}
	}
	f.counters.types.add(res.Type, res.Status)
	f.log.Debug().Str("task_id", res.ID).Str("model", res.Model).Str("node", res.Node).Str("status", string(res.Status)).Msg("result published")
	return true, nil
}

// finish publishes the task's final result (end), then settles msg: acked once
// the result is stored (or refused as a second one), on the publisher's
// reply goroutine, with no future or settling goroutine in between.
// traceparent is the task's trace context ("" for none); with tracing on, a
// result span covers the publish.
func (f *finisher) finish(msg jsplumb.Msg, res *protocol.Result, traceparent string) {
	span := f.resultSpan(res, traceparent)
	m, err := f.resultMsg(res, span.Traceparent())
	if err == nil {
		err = f.complete.Publish(context.Background(), f.results, msg, m, "", func(ack *jetstream.PubAck, err error) error {
			_, err = f.resultStored(res, ack, err)
			span.End(err)
			return err
		})
	}
	if err != nil {
		f.log.Warn().Err(err).Str("task_id", res.ID).Msg("result publish failed, will retry")
		span.End(err)
		f.complete.Settle(msg, err)
	}
}

// ended: the task is no longer in flight for its tenant's concurrency cap.
// Taken out before its result is stored, on the caller's goroutine (one
// Redis round trip, only when some tenant is capped): a publish retried
// meanwhile lets another task in a little early, never one too many for
// long; a task whose removal fails leaves at its attempt's deadline.
func (f *finisher) ended(id string) {
	if f.quota.HasCaps() {
		f.quota.Release(context.Background(), id)
	}
}

// resultSpan starts the result span of a task (a no-op with tracing off).
func (f *finisher) resultSpan(res *protocol.Result, traceparent string) tracing.Span {
	if !f.tracer.On() {
		return f.tracer.Start(traceparent, "")
	}
	return f.tracer.Start(traceparent, "mlsched.result", attribute.String("mlsched.task_id", res.ID),
		attribute.String("mlsched.status", string(res.Status)), attribute.Int("mlsched.attempts", res.Attempts))
}

// failExhausted publishes the failed result of a task that exhausted its
// attempts and keeps the task in the dead-letter stream for an operator to
// inspect and replay, then settles msg. The dead letter is written only if
// this failure is the task's result (a racing attempt may have succeeded);
// on a redelivery our result may already be stored, so a refused publish
// looks at what is stored, and the entry's id makes a second write harmless.
func (f *finisher) failExhausted(msg jsplumb.Msg, res *protocol.Result, dl protocol.DeadLetter, submission, traceparent string) {
	span := f.resultSpan(res, traceparent)
	m, err := f.resultMsg(res, span.Traceparent())
	if err == nil {
		err = f.complete.PublishSlow(context.Background(), f.results, msg, m, "", func(ack *jetstream.PubAck, err error) error {
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
			return f.dlq.Publish(ctx, "exhausted", dl, taskEntry("exhausted", res.ID, submission))
		})
	}
	if err != nil {
		span.End(err)
		f.complete.Settle(msg, err)
	}
}

// deadLetter stores an entry about msg (which has no task to give a result
// to), then settles msg.
func (f *finisher) deadLetter(msg jsplumb.Msg, kind string, dl protocol.DeadLetter) {
	m, err := f.dlq.message(kind, dl)
	if err == nil {
		err = f.complete.Publish(context.Background(), f.resPub, msg, m, messageEntryOf(kind, msg),
			func(ack *jetstream.PubAck, err error) error { return f.dlq.stored(kind, dl, ack, err) })
	}
	if err != nil {
		f.complete.Settle(msg, err)
	}
}

func isWrongLastSequence(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
	}
	return false
}

// ending is how an attempt of a task ends, and the one value the finisher
// ends it from (end): the message whose handling ends it, the task's ack
// subject, and either the attempt's result (a success, a task error), the
// reason it ends without one (rejected before it ran, failed after its
// attempts: a result with the error, and a dead letter when it exhausted
// them), or that its result is stored already (cancelled, or found on a
// redelivery). Built by attemptSpec.ends alone.
type ending struct {
	// msg is the message whose handling ends the attempt (the task, the
	// previous attempt's outcome, a report); taskAck the task's ack subject
	// ("" when the dispatch named none, or msg is the task).
	msg     jsplumb.Msg
	taskAck string
	// result, when set, is the task's result as the attempt reported it.
	result *protocol.Result
	// stored: the task's result exists already; the attempt only settles.
	stored bool

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
	// retryAfter, when positive, is the result's retry_after_ms: a task
	// shed, expired or over its quota.
	retryAfter time.Duration
	// pipe is a pipeline step's sealed progress: a success goes on to the
	// next step, an ending is the pipeline's (pipeline.go).
	pipe string
}

// end is the one way an attempt of a task ends (the model is River's job
// completer): it releases what the attempt held (its tenant's concurrency
// slot; the keeper's entry goes with the task's ack), stores the task's
// final result (and dead letter) unless it is stored already, and then
// settles e.msg together with the task's ack, so that whichever stage ends
// a task, the task leaves MLSCHED_TASKS with its result (docs/protocol.md).
// Nothing else acks a task or builds a result of one.
func (f *finisher) end(e ending) {
	msg := f.keeper.withTask(e.msg, e.taskAck) // the keeper lets the task go with its ack
	if e.taskAck != "" && isTask(e.msg, e.taskAck) {
		f.keeper.remove(e.taskAck) // the task itself ends: nothing keeps it now
	}
	if e.task.ID != "" {
		f.ended(e.task.ID)
	}
	switch {
	case e.stored:
		f.complete.Settle(msg, nil)
	case e.result != nil && e.pipe != "":
		f.pipelineStep(msg, &e)
	case e.result != nil:
		f.finish(msg, e.result, e.traceparent)
	default:
		f.reject(msg, e)
	}
}

// reject ends a task that cannot run or succeed (end), then settles msg: a keyed
// task gets a result with the error; an unkeyable message (no usable id)
// goes to the dead-letter stream with its original bytes, and so does,
// besides its result, a task that exhausted its attempts.
func (f *finisher) reject(msg jsplumb.Msg, e ending) {
	code := protocol.CodeOf(e.err)
	if c := slices.Index(flowCodes[:], code); c >= 0 && e.task.ID != "" {
		f.counters.Ended[flowBandIndex(e.task.Priority)][c].Add(1)
	}
	if e.task.ID == "" {
		f.deadLetter(msg, "invalid", protocol.DeadLetter{Reason: protocol.Message(e.err), Code: code, Subject: e.subject, Original: e.data})
		return
	}
	res := &protocol.Result{ID: e.task.ID, Type: e.task.Type, Status: e.status, Attempts: e.attempts,
		Error: protocol.Message(e.err), ErrorCode: code, History: e.history, LatencyMs: msSince(e.submitted),
		RetryAfterMs: int(e.retryAfter.Milliseconds())}
	if e.pipe != "" { // the pipeline's result, naming the step (no dead letter: a replay would run the step alone)
		f.pipelineFailed(&e, res)
		f.finish(msg, res, e.traceparent)
		return
	}
	if e.status == protocol.StatusFailed && (code == protocol.CodeAttemptsExhausted || code == protocol.CodeSaturated) {
		f.failExhausted(msg, res, protocol.DeadLetter{Reason: res.Error, Code: code, Subject: e.subject,
			TaskID: e.task.ID, History: e.history, Original: e.data}, e.submission, e.traceparent)
		return
	}
	f.finish(msg, res, e.traceparent)
}

// hasResult reports whether the task has a stored result (false when the
// lookup fails: dispatching again is harmless, the second result is
// refused).
func (f *finisher) hasResult(ctx context.Context, id string) bool {
	_, found, _ := lookupResult(ctx, f.resultsStream, id)
	return found
}

// storedResultIs reports whether the task's stored result has that status
// and error code.
func (f *finisher) storedResultIs(ctx context.Context, id string, status protocol.Status, code protocol.Code) (bool, error) {
	r, found, err := lookupResult(ctx, f.resultsStream, id)
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

// lookupResult is the one reader of MLSCHED_RESULTS: the stored result of
// the task, decoded with the protocol's codec. found is false when the task
// has none or the lookup failed (err says which); a stored result that does
// not decode is found, with the error.
func lookupResult(ctx context.Context, results jetstream.Stream, id string) (res protocol.Result, found bool, err error) {
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

// flowBands and flowCodes label Counters.Ended: the priority bands and
// the codes of tasks flow control ends without starting them.
var (
	flowBands = [3]string{"high", "normal", "low"}
	flowCodes = [3]protocol.Code{protocol.CodeShed, protocol.CodeExpired, protocol.CodeQuotaExceeded}
)

// flowBandIndex is the priority's index in flowBands.
func flowBandIndex(priority int) int {
	switch {
	case priority > 0:
		return 0
	case priority < 0:
		return 2
	}
	return 1
}

// endedBy lists the non-zero Ended counters.
func (c *Counters) endedBy() []protocol.EndedCount {
	var out []protocol.EndedCount
	for b := range c.Ended {
		for k := range c.Ended[b] {
			if n := c.Ended[b][k].Load(); n > 0 {
				out = append(out, protocol.EndedCount{Band: flowBands[b], Code: flowCodes[k], Tasks: n})
			}
		}
	}
	return out
}

func msSince(t time.Time) float64 {
	if t.IsZero() {
		return 0
	}
	return float64(time.Since(t).Microseconds()) / 1000
}

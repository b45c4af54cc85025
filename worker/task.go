package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"

	"github.com/mlsched/mlsched/shared/jsplumb"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
	"github.com/mlsched/mlsched/worker/executor"
)

// ErrMalformedDispatch is wrapped by the error reported (as a model error)
// for a dispatch whose headers or body the node cannot use.
var ErrMalformedDispatch = errors.New("malformed dispatch")

// ErrModelNotHosted is reported (as a model error) for a dispatch naming a
// model this node does not host.
var ErrModelNotHosted = errors.New("model is not hosted on this node")

// nakDelay is how long a dispatch whose outcome could not be published waits
// before redelivery.
var nakDelay = time.Second

// dispatch is a received dispatch: the attempt and the task it runs.
type dispatch struct {
	protocol.Dispatch
	body    []byte // the task's original bytes
	payload json.RawMessage
	// priority and tenant order the node's queue (slots.go).
	priority int
	tenant   string
	size     float64
	// received is when the node got the dispatch (outcomeOf's
	// deadline_left_ms).
	received time.Time
	// outcomeID is its outcome's message id ("" until onMessage sets it
	// for a dispatch that parses: report builds it then).
	outcomeID string
}

// parseDispatch reads the headers and body. It fills what it can even on
// error, so that the outcome can still be keyed.
func parseDispatch(msg jetstream.Msg) (dispatch, error) {
	pd, herr := protocol.ParseDispatch(msg.Headers())
	d := dispatch{Dispatch: pd, body: msg.Data()}
	// Only what the worker uses: the dispatcher validated the rest, and the
	// original bytes travel on in the outcome of a failed attempt.
	head, bodyErr := protocol.DecodeTaskHead(d.body)
	if d.TaskID == "" {
		d.TaskID = head.ID // keys the outcome of a dispatch without the header
	}
	if d.Type == "" {
		d.Type = head.Type
	}
	d.payload = bytes.Clone(head.Payload) // the model's own copy: the body travels on in a failed outcome
	d.priority, d.tenant, d.size = head.Priority, head.Tenant, head.Size
	switch {
	case bodyErr != nil:
		return d, fmt.Errorf("%w: body is not a task: %v", ErrMalformedDispatch, bodyErr)
	case herr != nil:
		return d, fmt.Errorf("%w: %w", ErrMalformedDispatch, herr)
	case head.ID != d.TaskID:
		return d, fmt.Errorf("%w: the dispatch is for task %q but its body is task %q", ErrMalformedDispatch, d.TaskID, head.ID)
	}
	return d, nil
}

// onMessage is the consumer's handler. It never blocks for long: the task
// runs on its own goroutine once a slot is free (the server's MaxAckPending
// bounds what is delivered to Concurrency + Prefetch), and the slots go to
// the waiting dispatches in priority and tenant order (slots.go).
func (w *Worker) onMessage(msg jetstream.Msg) {
	w.admit.Lock()
	if w.draining.Load() {
		w.admit.Unlock()
		// Not started: hand it back for redelivery once the node is back.
		w.complete.Retry(msg, 0)
		return
	}
	w.tasks.Add(1) // until its goroutine ends, below: the one Done
	w.admit.Unlock()
	d, perr := parseDispatch(msg)
	d.received = time.Now()
	if perr == nil && w.deliveredAgain(msg, &d) {
		w.tasks.Done()
		return // the node has it, running or settled: a delivery is not an attempt
	}
	ticket := w.queue(d) // its place in the node's order, in delivery order
	go func() {
		defer w.tasks.Done()
		// Keep the dispatch ours while it waits, runs and until its outcome
		// is stored (report hands stop to the outcome publisher).
		stop := progressTimer(w.complete, msg, w.cfg.AckWait/3)
		if perr == nil && w.reportAgain(msg, d, stop) {
			return // run before; its outcome is reported again, not the task run again
		}
		m := w.models[d.Model]
		if perr == nil && m != nil && m.batch != nil {
			w.processBatched(msg, d, m, ticket, stop) // batch.go
			return
		}
		w.enter(m, ticket)
		defer w.leave(m)
		w.process(msg, d, perr, stop)
	}()
}

// process runs one dispatch (parsed, perr telling why it cannot run) and
// reports its outcome, then acks. stopProgress ends the dispatch's
// progress signals; the outcome publisher calls it once it owns msg.
func (w *Worker) process(msg jetstream.Msg, d dispatch, perr error, stopProgress func()) {
	log := w.taskLog(d)
	out := w.outcomeOf(d)
	m := w.models[d.Model]
	ran := false
	switch {
	case perr != nil:
		out.Status, out.Error = protocol.OutcomeModelError, perr.Error()
	case m == nil:
		out.Status, out.Error = protocol.OutcomeModelError, fmt.Sprintf("%v: %q on node %q", ErrModelNotHosted, d.Model, w.node)
	case notStarted(m, d, &out):
	default:
		ran = true
		// One line per run, at debug: the chaos tests count a task's runs
		// from them (no task may run more than its max_attempts).
		log.Debug().Msg(runLogMessage)
		if !w.run(m, d, &out) {
			stopProgress()
			w.delivered.forget(d.outcomeID)
			log.Warn().Msg("task unfinished at shutdown; nak'ed for redelivery")
			w.complete.Retry(msg, 0)
			return
		}
	}
	w.finish(msg, d, out, ran, log, stopProgress)
}

// runLogMessage is the debug line a dispatch logs as its model starts.
const runLogMessage = "running the task"

// deliveredAgain reports whether msg is a delivery of a dispatch the node
// has (redelivered.go), and settles it if so: left to the delivery that
// runs it, or acked when its outcome is settled. It sets d's outcome id.
func (w *Worker) deliveredAgain(msg jetstream.Msg, d *dispatch) bool {
	if d.TaskID == "" {
		return false
	}
	d.outcomeID = protocol.MsgID("o", d.TaskID, d.Submission, d.Attempt)
	meta, err := msg.Metadata()
	if err != nil || d.Deadline.IsZero() {
		return false
	}
	key := deliveryKey{seq: meta.Sequence.Stream, stored: meta.Timestamp.UnixNano()}
	switch w.delivered.begin(d.outcomeID, key, d.Deadline) {
	case deliveryDuplicate:
		log := w.taskLog(*d)
		log.Info().Uint64("delivered", meta.NumDelivered).
			Msg("dispatch delivered again while this node has it: left to the delivery that runs it, not run twice")
		return true
	case deliveryDone:
		log := w.taskLog(*d)
		log.Info().Uint64("delivered", meta.NumDelivered).
			Msg("dispatch delivered again after its outcome was settled (its ack was lost): acked, not run again")
		w.complete.Settle(msg, nil)
		return true
	}
	return false
}

// reportAgain reports the kept outcome of a dispatch that ran on this node
// and whose outcome could not be stored (unreported.go), and says whether
// there was one.
func (w *Worker) reportAgain(msg jetstream.Msg, d dispatch, stop func()) bool {
	if d.TaskID == "" || w.unstored.kept.Load() == 0 {
		return false // nearly always: no id to build, no lock taken
	}
	msgID := d.outcomeID
	body, ok := w.unstored.take(msgID)
	if !ok {
		return false
	}
	log := w.taskLog(d)
	log.Info().Msg("dispatch back after its outcome was not stored: reporting that outcome again, not running the task again")
	om := &nats.Msg{Subject: topology.OutcomeSubject(w.node), Data: body, Header: protocol.OutcomeHeader(msg.Headers(), w.node)}
	if err := w.outcomes.publish(om, msgID, "", msg, log, stop); err != nil {
		stop()
		log.Error().Err(err).Msg("outcome not published; dispatch nak'ed for redelivery")
		w.complete.Settle(msg, err)
	}
	return true
}

// taskLog is the logger of one dispatch.
func (w *Worker) taskLog(d dispatch) zerolog.Logger {
	return w.log.With().Str("task_id", d.TaskID).Str("model", d.Model).Int("attempt", d.Attempt).Logger()
}

// outcomeOf is the outcome of d before it is decided.
func (w *Worker) outcomeOf(d dispatch) protocol.Outcome {
	o := protocol.Outcome{TaskID: d.TaskID, Type: d.Type, Attempt: d.Attempt, Model: d.Model, Node: w.node}
	if !d.Deadline.IsZero() && !d.received.IsZero() {
		o.DeadlineLeftMs = ms(d.Deadline.Sub(d.received))
	}
	return o
}

// ms is d in milliseconds, as outcomes give durations.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// notStarted reports, filling out, whether d is too late to start on m:
// its deadline has passed, or leaves less than the model's mean run here
// (a batching model's: its batches' mean run).
func notStarted(m *hosted, d dispatch, out *protocol.Outcome) bool {
	switch {
	case !time.Now().Before(d.Deadline):
		out.Status, out.Error = protocol.OutcomeExpired, fmt.Sprintf("deadline %s passed before the task started", d.Deadline.UTC().Format(time.RFC3339Nano))
	case time.Until(d.Deadline) < m.typicalRun():
		// Started now, it would more likely be cut at the deadline than
		// finish: a timeout charged to the model for time spent queued (a
		// node that orders its queue starts the last of a band late), and
		// a slot taken from work that can finish. Not started, it costs
		// the model nothing and the dispatcher retries it or lets it expire.
		out.Status, out.Error = protocol.OutcomeExpired, fmt.Sprintf("deadline %s leaves %v, less than the model's mean run of %v on this node: not started",
			d.Deadline.UTC().Format(time.RFC3339Nano), time.Until(d.Deadline).Round(time.Millisecond), m.typicalRun().Round(time.Millisecond))
	default:
		return false
	}
	return true
}

// tooLate reports whether a dispatch with this deadline is too late to
// start at now on a model whose mean run is run: notStarted's rule.
func tooLate(deadline time.Time, run time.Duration, now time.Time) bool {
	return !now.Before(deadline) || deadline.Sub(now) < run
}

// finish counts, logs and reports a decided outcome; the outcome
// publisher acks msg once it is stored (else msg is nak'ed).
func (w *Worker) finish(msg jetstream.Msg, d dispatch, out protocol.Outcome, ran bool, log zerolog.Logger, stopProgress func()) {
	w.metrics.observe(&out, ran)
	if out.Status != protocol.OutcomeSuccess {
		if json.Valid(d.body) {
			out.Task = d.body
		} else {
			out.Task, _ = json.Marshal(string(d.body))
		}
	}
	lev := zerolog.DebugLevel // successes are the bulk: count them, don't log them
	if out.Status != protocol.OutcomeSuccess {
		lev = zerolog.WarnLevel
	}
	ev := log.WithLevel(lev).Str("status", string(out.Status)).Float64("latency_ms", out.LatencyMs)
	if out.Error != "" {
		ev = ev.Str("error", out.Error)
	}
	ev.Msg("task done")

	// The outcome publisher acks the dispatch once the outcome is stored.
	if err := w.report(msg, d, out, log, stopProgress); err != nil {
		stopProgress()
		w.delivered.forget(d.outcomeID)
		log.Error().Err(err).Msg("outcome not published; dispatch nak'ed for redelivery")
		w.complete.Settle(msg, err)
	}
}

// run executes the task and fills out's status, output, error and latency.
// It returns false when the worker shut down before the task finished.
func (w *Worker) run(m *hosted, d dispatch, out *protocol.Outcome) bool {
	timeout := d.Timeout
	if timeout <= 0 {
		timeout = m.timeout
	}
	// One clock for the timeout and the latency: a timed-out attempt never
	// reports a latency below its timeout, however long the set-up below takes.
	start := time.Now()
	deadline := start.Add(timeout)
	if d.Deadline.Before(deadline) {
		deadline = d.Deadline
	}
	ctx, cancel := context.WithDeadline(w.taskCtx, deadline)
	defer cancel()

	type result struct {
		out json.RawMessage
		err error
	}
	res := make(chan result, 1)
	span := w.tracer.Start(d.Traceparent, "mlsched.execute")
	if w.tracer.On() {
		span.SetAttributes(attribute.String("mlsched.task_id", d.TaskID), attribute.String("mlsched.model", d.Model),
			attribute.String("mlsched.node", w.node), attribute.Int("mlsched.attempt", d.Attempt))
	}
	traceparent := span.Traceparent() // the model server's request is a child of the execution
	go func() {
		defer func() {
			if p := recover(); p != nil {
				w.log.Error().Str("task_id", d.TaskID).Str("model", d.Model).Interface("panic", p).
					Str("stack", string(debug.Stack())).Msg("model panicked")
				res <- result{err: fmt.Errorf("model panicked: %v", p)}
			}
		}()
		o, err := m.exec.Run(ctx, executor.Task{ID: d.TaskID, Type: d.Type, Model: d.Model, Attempt: d.Attempt,
			Payload: d.payload, Size: d.size, Traceparent: traceparent})
		res <- result{o, err}
	}()
	var r result
	select {
	case r = <-res:
	case <-ctx.Done():
		// A model that ignores ctx is abandoned: the attempt has timed out.
		r = result{err: ctx.Err()}
	}
	out.LatencyMs = float64(time.Since(start)) / float64(time.Millisecond)
	if r.err == nil {
		m.observeRun(time.Since(start))
	}
	span.End(r.err)
	if errors.Is(context.Cause(ctx), errShutdown) {
		return false
	}
	timedOut := errors.Is(r.err, context.DeadlineExceeded) || (ctx.Err() != nil && errors.Is(r.err, context.Canceled))
	settle(out, r.out, r.err, timedOut, timeout, deadline.Equal(d.Deadline))
	return true
}

// settle fills out's status, output and error from what the model
// answered: timedOut when it was cut at its deadline (atDispatchDeadline:
// the dispatch's, else the timeout's).
func settle(out *protocol.Outcome, output json.RawMessage, err error, timedOut bool, timeout time.Duration, atDispatchDeadline bool) {
	switch {
	case timedOut:
		out.Status, out.Error = protocol.OutcomeTimeout, fmt.Sprintf("no answer within %v", timeout.Round(time.Millisecond))
		if atDispatchDeadline {
			out.Error = fmt.Sprintf("no answer before the dispatch deadline (timeout %v)", timeout.Round(time.Millisecond))
		}
	case err == nil:
		out.Status, out.Output = protocol.OutcomeSuccess, output
		if !json.Valid(out.Output) {
			out.Output, _ = json.Marshal(string(output))
		}
	case executor.IsTaskError(err):
		out.Status, out.Error = protocol.OutcomeTaskError, err.Error()
	default:
		out.Status, out.Error = protocol.OutcomeModelError, err.Error()
	}
}

// report hands the outcome, with every dispatch header echoed, to the
// outcome publisher, which acks msg once the outcome is stored and then
// calls stop. On error nothing was published and the caller still owns msg.
func (w *Worker) report(msg jetstream.Msg, d dispatch, out protocol.Outcome, log zerolog.Logger, stop func()) error {
	body, err := protocol.EncodeOutcome(&out)
	if err != nil {
		return fmt.Errorf("encode outcome: %w", err)
	}
	om := &nats.Msg{Subject: topology.OutcomeSubject(w.node), Data: body, Header: protocol.OutcomeHeader(msg.Headers(), w.node)}
	msgID := d.outcomeID
	if msgID == "" {
		id := d.TaskID
		if id == "" {
			if md, err := msg.Metadata(); err == nil {
				id = fmt.Sprintf("seq-%d", md.Sequence.Stream)
			}
		}
		msgID = protocol.MsgID("o", id, d.Submission, d.Attempt)
	}
	direct := ""
	if out.Status == protocol.OutcomeSuccess { // the bulk; anything else may need the stream's redelivery
		direct = topology.ReportSubject(w.node)
	}
	if err := w.outcomes.publish(om, msgID, direct, msg, log, stop); err != nil {
		return fmt.Errorf("publish outcome: %w", err)
	}
	return nil
}

// progressTimer keeps msg in progress every interval until stop: a timer,
// not a goroutine per task.
func progressTimer(c *jsplumb.Completer, msg jetstream.Msg, every time.Duration) (stop func()) {
	var mu sync.Mutex
	stopped := false
	var t *time.Timer
	mu.Lock()
	defer mu.Unlock()
	t = time.AfterFunc(every, func() {
		c.Progress(msg)
		mu.Lock()
		defer mu.Unlock()
		if !stopped {
			t.Reset(every)
		}
	})
	return func() {
		mu.Lock()
		defer mu.Unlock()
		stopped = true
		t.Stop()
	}
}

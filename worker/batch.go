package worker

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"

	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/tracing"
	"github.com/mlsched/mlsched/worker/executor"
)

// Dynamic batching (docs/models.md, "Batching"). A model with a batch
// section gets a batcher: the dispatches for it wait in the batcher, not
// for a node slot each, and the batcher runs up to max_size of them in one
// call on one node slot once the batch is full or its first task is due,
// whichever comes first; at once when the model's tasks arrive further
// apart than max_delay (waiting would gather nobody). A task is due when
// it has waited max_delay, or earlier when its deadline cannot wait: its remaining time less the
// model's mean batch run (and a margin) is all it may be held. The node's
// order decides who goes: the batch waits for a slot at the place of its
// best waiting task (priority, then tenants in turn), and when it gets one
// the best max_size waiting tasks make it up, those whose deadline cannot
// wait for another batch first (take).
//
// Everything else stays per task: a task too close to its deadline when
// its batch starts is reported expired without running, as a lone task
// would be; each task gets its own outcome from the call's results, its
// latency is its own wait for the batch plus the call, and it is reported
// and acked on its own goroutine as before.

// batcher gathers one batching model's dispatches and runs them in batches.
type batcher struct {
	w     *Worker
	m     *hosted
	size  int
	delay time.Duration
	kick  chan struct{}

	mu      sync.Mutex
	pending []*batchItem
	stopped bool
	// last is the latest arrival and gap the moving mean of the gaps
	// between arrivals (each capped at twice max_delay; 0 until a second
	// arrival): a model whose tasks come further apart than max_delay
	// would gather no company by waiting (sparse).
	last time.Time
	gap  time.Duration
}

// sparse reports whether, at the current arrival rate, a waiting batch is
// not expected to gain another task before max_delay: it then goes when
// a slot is free instead of waiting, so that light load does not pay the
// delay for nothing. Under load the gaps shrink and batches wait to fill.
func (b *batcher) sparseLocked() bool { return b.gap > b.delay }

// batchItem is one dispatch waiting for, or running in, a batch.
type batchItem struct {
	slotTicket
	d       dispatch
	arrived time.Time
	// held is how long it waited for its batch to fill or fall due (set
	// when the batch goes): the outcome's batch_wait_ms and the metric's
	// batch queue delay. Its batch's wait for a slot after that is not in
	// it.
	held time.Duration
	res  chan batchResult
}

// batchResult is a batched dispatch's decided outcome; shutdown when the
// worker stopped before it ran (it is then nak'ed for redelivery).
type batchResult struct {
	out      protocol.Outcome
	ran      bool
	shutdown bool
}

func newBatcher(w *Worker, m *hosted) *batcher {
	return &batcher{w: w, m: m, size: max(m.spec.BatchSize(), 1), delay: m.spec.BatchDelay(), kick: make(chan struct{}, 1)}
}

// processBatched hands a dispatch of a batching model to its batcher,
// waits for its outcome and reports it (task.go's process, for a batch).
func (w *Worker) processBatched(msg jetstream.Msg, d dispatch, m *hosted, t slotTicket, stop func()) {
	m.inFlight.Add(1) // waiting or running, as announced
	defer m.inFlight.Add(-1)
	log := w.taskLog(d)
	r := m.batch.submit(d, t)
	if r.shutdown {
		stop()
		w.delivered.forget(d.outcomeID)
		log.Warn().Msg("task unfinished at shutdown; nak'ed for redelivery")
		w.complete.Retry(msg, 0)
		return
	}
	w.finish(msg, d, r.out, r.ran, log, stop)
}

// submit queues d for the next batch and returns its outcome once decided.
func (b *batcher) submit(d dispatch, t slotTicket) batchResult {
	it := &batchItem{slotTicket: t, d: d, arrived: time.Now(), res: make(chan batchResult, 1)}
	b.mu.Lock()
	if b.stopped {
		b.mu.Unlock()
		return batchResult{shutdown: true}
	}
	b.pending = append(b.pending, it)
	if !b.last.IsZero() {
		g := min(it.arrived.Sub(b.last), 2*b.delay)
		if b.gap == 0 {
			b.gap = g
		} else {
			b.gap += (g - b.gap) / 8
		}
	}
	b.last = it.arrived
	b.mu.Unlock()
	select {
	case b.kick <- struct{}{}:
	default:
	}
	return <-it.res
}

// held reports how many dispatches wait in the batcher (a dispatch is
// counted as waiting by the node before its goroutine reaches submit).
func (b *batcher) held() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.pending)
}

// due is when it must leave: max_delay after it arrived, or earlier when
// its deadline leaves no more (latest).
func (b *batcher) due(it *batchItem) time.Time {
	due := it.arrived.Add(b.delay)
	if latest, ok := b.latest(it, b.m.typicalRun()); ok && latest.Before(due) {
		due = latest
	}
	return due
}

// latest is when it must leave for its deadline (ok false: it has none):
// the model's mean batch run (run) and a margin before it.
func (b *batcher) latest(it *batchItem, run time.Duration) (time.Time, bool) {
	if it.d.Deadline.IsZero() {
		return time.Time{}, false
	}
	// The margin covers the mean's error and the way from the decision to
	// the call (a slot, the call's set-up): a quarter of the mean run, 2 ms,
	// and a tenth of the task's time here (the mean is 0 until measured).
	margin := run/4 + 2*time.Millisecond + it.d.Deadline.Sub(it.arrived)/10
	return it.d.Deadline.Add(-run - margin), true
}

// run forms and starts batches until ctx ends, then fails what waits as
// unfinished at shutdown.
func (b *batcher) run(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		b.mu.Lock()
		n := len(b.pending)
		var next time.Time
		var lead *batchItem
		for _, it := range b.pending {
			if due := b.due(it); next.IsZero() || due.Before(next) {
				next = due
			}
			if lead == nil || it.before(lead) {
				lead = it
			}
		}
		sparse := b.sparseLocked()
		b.mu.Unlock()
		if n == 0 || (n < b.size && time.Now().Before(next) && !sparse) {
			wait := time.Hour
			if n > 0 {
				wait = time.Until(next)
			}
			timer.Reset(wait)
			select {
			case <-b.kick:
			case <-timer.C:
			case <-ctx.Done():
				b.stop()
				return
			}
			continue
		}
		decided := time.Now()
		// The batch goes: a token of the model's limit if it has one, then
		// a node slot at its best task's place in the node's order.
		if b.m.limit != nil {
			select {
			case b.m.limit <- struct{}{}:
			case <-ctx.Done():
				b.stop()
				return
			}
		}
		b.w.slots.wait(lead.slotTicket)
		items := b.take(decided)
		b.w.waiting.Add(-int64(len(items)))
		go b.exec(ctx, items)
	}
}

// before orders items as the node's slots do.
func (it *batchItem) before(o *batchItem) bool {
	if it.priority != o.priority {
		return it.priority > o.priority
	}
	if it.tag != o.tag {
		return it.tag < o.tag
	}
	return it.seq < o.seq
}

// take removes the batch that goes now from what waits, and sets how long
// each was held for its batch (decided: when the batch was decided). The
// batch is up to size tasks: first those that cannot wait for another
// batch (their latest is before one mean run from now: the earliest the
// next batch on this slot could start), then the rest, each group in the
// node's order. Those too late to run at all go too, without taking a
// place: exec reports them expired at once, as lone tasks would be.
func (b *batcher) take(decided time.Time) []*batchItem {
	now, run := time.Now(), b.m.typicalRun()
	b.mu.Lock()
	defer b.mu.Unlock()
	type ranked struct {
		it   *batchItem
		rank int // 0 too late to run, 1 cannot wait, 2 can wait
	}
	rs := make([]ranked, len(b.pending))
	for i, it := range b.pending {
		rs[i] = ranked{it, 2}
		if latest, ok := b.latest(it, run); ok {
			switch {
			case tooLate(it.d.Deadline, run, now):
				rs[i].rank = 0
			case latest.Before(now.Add(run)):
				rs[i].rank = 1
			}
		}
	}
	slices.SortFunc(rs, func(x, y ranked) int {
		switch {
		case x.rank != y.rank:
			return x.rank - y.rank
		case x.it.before(y.it):
			return -1
		case y.it.before(x.it):
			return 1
		}
		return 0
	})
	n, places := 0, 0
	for n < len(rs) && (rs[n].rank == 0 || places < b.size) {
		if rs[n].rank != 0 {
			places++
		}
		n++
	}
	items := make([]*batchItem, n)
	for i := range n {
		items[i] = rs[i].it
		items[i].held = max(decided.Sub(items[i].arrived), 0)
	}
	b.pending = b.pending[:0]
	for _, r := range rs[n:] {
		b.pending = append(b.pending, r.it)
	}
	return items
}

// stop ends the batcher: what waits is handed back for redelivery.
func (b *batcher) stop() {
	b.mu.Lock()
	b.stopped = true
	items := b.pending
	b.pending = nil
	b.mu.Unlock()
	b.w.waiting.Add(-int64(len(items)))
	for _, it := range items {
		it.res <- batchResult{shutdown: true}
	}
}

// exec runs one batch on the slot (and limit token) taken for it, gives
// them back, and hands each item its outcome.
func (b *batcher) exec(ctx context.Context, items []*batchItem) {
	w, m := b.w, b.m
	released := false
	release := func() {
		if released {
			return
		}
		released = true
		w.slots.release()
		if m.limit != nil {
			<-m.limit
		}
	}
	defer release()
	// Too late to start: reported expired without running, as lone tasks.
	run := items[:0:0]
	for _, it := range items {
		out := w.outcomeOf(it.d)
		if notStarted(m, it.d, &out) {
			out.BatchWaitMs = ms(it.held)
			it.res <- batchResult{out: out}
			continue
		}
		if w.log.GetLevel() <= zerolog.DebugLevel {
			l := w.taskLog(it.d)
			l.Debug().Int("batch", len(items)).Msg(runLogMessage)
		}
		run = append(run, it)
	}
	if len(run) == 0 {
		return
	}
	n := int64(len(run))
	w.inFlight.Add(n)
	start := time.Now()
	tasks := make([]executor.Task, len(run))
	deadlines := make([]time.Time, len(run))
	timeouts := make([]time.Duration, len(run))
	spans := make([]tracing.Span, len(run))
	var callDeadline time.Time
	for i, it := range run {
		d := it.d
		timeouts[i] = d.Timeout
		if timeouts[i] <= 0 {
			timeouts[i] = m.timeout
		}
		deadlines[i] = start.Add(timeouts[i])
		if d.Deadline.Before(deadlines[i]) {
			deadlines[i] = d.Deadline
		}
		callDeadline = maxTime(callDeadline, deadlines[i])
		spans[i] = w.tracer.Start(d.Traceparent, "mlsched.execute")
		if w.tracer.On() {
			spans[i].SetAttributes(attribute.String("mlsched.task_id", d.TaskID), attribute.String("mlsched.model", d.Model),
				attribute.String("mlsched.node", w.node), attribute.Int("mlsched.attempt", d.Attempt), attribute.Int("mlsched.batch", len(run)))
		}
		tasks[i] = executor.Task{ID: d.TaskID, Type: d.Type, Model: d.Model, Attempt: d.Attempt, Payload: d.payload,
			Size: d.size, Traceparent: spans[i].Traceparent()}
		w.metrics.batchDelay(m.spec.Name, it.held)
	}
	w.metrics.batchSize(m.spec.Name, len(run))
	cctx, cancel := context.WithDeadline(ctx, callDeadline)
	defer cancel()
	type answer struct {
		rs  []executor.Result
		err error
	}
	ans := make(chan answer, 1)
	go func() {
		rs, err := executor.RunBatch(cctx, m.exec, tasks)
		ans <- answer{rs, err}
	}()
	var a answer
	select {
	case a = <-ans:
	case <-cctx.Done():
		a = answer{err: cctx.Err()} // a model that ignores ctx is abandoned
	}
	took := time.Since(start)
	end := start.Add(took)
	if a.err == nil {
		m.observeRun(took)
	}
	w.inFlight.Add(-n)
	release()
	shutdown := errors.Is(context.Cause(cctx), errShutdown)
	callTimedOut := a.err != nil && (errors.Is(a.err, context.DeadlineExceeded) || (cctx.Err() != nil && errors.Is(a.err, context.Canceled)))
	for i, it := range run {
		if shutdown {
			spans[i].End(context.Cause(cctx))
			it.res <- batchResult{shutdown: true}
			continue
		}
		out := w.outcomeOf(it.d)
		// Its latency is its wait for the batch plus the call; the wait
		// for the batch's slot after that is not in it, as a lone
		// task's wait for its slot is not.
		out.LatencyMs, out.BatchWaitMs = ms(it.held+took), ms(it.held)
		var output []byte
		err := a.err
		if err == nil {
			output, err = a.rs[i].Output, a.rs[i].Err
		}
		// A task whose own deadline passed during the call timed out,
		// whatever the call answered later.
		timedOut := callTimedOut || a.err == nil && end.After(deadlines[i])
		settle(&out, output, err, timedOut, timeouts[i], deadlines[i].Equal(it.d.Deadline))
		spans[i].End(err)
		it.res <- batchResult{out: out, ran: true}
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

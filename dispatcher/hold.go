package dispatcher

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mlsched/mlsched/shared/jsplumb"
	"github.com/mlsched/mlsched/shared/lifecycle"
	"github.com/mlsched/mlsched/shared/policy"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// Backpressure. When every candidate of a task is saturated (its nodes hold
// more work than they can start before the dispatch's deadline), sending it
// would only bury a node: the attempt would expire in the queue or be cut
// by its deadline, and count against a model that did nothing wrong. So the
// dispatcher keeps the task instead: the message stays unacknowledged in
// MLSCHED_TASKS (or MLSCHED_OUTCOMES for a retry), kept alive with
// InProgress, and is decided again, oldest first, whenever an outcome frees
// a slot or the table is refreshed. Held messages count against the
// consumer's MaxAckPending, so a saturated replica pulls less. A task waits
// at most its own deadline (timeout plus slack), then fails with
// CodeSaturated. On shutdown held messages are nak'ed for another replica.

// holdRetry is how often held tasks are decided again without an outcome
// to prompt it.
const holdRetry = 100 * time.Millisecond

// holdLogEvery bounds the rate of the saturation log line.
const holdLogEvery = 5 * time.Second

type heldTask struct {
	a        attemptSpec
	msg      jsplumb.Msg
	since    time.Time // when it was first held
	until    time.Time // its deadline: fail after
	expiry   time.Time // the task's own deadline (zero: none)
	progress time.Time // last InProgress
}

// holdRoom is the replica's list of held tasks, oldest first.
type holdRoom struct {
	mu      sync.Mutex
	q       []*heldTask
	kick    chan struct{}
	stopped bool
	// n is len(q), readable without mu: wake costs nothing while nothing
	// is held (every outcome calls it).
	n atomic.Int64

	lastLog  time.Time
	unlogged int64
}

func newHoldRoom() *holdRoom { return &holdRoom{kick: make(chan struct{}, 1)} }

// wake prompts the hold loop (an outcome freed a slot). While nothing is
// held it does nothing: waking the loop for every outcome cost a goroutine
// switch each. A task held at the same moment is retried within holdRetry.
func (h *holdRoom) wake() {
	if h.n.Load() == 0 {
		return
	}
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

func (h *holdRoom) reopen() {
	h.mu.Lock()
	h.stopped = false
	h.mu.Unlock()
}

func (h *holdRoom) len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.q)
}

// hold keeps a saturated task; it reports false when the room is closed
// (shutting down), and the caller then naks the message.
func (in *intake) hold(a attemptSpec, msg jsplumb.Msg, dec policy.Decision, wait time.Duration, expiry time.Time) bool {
	h := in.held
	now := time.Now()
	h.mu.Lock()
	if h.stopped {
		h.mu.Unlock()
		return false
	}
	since := a.heldSince
	if since.IsZero() {
		since = now
		in.counters.Saturated.Add(1)
	}
	a.heldSince = since
	until := since.Add(wait)
	if !expiry.IsZero() && expiry.Before(until) {
		until = expiry
	}
	h.q = append(h.q, &heldTask{a: a, msg: msg, since: since, until: until, expiry: expiry, progress: now})
	h.n.Store(int64(len(h.q)))
	logNow := now.Sub(h.lastLog) >= holdLogEvery
	h.unlogged++
	n, held := h.unlogged, len(h.q)
	if logNow {
		h.lastLog, h.unlogged = now, 0
	}
	h.mu.Unlock()
	if logNow {
		in.log.Warn().Str("type", a.task.Type).Str("model", dec.Model).Str("node", dec.Node).Int64("newly_held", n).Int("held", held).
			Msg("saturated: every candidate's nodes hold more work than they can start before the deadline; keeping tasks in the stream")
	}
	return true
}

// holdService runs the hold loop as a component.
func (in *intake) holdService() lifecycle.Service {
	return lifecycle.Run(func(ctx context.Context, ready func()) error {
		in.held.reopen()
		ready()
		in.holdLoop(ctx)
		return nil
	})
}

// holdLoop decides again for held tasks until ctx is done, then naks
// whatever is still held.
func (in *intake) holdLoop(ctx context.Context) {
	t := time.NewTicker(holdRetry)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			in.releaseHeld()
			return
		case <-t.C:
		case <-in.held.kick:
		}
		in.retryHeld()
	}
}

// retryHeld takes the held tasks, oldest first, and dispatches those whose
// type is no longer saturated; a type found saturated is not decided again
// in this pass. Tasks past their deadline fail; tasks cancelled meanwhile
// are dropped (their result is stored), never dispatched.
func (in *intake) retryHeld() {
	h := in.held
	h.mu.Lock()
	q := h.q
	h.q = nil
	h.n.Store(0)
	h.mu.Unlock()
	if len(q) == 0 {
		return
	}
	now := time.Now()
	table := in.snaps.table.Load()
	var saturated []string
	var keep []*heldTask
	for i, ht := range q {
		t := &ht.a.task
		if in.superseded.Cancelled(t.ID, ht.a.submission) { // cancelled while held: it has its result
			in.complete.Settle(ht.msg, nil)
			continue
		}
		if !ht.expiry.IsZero() && !now.Before(ht.expiry) {
			in.expire(&ht.a, ht.msg, ht.expiry, "while it was held for want of capacity")
			continue
		}
		if now.After(ht.until) {
			in.failSaturated(ht)
			continue
		}
		if !containsStr(saturated, t.Type) {
			req := in.request(&ht.a)
			dec, err := in.engine.Decide(table, &req)
			if err != nil || !dec.Saturated {
				// dispatch decides again (and handles an error)
				in.dispatch(ht.a, ht.msg)
				continue
			}
			saturated = append(saturated, t.Type)
		}
		if now.Sub(ht.progress) >= in.cfg.AckWait/3 {
			in.complete.Progress(ht.msg)
			ht.progress = now
		}
		keep = append(keep, q[i])
	}
	h.mu.Lock()
	// tasks held meanwhile come after the older ones
	h.q = append(keep, h.q...)
	h.n.Store(int64(len(h.q)))
	h.mu.Unlock()
}

func (in *intake) failSaturated(ht *heldTask) {
	a := &ht.a
	waited := time.Since(ht.since).Round(time.Millisecond)
	models := make([]string, 0, 4)
	if table := in.snaps.table.Load(); table != nil {
		for _, c := range table.Candidates(a.task.Type) {
			if len(a.task.Models) == 0 || containsStr(a.task.Models, c.Model) {
				models = append(models, c.Model)
			}
		}
	}
	err := protocol.Errorf(protocol.CodeSaturated, "no node could start the task before its deadline: every candidate for type %q (%s) stayed saturated for %s, the task's timeout plus the deadline slack",
		a.task.Type, strings.Join(models, ", "), waited)
	in.log.Warn().Err(err).Str("task_id", a.task.ID).Int("attempt", a.attempt).Msg("task failed: saturated")
	in.fin.reject(ht.msg, ending{subject: topology.TaskSubject(a.task.Type), data: a.data, task: a.task, err: err, status: protocol.StatusFailed,
		history: a.history, attempts: a.attempt - 1, submitted: a.submitted, submission: a.submission,
		traceparent: a.traceparent})
}

// releaseHeld naks every held message, for another replica or a restart.
func (in *intake) releaseHeld() {
	h := in.held
	h.mu.Lock()
	q := h.q
	h.q, h.stopped = nil, true
	h.n.Store(0)
	h.mu.Unlock()
	for _, ht := range q {
		in.complete.Retry(ht.msg, 0)
	}
}

func containsStr(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

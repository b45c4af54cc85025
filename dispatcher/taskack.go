package dispatcher

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mlsched/mlsched/shared/jsplumb"
)

// A task stays unacknowledged in MLSCHED_TASKS until its final result is
// stored: the task message is the durable record of the task while it runs,
// so the attempt streams (MLSCHED_DISPATCH, MLSCHED_OUTCOMES) need no fsync
// of their own and may live in memory (docs/protocol.md, "What is stored
// where, and why nothing is lost"). A crash that loses an attempt loses no
// task: the server redelivers the task once its ack wait passes, and intake
// dispatches it again (or acks it, when its result exists).
//
// The task's ack subject travels with every attempt (Dispatch.TaskAck), so
// that whichever replica stores the result acks the task (finalMsg), and
// the replica that dispatched an attempt keeps the task in progress until
// the attempt's deadline (taskKeeper). Every ack, nak and in-progress
// signal still goes through the Completer.

// subjectMsg is a message known only by its ack subject (a task whose
// attempt another replica dispatched), settled as the server expects.
type subjectMsg struct {
	nc   *nats.Conn
	subj string
}

var _ jsplumb.Msg = subjectMsg{}

// taskAcker is a message of the keeper's: its Ack acks the task of the
// subject it names (ok), or no task (a dispatch's message acks the task's
// outcome, or nothing). The task pruner reads it (taskprune.go).
type taskAcker interface {
	ackedTask() (subject string, ok bool)
}

func (m subjectMsg) ackedTask() (string, bool)  { return m.subj, true }
func (f finalMsg) ackedTask() (string, bool)    { return f.task.subj, true }
func (dispatchedMsg) ackedTask() (string, bool) { return "", false }

func (m subjectMsg) Ack() error                         { return m.nc.Publish(m.subj, []byte("+ACK")) }
func (m subjectMsg) NakWithDelay(d time.Duration) error { return m.nc.Publish(m.subj, []byte("-NAK")) }
func (m subjectMsg) InProgress() error                  { return m.nc.Publish(m.subj, []byte("+WPI")) }

// finalMsg is a message whose handling stores the task's final result (an
// outcome, a report, or a task rejected at a retry): acked, it acks the
// task first, then itself. A nak or in-progress concerns itself only.
type finalMsg struct {
	jsplumb.Msg
	task subjectMsg
	keep *taskKeeper
}

func (f finalMsg) Ack() error {
	f.keep.remove(f.task.subj)
	return errors.Join(f.task.Ack(), f.Msg.Ack())
}

// withTask returns msg, or, when the dispatch names its task's ack subject
// and msg is not the task itself, a finalMsg that also acks the task.
func (k *taskKeeper) withTask(msg jsplumb.Msg, taskAck string) jsplumb.Msg {
	if k == nil || taskAck == "" || isTask(msg, taskAck) {
		return msg
	}
	return finalMsg{Msg: msg, task: subjectMsg{nc: k.nc, subj: taskAck}, keep: k}
}

// Release is msg, whose settling also acks the task taskAck acknowledges
// (withTask); when msg is the task itself, nothing keeps it from now on
// (finish.Keeper).
func (k *taskKeeper) Release(msg jsplumb.Msg, taskAck string) jsplumb.Msg {
	if taskAck != "" && isTask(msg, taskAck) {
		k.remove(taskAck)
	}
	return k.withTask(msg, taskAck)
}

// isTask reports whether msg is the task message taskAck acknowledges.
func isTask(msg jsplumb.Msg, taskAck string) bool {
	r, ok := msg.(interface{ Reply() string })
	return ok && r.Reply() == taskAck
}

// dispatchedMsg is the message whose handling dispatched an attempt of a
// task: the task itself (first attempt) or the outcome of the previous
// attempt. Acked once the dispatch is stored, it hands the task to the
// keeper until the attempt's deadline; the task itself is not acked (its
// result will), an outcome is.
type dispatchedMsg struct {
	jsplumb.Msg
	task  string // the task's ack subject
	until time.Time
	self  bool // Msg is the task
	keep  *taskKeeper
	rec   attemptRecord
}

func (d dispatchedMsg) Ack() error {
	d.keep.add(d.task, d.until.Add(d.keep.lostAfter), d.rec)
	if d.self {
		return nil
	}
	return d.Msg.Ack()
}

// Dispatched returns what admission settles once an attempt's dispatch is
// stored: msg itself when the task has no ack subject (a task dispatched
// by an older dispatcher).
func (k *taskKeeper) Dispatched(msg jsplumb.Msg, taskAck string, deadline time.Time, rec attemptRecord) jsplumb.Msg {
	if k == nil || taskAck == "" {
		return msg
	}
	rec.Dispatched = time.Now()
	return dispatchedMsg{Msg: msg, task: taskAck, until: deadline, self: isTask(msg, taskAck), keep: k, rec: rec}
}

// taskKeeper keeps the tasks whose attempts this replica dispatched in
// progress (InProgress restarts the task's ack wait) until the sweeper
// would declare a silent attempt lost (its deadline plus lostAfter), and
// the tasks whose retries wait here (keep), so that a task stays in
// progress for as long as an attempt or a retry of it is alive. A task finished here leaves at once; one
// finished by another replica at its deadline (its in-progress signals are
// ignored by the server once the task is acked). Tasks that finish within
// half the ack wait, the bulk, cost no signal at all.
type taskKeeper struct {
	nc       *nats.Conn
	complete *jsplumb.Completer
	ackWait  time.Duration
	// lostAfter: an attempt silent at its deadline is alive until the
	// sweeper reports it lost, its grace and a sweep later (sweeper.go);
	// its retry keeps the task from then on (keep).
	lostAfter time.Duration

	mu    sync.Mutex
	tasks map[string]keptTask
}

type keptTask struct {
	until time.Time // the attempt's deadline
	last  time.Time // last in-progress signal, or when it was kept
	// rec is the attempt in flight that this replica dispatched (zero
	// while a retry waits): what lost.go records should the attempt
	// streams be lost with it.
	rec attemptRecord
}

func newTaskKeeper(nc *nats.Conn, complete *jsplumb.Completer, ackWait, lostAfter time.Duration) *taskKeeper {
	return &taskKeeper{nc: nc, complete: complete, ackWait: ackWait, lostAfter: lostAfter, tasks: map[string]keptTask{}}
}

// add keeps the task until an attempt's deadline. A task kept already
// keeps its last signal's time: the server's ack wait runs from there.
func (k *taskKeeper) add(subj string, until time.Time, rec attemptRecord) {
	now := time.Now()
	k.mu.Lock()
	kt, ok := k.tasks[subj]
	if !ok {
		kt.last = now
	}
	kt.until, kt.rec = until, rec
	k.tasks[subj] = kt
	k.mu.Unlock()
}

// Keep keeps the task in progress until at least until while msg, a
// message other than the task, stands for its next attempt: a retry held
// for capacity, waiting for a node, or its outcome nak'ed for a backoff.
// The previous attempt's keeping ends at that attempt's deadline, and
// nothing else keeps the task: its ack wait would run out, and the server
// would deliver it again as a new first attempt beside the waiting retry.
// The keeping ends with the task's ack (finalMsg), the next attempt's
// deadline (dispatchedMsg), or at until.
func (k *taskKeeper) Keep(msg jsplumb.Msg, taskAck string, until time.Time) {
	if k == nil || taskAck == "" || isTask(msg, taskAck) {
		return
	}
	k.mu.Lock()
	kt := k.tasks[taskAck] // not kept: last is zero, it is signalled at the next tick
	if until.After(kt.until) {
		kt.until = until
	}
	kt.rec = attemptRecord{} // the attempt ended: its retry waits here, in memory
	k.tasks[taskAck] = kt
	k.mu.Unlock()
}

// inFlight returns the attempts this replica dispatched before t that are
// still kept: those in flight, and those finished by another replica
// (their records are harmless: a finished task is not delivered again).
func (k *taskKeeper) inFlight(t time.Time) []attemptRecord {
	if k == nil {
		return nil
	}
	now := time.Now()
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []attemptRecord
	for _, kt := range k.tasks {
		if kt.rec.Attempt > 0 && kt.rec.Dispatched.Before(t) && now.Before(kt.until) {
			out = append(out, kt.rec)
		}
	}
	return out
}

func (k *taskKeeper) remove(subj string) {
	if k == nil {
		return
	}
	k.mu.Lock()
	delete(k.tasks, subj)
	k.mu.Unlock()
}

// run signals progress every quarter ack wait for the tasks kept for half
// of it, and forgets those past their deadline, until ctx ends.
func (k *taskKeeper) run(ctx context.Context) {
	every := max(k.ackWait/4, 10*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	var due []string
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			due = due[:0]
			k.mu.Lock()
			for subj, kt := range k.tasks {
				switch {
				case now.After(kt.until):
					delete(k.tasks, subj)
				case now.Sub(kt.last) >= k.ackWait/2:
					kt.last = now
					k.tasks[subj] = kt
					due = append(due, subj)
				}
			}
			k.mu.Unlock()
			for _, subj := range due {
				k.complete.Progress(subjectMsg{nc: k.nc, subj: subj})
			}
		}
	}
}

package dispatcher

import (
	"container/heap"
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// The in-flight table is MLSCHED_DISPATCH itself: a work-queue stream keeps
// each dispatch until its worker acks it, after reporting the outcome. So an
// attempt whose dispatch is still stored past its deadline was lost (its node
// died or hangs). The sweeper reports it as a "lost" outcome through the
// outcome stream, where the usual path counts a timeout against the model
// and node and fails the task over, and then deletes the dispatch so that a
// restarted node does not run it. Reporting before deleting means a crash in
// between loses nothing: the next sweep (of any replica) reports again, and
// the Nats-Msg-Id deduplicates it. No extra write is needed per task.
func (d *Dispatcher) sweepLoop(ctx context.Context) {
	every(ctx, d.cfg.SweepInterval, func(ctx context.Context) {
		if n, err := d.sweep(ctx, time.Now()); err != nil && ctx.Err() == nil {
			d.log.Warn().Err(err).Msg("sweep for lost attempts failed")
		} else if n > 0 {
			d.log.Warn().Int("lost", n).Msg("attempts lost at their deadline: failing them over")
		}
	})
}

// sweeper is the sweep loop's state: a cursor into the dispatch stream and
// the stored dispatches it has seen, ordered by when they become due. Each
// dispatch is read once when it gets older than the slack and once more when
// it is due, however long it waits, so an overloaded cluster with a deep
// backlog is not re-read every sweep. It is used by the sweep loop alone.
type sweeper struct {
	next uint64   // first sequence not yet looked at
	due  dueQueue // dispatches seen, by due time
}

type dueEntry struct {
	due int64 // Unix ms: deadline plus grace
	seq uint64
}

// dueQueue is a min-heap of dueEntry by due time.
type dueQueue []dueEntry

func (q dueQueue) Len() int           { return len(q) }
func (q dueQueue) Less(i, j int) bool { return q[i].due < q[j].due }
func (q dueQueue) Swap(i, j int)      { q[i], q[j] = q[j], q[i] }
func (q *dueQueue) Push(x any)        { *q = append(*q, x.(dueEntry)) }
func (q *dueQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

// sweep reports the stored dispatches past their deadline (plus a grace of a
// sweep interval, at least a second, for a worker reporting a timeout right at
// the deadline). A dispatch younger than DeadlineSlack cannot be past its
// deadline, so the cursor stops at the first one.
func (d *Dispatcher) sweep(ctx context.Context, now time.Time) (int, error) {
	sw := &d.sweeper
	info, err := d.dispatchStream.Info(ctx)
	if err != nil {
		return 0, err
	}
	if sw.next > info.State.LastSeq+1 { // the stream was re-created: start over
		sw.next, sw.due = 0, nil
	}
	if sw.next < info.State.FirstSeq {
		sw.next = info.State.FirstSeq
	}
	grace := max(d.cfg.SweepInterval, time.Second).Milliseconds()
	for sw.next > 0 && sw.next <= info.State.LastSeq {
		raw, err := d.dispatchStream.GetMsg(ctx, sw.next, jetstream.WithGetMsgSubject(topology.SubjectDispatchAll))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			sw.next = info.State.LastSeq + 1
			break
		}
		if err != nil {
			return 0, err
		}
		if now.Sub(raw.Time) < d.cfg.DeadlineSlack {
			sw.next = raw.Sequence
			break
		}
		sw.next = raw.Sequence + 1
		deadline, err := strconv.ParseInt(raw.Header.Get(protocol.HdrDeadline), 10, 64)
		if err != nil {
			deadline = 0 // no readable deadline: due now
		}
		heap.Push(&sw.due, dueEntry{due: deadline + grace, seq: raw.Sequence})
	}
	lost := 0
	for sw.due.Len() > 0 && sw.due[0].due < now.UnixMilli() {
		e := sw.due[0]
		raw, err := d.dispatchStream.GetMsg(ctx, e.seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			heap.Pop(&sw.due) // acknowledged by its worker meanwhile
			continue
		}
		if err != nil {
			return lost, err
		}
		if err := d.reportLost(ctx, raw); err != nil {
			return lost, err
		}
		if err := d.dispatchStream.DeleteMsg(ctx, raw.Sequence); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			return lost, err
		}
		heap.Pop(&sw.due)
		lost++
	}
	return lost, nil
}

func (d *Dispatcher) reportLost(ctx context.Context, raw *jetstream.RawStreamMsg) error {
	h := raw.Header
	node := h.Get(protocol.HdrNode)
	if node == "" {
		node = "unknown"
	}
	o := protocol.Outcome{
		TaskID: h.Get(protocol.HdrTaskID), Type: h.Get(protocol.HdrType), Model: h.Get(protocol.HdrModel),
		Node: node, Attempt: atoiOr(h.Get(protocol.HdrAttempt), 1), Status: protocol.OutcomeLost,
		Error: "no outcome by the dispatch deadline: node " + node + " died, hung or fell behind",
		Task:  raw.Data,
	}
	if o.TaskID == "" { // not one of ours: keep it for an operator
		var dl protocol.DeadLetter
		dl.Reason, dl.Code, dl.Subject, dl.Original = "a dispatch without task headers", protocol.CodeInvalidField, raw.Subject, raw.Data
		data, _ := json.Marshal(dl)
		_, err := d.js.Publish(ctx, topology.DLQSubject("dispatch"), data)
		return err
	}
	if !json.Valid(raw.Data) {
		o.Task = nil
	}
	if res, err := d.resultsStream.GetLastMsgForSubject(ctx, topology.ResultSubject(o.TaskID)); err == nil && res != nil {
		return nil // the worker reported and the task is final; it only missed its ack
	}
	data, err := json.Marshal(o)
	if err != nil {
		return err
	}
	m := &nats.Msg{Subject: topology.OutcomeSubject(node), Data: data, Header: nats.Header{}}
	for k, v := range h {
		if k != protocol.HdrMsgID {
			m.Header[k] = v
		}
	}
	_, err = d.js.PublishMsg(ctx, m, jetstream.WithMsgID(protocol.MsgID("l", o.TaskID, h.Get(protocol.HdrTaskSeq), o.Attempt)))
	return err
}

package dispatcher

import (
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

// sweep scans the stored dispatches oldest first and reports those past their
// deadline. A dispatch younger than DeadlineSlack cannot be past its deadline,
// so the scan stops at the first one.
func (d *Dispatcher) sweep(ctx context.Context, now time.Time) (int, error) {
	info, err := d.dispatchStream.Info(ctx)
	if err != nil {
		return 0, err
	}
	lost := 0
	for seq := info.State.FirstSeq; seq > 0 && seq <= info.State.LastSeq; {
		raw, err := d.dispatchStream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(topology.SubjectDispatchAll))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return lost, nil
		}
		if err != nil {
			return lost, err
		}
		if now.Sub(raw.Time) < d.cfg.DeadlineSlack {
			return lost, nil
		}
		seq = raw.Sequence + 1
		// A worker may be reporting a timeout right at the deadline: give it
		// a sweep interval (at least a second) before declaring the attempt lost.
		grace := max(d.cfg.SweepInterval, time.Second).Milliseconds()
		deadline, err := strconv.ParseInt(raw.Header.Get(protocol.HdrDeadline), 10, 64)
		if err == nil && now.UnixMilli() <= deadline+grace {
			continue
		}
		if err := d.reportLost(ctx, raw); err != nil {
			return lost, err
		}
		if err := d.dispatchStream.DeleteMsg(ctx, raw.Sequence); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			return lost, err
		}
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

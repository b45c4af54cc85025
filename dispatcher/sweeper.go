package dispatcher

import (
	"container/heap"
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/dispatcher/internal/finish"
	"github.com/mlsched/mlsched/shared/lifecycle"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// sweeper finds lost attempts. The in-flight table is MLSCHED_DISPATCH
// itself: a work-queue stream keeps each dispatch until its worker acks it,
// after reporting the outcome. So an attempt whose dispatch is still stored
// past its deadline was lost (its node died or hangs). The sweeper reports
// it as a "lost" outcome through the outcome stream, where the usual path
// counts a timeout against the model and node and fails the task over, and
// then deletes the dispatch so that a restarted node does not run it.
// Reporting before deleting means a crash in between loses nothing: the next
// sweep (of any replica) reports again, and the Nats-Msg-Id deduplicates it.
// No extra write is needed per task.
//
// Its state is a cursor into the dispatch stream and the stored dispatches
// it has seen, ordered by when they become due. Each dispatch is read once
// when it gets older than the slack and once more when it is due, however
// long it waits, so an overloaded cluster with a deep backlog is not re-read
// every sweep.
type sweeper struct {
	lifecycle.Loop
	js       jetstream.JetStream
	dispatch jetstream.Stream // MLSCHED_DISPATCH
	results  jetstream.Stream // MLSCHED_RESULTS
	dlq      *finish.DeadLetters
	every    time.Duration // between sweeps
	slack    time.Duration // no dispatch younger than this is past its deadline
	log      zerolog.Logger
	// live are the nodes the registry sees now (nil: no node-loss check);
	// nodes is the bucket they heartbeat into, and ttl their time to live:
	// a node the registry dropped is failed over only when its entry, by
	// the server's clock, is gone or older than the TTL (the registry
	// expires by this replica's receive time, which a starved replica
	// misjudges).
	live  func() []protocol.Heartbeat
	nodes jetstream.KeyValue
	ttl   time.Duration

	// onRecreated, when set, is told that MLSCHED_DISPATCH was re-created
	// (a nats-server restart lost it, memory storage) and when: the
	// attempts dispatched before then were lost with it (lost.go).
	onRecreated func(ctx context.Context, created time.Time)
	created     time.Time // the stream's creation time at the last sweep

	// reconnects counts this replica's NATS reconnections (nil: none
	// seen); reconnected is when a sweep first saw the count change: an
	// attempt stored before then may have had its outcome lost with the
	// server, not with its model (reportLost).
	reconnects  func() uint64
	seenRecon   uint64
	reconnected time.Time

	known map[string]bool // the nodes live at the last sweep
	next  uint64          // first sequence not yet looked at
	due   dueQueue        // dispatches seen, by due time
}

// Start sweeps every interval until Stop.
func (s *sweeper) Start(ctx context.Context) error {
	return s.Go(ctx, func(ctx context.Context, ready func()) error {
		ready()
		every(ctx, s.every, func(ctx context.Context) {
			if n, err := s.sweepGone(ctx); err != nil && ctx.Err() == nil {
				s.log.Warn().Err(err).Msg("sweep for the attempts of departed nodes failed")
			} else if n > 0 {
				s.log.Warn().Int("attempts", n).Msg("nodes left the registry with attempts unanswered: failing them over now")
			}
			if n, err := s.sweep(ctx, time.Now()); err != nil && ctx.Err() == nil {
				s.log.Warn().Err(err).Msg("sweep for lost attempts failed")
			} else if n > 0 {
				s.log.Warn().Int("lost", n).Msg("attempts lost at their deadline: failing them over")
			}
		})
		return nil
	})
}

// lostGrace is how long past its deadline the sweeper waits for an
// attempt's outcome before it reports the attempt lost: a sweep interval,
// at least a second, for a worker reporting a timeout right at the
// deadline.
func lostGrace(sweepEvery time.Duration) time.Duration { return max(sweepEvery, time.Second) }

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
// the deadline) and returns how many. A dispatch younger than the slack
// cannot be past its deadline, so the cursor stops at the first one.
func (s *sweeper) sweep(ctx context.Context, now time.Time) (int, error) {
	info, err := s.dispatch.Info(ctx)
	if err != nil {
		return 0, err
	}
	if !s.created.IsZero() && !info.Created.Equal(s.created) && s.onRecreated != nil {
		s.onRecreated(ctx, info.Created)
	}
	s.created = info.Created
	if s.next > info.State.LastSeq+1 { // the stream was re-created: start over
		s.next, s.due = 0, nil
	}
	if s.next < info.State.FirstSeq {
		s.next = info.State.FirstSeq
	}
	s.noteReconnects(now)
	grace := lostGrace(s.every).Milliseconds()
	for s.next > 0 && s.next <= info.State.LastSeq {
		raw, err := s.dispatch.GetMsg(ctx, s.next, jetstream.WithGetMsgSubject(topology.SubjectDispatchAll))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			s.next = info.State.LastSeq + 1
			break
		}
		if err != nil {
			return 0, err
		}
		if now.Sub(raw.Time) < s.slack {
			s.next = raw.Sequence
			break
		}
		s.next = raw.Sequence + 1
		var due int64 // an invalid dispatch is due now, to be dead-lettered
		if pd, err := protocol.ParseDispatch(raw.Header); err == nil {
			due = pd.Deadline.UnixMilli()
		}
		heap.Push(&s.due, dueEntry{due: due + grace, seq: raw.Sequence})
	}
	lost := 0
	fetched := map[string]uint64{} // per node, the last dispatch its consumer delivered (this sweep)
	for s.due.Len() > 0 && s.due[0].due < now.UnixMilli() {
		e := s.due[0]
		raw, err := s.dispatch.GetMsg(ctx, e.seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			heap.Pop(&s.due) // acknowledged by its worker meanwhile
			continue
		}
		if err != nil {
			return lost, err
		}
		if err := s.reportLost(ctx, raw, fetched); err != nil {
			return lost, err
		}
		if err := s.dispatch.DeleteMsg(ctx, raw.Sequence); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			return lost, err
		}
		heap.Pop(&s.due)
		lost++
	}
	return lost, nil
}

// sweepGone fails over at once the stored dispatches of every node that
// left the registry since the last sweep (its heartbeat expired, or it
// deleted its entry), instead of at their deadlines: a dead node's tasks
// are answered within the node TTL plus a sweep, and reported node_lost,
// which does not count against the models they ran (a node's death is not
// the model's fault). When every node disappears at once the registry
// itself may be what failed (a partitioned bucket leader): nothing is
// failed over then, and the deadlines stand.
func (s *sweeper) sweepGone(ctx context.Context) (int, error) {
	if s.live == nil {
		return 0, nil
	}
	live := map[string]bool{}
	for _, hb := range s.live() {
		live[hb.Node] = true
	}
	var gone []string
	for n := range s.known {
		if !live[n] {
			gone = append(gone, n)
		}
	}
	if len(live) == 0 && len(s.known) > 0 {
		return 0, nil // all at once: an outage of the registry cannot be told from deaths; keep s.known
	}
	s.known = live
	lost := 0
	for _, node := range gone {
		if s.stillBeating(ctx, node) {
			s.known[node] = true // asked again at the next sweep
			continue
		}
		subject := topology.DispatchSubject(node)
		for seq := uint64(1); ; {
			raw, err := s.dispatch.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				break
			}
			if err != nil {
				return lost, err
			}
			seq = raw.Sequence + 1
			if err := s.report(ctx, raw, protocol.OutcomeNodeLost,
				"node "+node+" left the registry (its heartbeat expired) with the attempt unanswered"); err != nil {
				return lost, err
			}
			if err := s.dispatch.DeleteMsg(ctx, raw.Sequence); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
				return lost, err
			}
			lost++
		}
	}
	return lost, nil
}

// stillBeating reports whether node's entry in the nodes bucket was
// written within the TTL (plus a second of clock skew) by the server's
// clock: the registry dropped it, but the node is alive. An unreadable
// bucket counts as alive: the deadlines stand.
func (s *sweeper) stillBeating(ctx context.Context, node string) bool {
	if s.nodes == nil {
		return false
	}
	e, err := s.nodes.Get(ctx, node)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted):
		return false
	case err != nil:
		return true
	}
	return time.Since(e.Created()) < s.ttl+time.Second
}

// reportLost reports an attempt unanswered at its deadline: lost, which
// counts against its model (it may have hung), unless its node restarted
// after the attempt was stored. A worker killed and started again within
// the node TTL never leaves the registry, so sweepGone does not see it
// die; the attempt it held is then the node's loss, reported node_lost
// like a node's death: not counted against the model, and the retry may go
// back to the model on another node (issue 39; make chaos seed 1746897540
// exhausted three tasks so: lost on m-fail00 with a restarted node, then
// model errors on m-fail02 and m-fail05 while m-fail00 had nodes free).
//
// Likewise when this replica's NATS connection was lost and made again
// after the attempt was stored: the server was unreachable (killed,
// restarted, partitioned) while the attempt ran, and its outcome may have
// been lost or delayed with it (the short chaos run of make test, seed
// 2506735853: a nats-server kill left 269 attempts unanswered at their
// deadlines, blamed on their models, and four tasks exhausted their
// attempts on the flaky ones).
//
// And when the node never fetched it: its consumer's last delivered
// dispatch is older. The model never saw the attempt (after a server
// restart a node's pull may stall until its client notices; the short
// chaos run of make test, seed 3766251344, lost 349 attempts so, their
// outcomes arriving late).
func (s *sweeper) reportLost(ctx context.Context, raw *jetstream.RawStreamMsg, fetched map[string]uint64) error {
	node := ""
	if pd, err := protocol.ParseDispatch(raw.Header); err == nil {
		node = pd.Node
	}
	status, why := s.lostStatus(node, raw.Time)
	if status == protocol.OutcomeLost && node != "" && !s.fetchedBy(ctx, node, raw.Sequence, fetched) {
		status, why = protocol.OutcomeNodeLost, "node "+node+" never fetched the attempt before its deadline"
	}
	return s.report(ctx, raw, status, why)
}

// fetchedBy reports whether node's dispatch consumer has delivered the
// dispatch at seq (its consumer's info, read once per node and sweep). When
// it cannot tell, it says yes: the attempt stays the model's loss, as
// before.
func (s *sweeper) fetchedBy(ctx context.Context, node string, seq uint64, fetched map[string]uint64) bool {
	last, ok := fetched[node]
	if !ok {
		last = ^uint64(0)
		if s.dispatch != nil {
			if c, err := s.dispatch.Consumer(ctx, topology.NodeConsumer(node)); err == nil {
				if info, err := c.Info(ctx); err == nil {
					last = info.Delivered.Stream
				}
			}
		}
		fetched[node] = last
	}
	return seq <= last
}

// lostStatus is how an attempt on node, stored at stored and unanswered at
// its deadline, is reported (see reportLost).
func (s *sweeper) lostStatus(node string, stored time.Time) (protocol.OutcomeStatus, string) {
	if s.restartedSince(node, stored) {
		return protocol.OutcomeNodeLost, "node " + node + " restarted after the attempt was sent, without answering it"
	}
	if !s.reconnected.IsZero() && s.reconnected.After(stored) {
		return protocol.OutcomeNodeLost, "the connection to NATS was lost after the attempt was sent, and the attempt is unanswered: its outcome may have been lost with the server"
	}
	return protocol.OutcomeLost, ""
}

// noteReconnects records when a sweep first sees this replica's
// reconnection count change.
func (s *sweeper) noteReconnects(now time.Time) {
	if s.reconnects == nil {
		return
	}
	if n := s.reconnects(); n != s.seenRecon {
		s.seenRecon, s.reconnected = n, now
	}
}

// restartedSince reports whether the registry's live heartbeat of node
// comes from a process started after t.
func (s *sweeper) restartedSince(node string, t time.Time) bool {
	if s.live == nil || node == "" {
		return false
	}
	for _, hb := range s.live() {
		if hb.Node == node {
			return hb.StartedAt.After(t)
		}
	}
	return false
}

// report publishes the outcome of an unanswered attempt, lost at its
// deadline or with its node; why replaces the default error text.
func (s *sweeper) report(ctx context.Context, raw *jetstream.RawStreamMsg, status protocol.OutcomeStatus, why string) error {
	pd, err := protocol.ParseDispatch(raw.Header)
	if err != nil { // not one the dispatcher built: keep it for an operator
		return s.dlq.Publish(ctx, "dispatch", protocol.DeadLetter{Reason: "a stored dispatch is invalid: " + err.Error(),
			Code: protocol.CodeOf(err), Subject: raw.Subject, Original: raw.Data},
			finish.MessageEntry("dispatch", topology.StreamDispatch, raw.Sequence))
	}
	if _, found, _ := finish.Lookup(ctx, s.results, pd.TaskID); found {
		return nil // the worker reported and the task is final; it only missed its ack
	}
	o := protocol.Outcome{
		TaskID: pd.TaskID, Type: pd.Type, Model: pd.Model, Node: pd.Node, Attempt: pd.Attempt, Status: status,
		Error: "no outcome by the dispatch deadline: node " + pd.Node + " died, hung or fell behind",
		Task:  raw.Data,
	}
	if why != "" {
		o.Error = why
	}
	if !json.Valid(raw.Data) {
		o.Task = nil
	}
	data, err := protocol.EncodeOutcome(&o)
	if err != nil {
		return err
	}
	m := &nats.Msg{Subject: topology.OutcomeSubject(pd.Node), Data: data, Header: protocol.OutcomeHeader(raw.Header, pd.Node)}
	_, err = s.js.PublishMsg(ctx, m, jetstream.WithMsgID(pd.MsgID("l")))
	return err
}

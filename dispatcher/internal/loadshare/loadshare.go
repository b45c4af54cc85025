// Package loadshare keeps every dispatcher replica's view of the nodes'
// load whole between two statistics snapshots.
//
// A replica counts the attempts it dispatches and the outcomes it settles
// in its decision table at once (policy.Table.Dispatched, Completed). But
// the outcomes of its dispatches are settled by whichever replica receives
// them (direct reports go to a queue group, the outcome stream to a shared
// consumer), so on its own a replica's count of a node's work drifts from
// the node's by what the other replicas sent and settled, until the next
// snapshot (MLSCHED_SNAPSHOT_INTERVAL, 250 ms). Flow control reads that
// count against a queue target of a few service times: with two replicas
// and a 10 ms model, the drift held tasks 100-250 ms at 40% load with the
// node's slots idle, or sent more than the target under overload.
//
// A Sharer sums this replica's changes per (model, node) and publishes them
// at most every Interval on topology.SubjectLoad (protocol.LoadShare); the
// other replicas add them to their tables (policy.Table.Shared). The
// messages are core NATS: a lost one costs accuracy until the next
// snapshot, never a task. While nothing changes nothing is sent.
package loadshare

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/dispatcher/internal/lograte"
	"github.com/mlsched/mlsched/dispatcher/internal/policy"
	"github.com/mlsched/mlsched/shared/lifecycle"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// DefaultInterval is how long a change waits for others to share its
// message: a tenth of the fastest models' service times, and at most 200
// messages a second from a busy replica.
const DefaultInterval = 5 * time.Millisecond

// Tables gives the decision table in use (the dispatcher's refresher).
type Tables interface {
	Table() *policy.Table
}

// Params is what a Sharer needs.
type Params struct {
	NC     *nats.Conn
	Tables Tables
	Log    zerolog.Logger
	// Interval is the least time between two messages (DefaultInterval
	// when 0).
	Interval time.Duration
	// Freed, when set, is called after another replica's message freed
	// work on some node (outcomes it settled): the hold decides again then,
	// as it does after an outcome of its own (admission.Stage.Wake),
	// instead of at its next retry, up to 100 ms later.
	Freed func()
}

// Counts are a Sharer's figures (the dispatcher's stats report).
type Counts struct {
	// Sent and Received count messages; Refused the received ones that
	// did not decode.
	Sent, Received, Refused atomic.Int64
}

type pairKey struct{ model, node string }

// Sharer passes this replica's load changes to the others and theirs to
// this replica's table.
type Sharer struct {
	Params
	Counts
	id      string
	mu      sync.Mutex
	pending map[pairKey]int64
	kick    chan struct{}
	refused lograte.Sometimes
}

// New builds a Sharer with a random replica id.
func New(p Params) *Sharer {
	if p.Interval <= 0 {
		p.Interval = DefaultInterval
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	return &Sharer{Params: p, id: hex.EncodeToString(b[:]), pending: map[pairKey]int64{}, kick: make(chan struct{}, 1),
		refused: lograte.Sometimes{Every: 10 * time.Second}}
}

// Note records a change this replica made to a (model, node)'s count (the
// function each table shares with, policy.Table.ShareWith).
func (s *Sharer) Note(model, node string, d int64) {
	k := pairKey{model, node}
	s.mu.Lock()
	s.pending[k] += d
	s.mu.Unlock()
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// take empties the pending changes into a message; ok is false when they
// add up to nothing.
func (s *Sharer) take() (protocol.LoadShare, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := protocol.LoadShare{Replica: s.id}
	for k, d := range s.pending {
		if d != 0 {
			l.Pairs = append(l.Pairs, protocol.LoadDelta{Model: k.model, Node: k.node, Delta: d})
		}
		delete(s.pending, k)
		if len(l.Pairs) == protocol.MaxLoadPairs {
			break // the rest go in the next message
		}
	}
	if len(s.pending) > 0 {
		select { // the rest are sent without waiting for a new change
		case s.kick <- struct{}{}:
		default:
		}
	}
	return l, len(l.Pairs) > 0
}

// refusedByServer reports whether the server refused this connection the
// subject (an auth.conf from before it existed): the replica then stops
// sending, once, with a line that says what to do, instead of a refused
// publish and its error line every few milliseconds.
func (s *Sharer) refusedByServer() bool {
	err := s.NC.LastError()
	if err == nil || !strings.Contains(err.Error(), topology.SubjectLoad) {
		return false
	}
	s.Log.Error().Err(err).Msg("NATS refuses this dispatcher " + topology.SubjectLoad +
		": the replicas no longer tell each other their load changes, so each counts only its own between snapshots; " +
		"regenerate the permissions (mlsched auth init) or grant the dispatcher role publish and subscribe on " + topology.SubjectLoad)
	return true
}

// Receive applies another replica's message to this replica's table.
func (s *Sharer) Receive(m *nats.Msg) {
	l, err := protocol.DecodeLoadShare(m.Data)
	if err != nil {
		s.Refused.Add(1)
		s.refused.Log(&s.Log, func(e *zerolog.Event) *zerolog.Event { return e.Err(err) },
			"refused a load share message (another replica's load changes): ignored")
		return
	}
	if l.Replica == s.id {
		return
	}
	s.Received.Add(1)
	t := s.Tables.Table()
	freed := false
	for _, p := range l.Pairs {
		t.Shared(p.Model, p.Node, p.Delta)
		freed = freed || p.Delta < 0
	}
	if freed && s.Freed != nil {
		s.Freed()
	}
}

// Service subscribes to the other replicas' messages and sends this
// replica's, until stopped; what is pending then is dropped (the next
// snapshot counts it).
func (s *Sharer) Service() lifecycle.Service {
	return lifecycle.Run(func(ctx context.Context, ready func()) error {
		sub, err := s.NC.Subscribe(topology.SubjectLoad, s.Receive)
		if err != nil {
			return err
		}
		defer func() { _ = sub.Unsubscribe() }()
		// The server has the subscription before Start returns, so no
		// change another replica sends after that is missed. A flush that
		// fails (a reconnect under way) is not fatal: the client sends the
		// subscription again when it reconnects.
		if err := s.NC.FlushTimeout(2 * time.Second); err != nil {
			s.Log.Warn().Err(err).Msg("load share: subscription not yet confirmed by the server")
		}
		ready()
		s.loop(ctx)
		return nil
	})
}

// loop sends the pending changes: after a change, it waits Interval for
// more to share the message.
func (s *Sharer) loop(ctx context.Context) {
	t := time.NewTimer(s.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.kick:
		}
		t.Reset(s.Interval)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		l, ok := s.take()
		if !ok {
			continue
		}
		if s.refusedByServer() {
			return
		}
		data, err := protocol.EncodeLoadShare(&l)
		if err != nil {
			continue // cannot happen: plain strings and numbers
		}
		if err := s.NC.Publish(topology.SubjectLoad, data); err == nil {
			s.Sent.Add(1)
		}
	}
}

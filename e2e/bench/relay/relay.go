// Package relay is mlsched's benchmark baseline: the same streams and hops
// as the system, with no scheduling. A Relay consumes MLSCHED_TASKS with a
// durable pull consumer and republishes each task's bytes to the dispatch
// subject of the next node (round-robin); a Sink per node consumes the
// node's dispatches the way a worker does and acknowledges them at once.
// That is two JetStream publishes per task, against mlsched's four (task,
// dispatch, outcome, result), so the ratio of the two throughputs measured
// on one server is the cost of scheduling and of the extra hops.
package relay

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// Config configures a Relay.
type Config struct {
	// Nodes receive the tasks in turn (required, valid subject tokens).
	Nodes []string
	// Durable is the relay's consumer on MLSCHED_TASKS (default "relay").
	Durable string
	// MaxInFlight bounds tasks republished but not yet acknowledged by
	// JetStream; the consumer's MaxAckPending is twice that, as for the
	// dispatcher (default 1024, the dispatcher's default).
	MaxInFlight int
	// AckWait of the consumer (default 30s, the dispatcher's default).
	AckWait time.Duration
}

func (c Config) withDefaults() Config {
	if c.Durable == "" {
		c.Durable = "relay"
	}
	if c.MaxInFlight <= 0 {
		c.MaxInFlight = 1024
	}
	if c.AckWait <= 0 {
		c.AckWait = 30 * time.Second
	}
	return c
}

// ErrNoNodes is returned by New when Config.Nodes is empty.
var ErrNoNodes = errors.New("relay: no nodes")

// Relay moves tasks from MLSCHED_TASKS to the nodes' dispatch subjects.
type Relay struct {
	js  jetstream.JetStream
	cfg Config

	subjects []string
	next     atomic.Uint64
	relayed  atomic.Uint64
	failed   atomic.Uint64

	pending  chan pendingAck
	handlers sync.WaitGroup
	cc       jetstream.ConsumeContext
	settled  chan struct{}
}

type pendingAck struct {
	fut jetstream.PubAckFuture
	msg jetstream.Msg
}

// New returns a relay publishing through js. Give js a
// jetstream.WithPublishAsyncMaxPending of at least MaxInFlight.
func New(js jetstream.JetStream, cfg Config) (*Relay, error) {
	cfg = cfg.withDefaults()
	if len(cfg.Nodes) == 0 {
		return nil, ErrNoNodes
	}
	r := &Relay{js: js, cfg: cfg}
	for _, n := range cfg.Nodes {
		if err := protocol.ValidToken(n, 64); err != nil {
			return nil, fmt.Errorf("relay: node %q: %w", n, err)
		}
		r.subjects = append(r.subjects, topology.DispatchSubject(n))
	}
	return r, nil
}

// Start creates the streams (as the dispatcher does) and the consumer, and
// starts relaying. The relay removes no task from the limits-retention
// task stream (the dispatcher's pruner does, in mlsched): a bench run's
// tasks stay there, well inside its bounds, until the server is stopped.
func (r *Relay) Start(ctx context.Context) error {
	if err := topology.Ensure(ctx, r.js, topology.Config{}); err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	s, err := r.js.Stream(ctx, topology.StreamTasks)
	if err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	cons, err := topology.EnsureConsumer(ctx, s, jetstream.ConsumerConfig{
		Durable:       r.cfg.Durable,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       r.cfg.AckWait,
		MaxAckPending: 2 * r.cfg.MaxInFlight,
		MaxDeliver:    -1,
	})
	if err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	r.pending = make(chan pendingAck, r.cfg.MaxInFlight)
	r.settled = make(chan struct{})
	go r.settleLoop()
	r.cc, err = cons.Consume(r.handle, jetstream.PullMaxMessages(min(r.cfg.MaxInFlight, 256)))
	if err != nil {
		close(r.pending)
		<-r.settled
		return fmt.Errorf("relay: consume: %w", err)
	}
	return nil
}

// Stop stops consuming, lets buffered messages through and waits until every
// republished task is settled.
func (r *Relay) Stop() {
	if r.cc == nil {
		return
	}
	r.cc.Drain()
	<-r.cc.Closed()
	r.handlers.Wait()
	close(r.pending)
	<-r.settled
	r.cc = nil
}

// Relayed counts tasks republished and acknowledged; Failed counts
// republishes that failed (the task was nak'ed for redelivery).
func (r *Relay) Relayed() uint64 { return r.relayed.Load() }

// Failed counts republishes that failed.
func (r *Relay) Failed() uint64 { return r.failed.Load() }

// handle republishes one task. The body is forwarded unchanged; the
// Nats-Msg-Id is derived from the task's, as the dispatcher derives its
// dispatch ids, so the dispatch stream deduplicates a redelivered task.
func (r *Relay) handle(msg jetstream.Msg) {
	r.handlers.Add(1)
	defer r.handlers.Done()
	out := &nats.Msg{Subject: r.subjects[(r.next.Add(1)-1)%uint64(len(r.subjects))], Data: msg.Data()}
	var opts []jetstream.PublishOpt
	if id := msg.Headers().Get(protocol.HdrMsgID); id != "" {
		opts = append(opts, jetstream.WithMsgID("r:"+id))
	}
	fut, err := r.js.PublishMsgAsync(out, opts...)
	if err != nil {
		r.failed.Add(1)
		_ = msg.NakWithDelay(time.Second)
		return
	}
	r.pending <- pendingAck{fut: fut, msg: msg}
}

// settleLoop acknowledges each task once its republish is acknowledged, in
// publish order, like the dispatcher's.
func (r *Relay) settleLoop() {
	defer close(r.settled)
	for p := range r.pending {
		select {
		case <-p.fut.Ok():
			r.relayed.Add(1)
			_ = p.msg.Ack()
		case <-p.fut.Err():
			r.failed.Add(1)
			_ = p.msg.NakWithDelay(time.Second)
		}
	}
}

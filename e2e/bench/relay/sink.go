package relay

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// SinkConfig configures a Sink.
type SinkConfig struct {
	// Node whose dispatch subject is consumed (required).
	Node string
	// MaxAckPending of the node's consumer and the pull batch, as a worker's
	// concurrency sets both (default 8, the worker's default).
	MaxAckPending int
	// OnMsg, when set, sees every message before it is acknowledged; it
	// runs on the consumer's goroutine and must be quick.
	OnMsg func(jetstream.Msg)
}

// Sink plays a worker whose model costs nothing: it consumes the node's
// durable consumer (the worker's configuration) and acknowledges at once.
type Sink struct {
	js  jetstream.JetStream
	cfg SinkConfig
	cc  jetstream.ConsumeContext
}

// NewSink returns a sink consuming through js.
func NewSink(js jetstream.JetStream, cfg SinkConfig) (*Sink, error) {
	if err := protocol.ValidToken(cfg.Node, 64); err != nil {
		return nil, fmt.Errorf("sink: node %q: %w", cfg.Node, err)
	}
	if cfg.MaxAckPending <= 0 {
		cfg.MaxAckPending = 8
	}
	return &Sink{js: js, cfg: cfg}, nil
}

// Start creates the node's consumer (the dispatch stream must exist) and
// starts consuming.
func (s *Sink) Start(ctx context.Context) error {
	st, err := s.js.Stream(ctx, topology.StreamDispatch)
	if err != nil {
		return fmt.Errorf("sink %s: %w", s.cfg.Node, err)
	}
	cons, err := topology.EnsureConsumer(ctx, st, jetstream.ConsumerConfig{
		Durable:       topology.NodeConsumer(s.cfg.Node),
		FilterSubject: topology.DispatchSubject(s.cfg.Node),
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       30 * time.Second,
		MaxAckPending: s.cfg.MaxAckPending,
		MaxDeliver:    -1,
	})
	if err != nil {
		return fmt.Errorf("sink %s: %w", s.cfg.Node, err)
	}
	s.cc, err = cons.Consume(func(m jetstream.Msg) {
		if s.cfg.OnMsg != nil {
			s.cfg.OnMsg(m)
		}
		_ = m.Ack()
	}, jetstream.PullMaxMessages(s.cfg.MaxAckPending))
	if err != nil {
		return fmt.Errorf("sink %s: consume: %w", s.cfg.Node, err)
	}
	return nil
}

// Stop stops consuming after the buffered messages.
func (s *Sink) Stop() {
	if s.cc == nil {
		return
	}
	s.cc.Drain()
	<-s.cc.Closed()
	s.cc = nil
}

package dispatcher

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/shared/lifecycle"
)

// settler is publish-then-ack: a consumed message is acked only once what
// handling it published is stored, and nak'ed for redelivery when that
// failed. A crash in between handles the message again, and the message ids
// (or the results' expected-sequence rule) make the repeat harmless.
//
// One goroutine resolves the publish futures in publish order:
// acknowledgements arrive roughly in that order, so waiting in order costs
// little and one goroutine serves every publish in flight (at most the
// capacity given to newSettler).
type settler struct {
	lifecycle.Loop
	log      zerolog.Logger
	capacity int
	nakDelay time.Duration

	mu      sync.Mutex
	pending chan pendingAck // nil when not running
	slow    sync.WaitGroup  // follow-ups running off the loop
}

// pendingAck is one message waiting for a publish it caused.
type pendingAck struct {
	msg jetstream.Msg
	fut jetstream.PubAckFuture
	// then turns the publish's acknowledgement into the message's verdict:
	// nil acks it, an error naks it for redelivery.
	then func(*jetstream.PubAck, error) error
	// slow: then blocks (it publishes or reads): run it off the loop.
	slow bool
}

func newSettler(capacity int, log zerolog.Logger) *settler {
	return &settler{capacity: capacity, log: log, nakDelay: time.Second}
}

// Start starts the settle loop.
func (s *settler) Start(ctx context.Context) error {
	s.mu.Lock()
	if s.pending != nil {
		s.mu.Unlock()
		return lifecycle.ErrRunning
	}
	pending := make(chan pendingAck, s.capacity)
	s.pending = pending
	s.mu.Unlock()
	return s.Go(ctx, func(_ context.Context, ready func()) error {
		ready()
		for p := range pending { // until Stop closes it: every message is settled
			s.resolve(p)
		}
		s.slow.Wait()
		return nil
	})
}

// Stop settles every message still waiting and stops. Call it only once
// nothing calls After any more (the consumers have stopped).
func (s *settler) Stop() error {
	s.mu.Lock()
	if s.pending != nil {
		close(s.pending)
		s.pending = nil
	}
	s.mu.Unlock()
	return s.Loop.Stop()
}

// After settles msg once fut resolves, by then's verdict, on the settle
// loop: then must not block.
func (s *settler) After(msg jetstream.Msg, fut jetstream.PubAckFuture, then func(*jetstream.PubAck, error) error) {
	s.pending <- pendingAck{msg: msg, fut: fut, then: then}
}

// AfterSlow is After for a then that blocks (it publishes or reads): it
// runs on its own goroutine, and Stop waits for it.
func (s *settler) AfterSlow(msg jetstream.Msg, fut jetstream.PubAckFuture, then func(*jetstream.PubAck, error) error) {
	s.pending <- pendingAck{msg: msg, fut: fut, then: then, slow: true}
}

// Settle settles msg now: an ack when err is nil, else a nak for redelivery.
func (s *settler) Settle(msg jetstream.Msg, err error) {
	if err != nil {
		_ = msg.NakWithDelay(s.nakDelay)
		return
	}
	_ = msg.Ack()
}

func (s *settler) resolve(p pendingAck) {
	var ack *jetstream.PubAck
	var err error
	select {
	case ack = <-p.fut.Ok():
	case err = <-p.fut.Err():
	}
	if !p.slow {
		s.Settle(p.msg, p.then(ack, err))
		return
	}
	s.slow.Add(1)
	go func() {
		defer s.slow.Done()
		s.Settle(p.msg, p.then(ack, err))
	}()
}

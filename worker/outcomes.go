package worker

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/shared/jspub"
)

// outcomePublisher publishes outcomes asynchronously and acks each dispatch
// only once its outcome is stored: a task's slot is free as soon as its
// outcome is handed to the connection, instead of waiting a round trip (and
// the server's fsync) for the publish ack. At most window outcomes are
// unconfirmed at once. It is shared/jspub's publisher: each
// acknowledgement, read by hand on one reply subscription, acks its
// dispatch by callback (no future, channel or confirming goroutine per
// outcome).
type outcomePublisher struct {
	pub *jspub.Publisher
	// finished runs once per outcome, after its dispatch was acked or
	// nak'ed (the worker's task accounting).
	finished func()
}

func newOutcomePublisher(ctx context.Context, nc *nats.Conn, window int, timeout time.Duration, finished func()) (*outcomePublisher, error) {
	pub := jspub.New(nc, jspub.Config{MaxPending: window, Timeout: timeout})
	if err := pub.Start(ctx); err != nil {
		return nil, err
	}
	return &outcomePublisher{pub: pub, finished: finished}, nil
}

// publish hands the outcome to the connection and returns; the dispatch
// msg is acked once the outcome is stored, or nak'ed for redelivery when it
// cannot be (stop runs first in both cases). It blocks while window outcomes
// are unconfirmed. An error means the publish could not even start; the
// caller still owns msg.
func (p *outcomePublisher) publish(om *nats.Msg, msgID string, msg jetstream.Msg, log zerolog.Logger, stop func()) error {
	return p.pub.Publish(context.Background(), om, msgID, func(_ *jetstream.PubAck, err error) {
		stop()
		if err != nil {
			log.Error().Err(err).Msg("outcome not published; dispatch nak'ed for redelivery")
			if err := msg.NakWithDelay(nakDelay); err != nil {
				log.Warn().Err(err).Msg("nak failed")
			}
		} else if err := msg.Ack(); err != nil {
			// A plain ack, not a double ack: the outcome is stored, so a
			// lost ack costs only a redelivery, whose re-run outcome
			// JetStream drops as a duplicate (same Nats-Msg-Id) and which
			// the dispatcher would refuse as a second result anyway.
			log.Warn().Err(err).Msg("ack of the dispatch failed")
		}
		p.finished()
	})
}

// close waits for every pending outcome (at most the publish timeout);
// publish must not be called after.
func (p *outcomePublisher) close() { _ = p.pub.Stop() }

// progressTimer signals InProgress every interval until stop: a timer, not
// a goroutine per task.
func progressTimer(msg jetstream.Msg, every time.Duration, log zerolog.Logger) (stop func()) {
	var mu sync.Mutex
	stopped := false
	var t *time.Timer
	mu.Lock()
	defer mu.Unlock()
	t = time.AfterFunc(every, func() {
		if err := msg.InProgress(); err != nil {
			log.Debug().Err(err).Msg("in-progress signal failed")
		}
		mu.Lock()
		defer mu.Unlock()
		if !stopped {
			t.Reset(every)
		}
	})
	return func() {
		mu.Lock()
		defer mu.Unlock()
		stopped = true
		t.Stop()
	}
}

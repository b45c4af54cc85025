package worker

import (
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// outcomePublisher publishes outcomes asynchronously and acks each dispatch
// only once its outcome is stored: a task's slot is free as soon as its
// outcome is handed to the connection, instead of waiting a round trip (and
// the server's fsync) for the publish ack. At most window outcomes are
// unconfirmed at once. One goroutine waits for the acks in publish order
// (JetStream confirms a stream's writes in order), instead of one blocked
// goroutine and one reply timer per task.
type outcomePublisher struct {
	js      jetstream.JetStream // with the publish timeout as its async timeout
	window  chan struct{}
	pending chan pendingOutcome
	done    chan struct{}
	// finished runs once per outcome, after its dispatch was acked or
	// nak'ed (the worker's task accounting).
	finished func()
}

// pendingOutcome is an outcome handed to the connection whose dispatch is
// not yet acked.
type pendingOutcome struct {
	fut  jetstream.PubAckFuture
	msg  jetstream.Msg
	log  zerolog.Logger
	stop func() // stops the dispatch's in-progress signals
}

func newOutcomePublisher(js jetstream.JetStream, window int, finished func()) *outcomePublisher {
	p := &outcomePublisher{js: js, window: make(chan struct{}, window), pending: make(chan pendingOutcome, window),
		done: make(chan struct{}), finished: finished}
	go p.confirm()
	return p
}

// publish hands the outcome to the connection and returns; the dispatch
// msg is acked once the outcome is stored, or nak'ed for redelivery when it
// cannot be (stop runs first in both cases). It blocks while window outcomes
// are unconfirmed. An error means the publish could not even start; the
// caller still owns msg.
func (p *outcomePublisher) publish(om *nats.Msg, msgID string, msg jetstream.Msg, log zerolog.Logger, stop func()) error {
	p.window <- struct{}{}
	fut, err := p.js.PublishMsgAsync(om, jetstream.WithMsgID(msgID))
	if err != nil {
		<-p.window
		return err
	}
	p.pending <- pendingOutcome{fut: fut, msg: msg, log: log, stop: stop}
	return nil
}

// confirm acks (or naks) the dispatches in publish order.
func (p *outcomePublisher) confirm() {
	defer close(p.done)
	for po := range p.pending {
		select {
		case <-po.fut.Ok():
			po.stop()
			// A plain ack, not a double ack: the outcome is stored, so a
			// lost ack costs only a redelivery, whose re-run outcome
			// JetStream drops as a duplicate (same Nats-Msg-Id) and which
			// the dispatcher would refuse as a second result anyway.
			if err := po.msg.Ack(); err != nil {
				po.log.Warn().Err(err).Msg("ack of the dispatch failed")
			}
		case err := <-po.fut.Err():
			po.stop()
			po.log.Error().Err(err).Msg("outcome not published; dispatch nak'ed for redelivery")
			if err := po.msg.NakWithDelay(nakDelay); err != nil {
				po.log.Warn().Err(err).Msg("nak failed")
			}
		}
		<-p.window
		p.finished()
	}
}

// close waits for every pending outcome; publish must not be called after.
func (p *outcomePublisher) close() {
	close(p.pending)
	<-p.done
}

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

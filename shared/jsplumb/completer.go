package jsplumb

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Msg is what a Completer settles: a consumed JetStream message
// (jetstream.Msg has these methods) or anything else answered the same way,
// such as the dispatcher's direct report. Only a Completer calls them.
type Msg interface {
	Ack() error
	NakWithDelay(delay time.Duration) error
	InProgress() error
}

// Then turns a publish's acknowledgement (or error) into the verdict on the
// message that caused it: nil acks it, an error naks it for redelivery.
type Then func(ack *jetstream.PubAck, err error) error

// Completer is publish-then-ack, the one place mlsched's dispatcher and
// worker settle a consumed message: acked only once what handling it
// published is stored, nak'ed for redelivery when that failed. A crash in
// between handles the message again, and message ids (or the results'
// expected-sequence rule) make the repeat harmless. In the spirit of River's
// JobCompleter: handlers say what happened, the Completer settles.
//
// The zero value is not usable: set NakDelay (how long a message whose
// output could not be stored waits before its redelivery).
type Completer struct {
	NakDelay time.Duration
	// Settled, when set, runs after every message settled by a publish's
	// callback (Publish, PublishSlow), once its ack or nak is sent.
	Settled func()
	// Failed, when set, is told of an ack, nak or in-progress signal that
	// could not be sent (op is "ack", "nak" or "in progress"): a lost ack
	// costs a redelivery, which message ids make harmless.
	Failed func(op string, err error)
	// Acked, when set, is told of every message the Completer acked (its
	// ack sent without error): the dispatcher removes finished tasks from
	// a limits-retention task stream in batches, and learns of them here.
	Acked func(Msg)

	slow sync.WaitGroup // PublishSlow follow-ups running
}

// Publish publishes m through pub and settles msg by then's verdict once
// JetStream answers, on pub's reply goroutine: then must not block. An
// error means nothing was published and msg is not settled (the caller
// decides: usually Retry).
func (c *Completer) Publish(ctx context.Context, pub Sender, msg Msg, m *nats.Msg, msgID string, then Then) error {
	return pub.Publish(ctx, m, msgID, func(ack *jetstream.PubAck, err error) {
		c.settle(msg, then(ack, err))
	})
}

// PublishSlow is Publish for a then that blocks (it reads or publishes and
// waits): it runs on a goroutine of its own, which Wait waits for.
func (c *Completer) PublishSlow(ctx context.Context, pub Sender, msg Msg, m *nats.Msg, msgID string, then Then) error {
	c.slow.Add(1)
	err := pub.Publish(ctx, m, msgID, func(ack *jetstream.PubAck, err error) {
		go func() {
			defer c.slow.Done()
			c.settle(msg, then(ack, err))
		}()
	})
	if err != nil {
		c.slow.Done()
	}
	return err
}

func (c *Completer) settle(msg Msg, err error) {
	c.Settle(msg, err)
	if c.Settled != nil {
		c.Settled()
	}
}

// Settle settles msg now, for a message whose handling published nothing
// or whose publish is already answered: an ack when err is nil, else a nak
// for redelivery after NakDelay.
func (c *Completer) Settle(msg Msg, err error) {
	if err != nil {
		c.Retry(msg, c.NakDelay)
		return
	}
	err = msg.Ack()
	c.failed("ack", err)
	if err == nil && c.Acked != nil {
		c.Acked(msg)
	}
}

func (c *Completer) failed(op string, err error) {
	if err != nil && c.Failed != nil {
		c.Failed(op, err)
	}
}

// Retry hands msg back for redelivery after delay (0: at once): a durable
// backoff, or a message given back to another replica at shutdown.
func (c *Completer) Retry(msg Msg, delay time.Duration) {
	c.failed("nak", msg.NakWithDelay(delay)) // 0 sends a plain nak
}

// Progress tells the server msg is still being worked on (it is held, or
// its task runs), restarting its ack wait.
func (c *Completer) Progress(msg Msg) { c.failed("in progress", msg.InProgress()) }

// Wait waits for the PublishSlow follow-ups running. Call it once nothing
// publishes any more, before stopping the publishers they may use.
func (c *Completer) Wait() { c.slow.Wait() }

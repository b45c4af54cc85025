package worker

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/shared/topology"
)

// Consumer tuning. A pull waits consumerExpiry for messages with idle
// heartbeats every consumerHeartbeat; the consumer's existence is checked
// every consumerCheck (and at once when the client reports a problem), so a
// consumer deleted under the node is recreated within seconds.
var (
	consumerExpiry    = 10 * time.Second
	consumerHeartbeat = 2 * time.Second
	consumerCheck     = 2 * time.Second
)

// consumer pulls the node's dispatches and hands them to handle. It never
// has more than batch messages outstanding (with MaxAckPending = batch on
// the server), and it recreates its durable consumer when it disappears.
type consumer struct {
	stream jetstream.Stream
	cfg    jetstream.ConsumerConfig
	batch  int
	handle jetstream.MessageHandler
	log    zerolog.Logger

	kick chan struct{}
	stop chan struct{}
	done chan struct{}
}

// Start creates the consumer and starts pulling. An incompatible existing
// consumer is returned as an error (topology.ErrIncompatible).
func (c *consumer) Start(ctx context.Context) error {
	c.kick = make(chan struct{}, 1)
	c.stop = make(chan struct{})
	c.done = make(chan struct{})
	cc, err := c.consume(ctx)
	if err != nil {
		return err
	}
	go c.loop(cc)
	return nil
}

// Stop stops pulling; messages already received go through handle, which
// is expected to nak them while the worker drains.
func (c *consumer) Stop() {
	close(c.stop)
	<-c.done
}

func (c *consumer) consume(ctx context.Context) (jetstream.ConsumeContext, error) {
	cons, err := topology.EnsureConsumer(ctx, c.stream, c.cfg)
	if err != nil {
		return nil, err
	}
	return cons.Consume(c.handle,
		jetstream.PullMaxMessages(c.batch),
		jetstream.PullExpiry(consumerExpiry),
		jetstream.PullHeartbeat(consumerHeartbeat),
		jetstream.ConsumeErrHandler(c.onError))
}

// onError runs on the client's goroutine: it only wakes the loop.
func (c *consumer) onError(_ jetstream.ConsumeContext, err error) {
	switch {
	case errors.Is(err, jetstream.ErrConsumerDeleted), errors.Is(err, jetstream.ErrConsumerNotFound),
		errors.Is(err, jetstream.ErrNoHeartbeat):
		c.log.Warn().Err(err).Msg("dispatch consumer problem; checking it")
		select {
		case c.kick <- struct{}{}:
		default:
		}
	default:
		c.log.Debug().Err(err).Msg("dispatch consumer")
	}
}

func (c *consumer) loop(cc jetstream.ConsumeContext) {
	defer close(c.done)
	check := time.NewTicker(consumerCheck)
	defer check.Stop()
	for {
		var closed <-chan struct{}
		if cc != nil {
			closed = cc.Closed()
		}
		select {
		case <-c.stop:
			if cc != nil {
				cc.Drain()
				select {
				case <-cc.Closed():
				case <-time.After(5 * time.Second):
					cc.Stop()
				}
			}
			return
		case <-c.kick:
		case <-check.C:
		case <-closed:
		}
		cc = c.heal(cc)
	}
}

// heal returns a working consume context: cc when its consumer still
// exists, else a new one on a recreated consumer (nil if that failed; the
// next check retries).
func (c *consumer) heal(cc jetstream.ConsumeContext) jetstream.ConsumeContext {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if cc != nil {
		select {
		case <-cc.Closed():
			c.log.Warn().Msg("dispatch consumer stopped; restarting it")
		default:
			_, err := c.stream.Consumer(ctx, c.cfg.Durable)
			if err == nil {
				return cc
			}
			if !errors.Is(err, jetstream.ErrConsumerNotFound) {
				c.log.Debug().Err(err).Msg("dispatch consumer check failed") // e.g. reconnecting
				return cc
			}
			c.log.Warn().Str("consumer", c.cfg.Durable).Msg("dispatch consumer was deleted; recreating it")
			cc.Stop()
		}
	}
	ncc, err := c.consume(ctx)
	if err != nil {
		c.log.Error().Err(err).Msg("could not recreate the dispatch consumer; retrying")
		return nil
	}
	c.log.Info().Str("consumer", c.cfg.Durable).Msg("dispatch consumer recreated")
	return ncc
}

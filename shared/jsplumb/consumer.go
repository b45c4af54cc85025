// Consumer is the one self-healing durable pull consumer of
// mlsched, used by the dispatcher (task and outcome streams) and the worker
// (its dispatch subject). Consumers can be deleted under a process (an
// operator, a restart of a memory-backed server, a stream re-created): it
// notices through the client's errors (consumer deleted or not found, missed
// idle heartbeats), a closed consume context, or a periodic existence check,
// and re-creates the consumer and resumes. It is a lifecycle.Service.

package jsplumb

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/shared/lifecycle"
	"github.com/mlsched/mlsched/shared/topology"
)

// Consumer consumes one stream through one durable consumer.
type Consumer struct {
	lifecycle.Loop
	// JS and Stream name the stream; it is looked up again on every
	// re-creation, so a re-created stream is followed.
	JS     jetstream.JetStream
	Stream string
	// Config is the durable consumer's configuration (topology.EnsureConsumer).
	Config jetstream.ConsumerConfig
	Handle jetstream.MessageHandler
	// Pull bounds what one pull buffers (default 256); Expiry and Heartbeat
	// tune the pulls (defaults 30s and 5s).
	Pull      int
	Expiry    time.Duration
	Heartbeat time.Duration
	// Check is how often the consumer's existence is checked besides the
	// client's signals (default 5s).
	Check time.Duration
	// Recreate, when set, creates the stream when it is not found: a
	// memory-backed stream (the attempt streams, by default) does not
	// survive a restart of a single nats-server.
	Recreate func(ctx context.Context) error
	Log      zerolog.Logger

	kick chan struct{}
}

// Start creates the consumer (retrying, with backoff, what may be
// transient) and consumes until Stop, which drains what was pulled and
// returns once no handler runs any more. It
// returns once consuming, or with topology.ErrIncompatible when a consumer
// of that name exists with another configuration, or with ctx's error.
func (c *Consumer) Start(ctx context.Context) error {
	c.kick = make(chan struct{}, 1)
	return c.Go(ctx, c.run)
}

func (c *Consumer) run(ctx context.Context, ready func()) error {
	check := c.Check
	if check <= 0 {
		check = 5 * time.Second
	}
	backoff := 100 * time.Millisecond
	var cc jetstream.ConsumeContext
	for cc == nil {
		var err error
		if cc, err = c.consume(ctx); errors.Is(err, topology.ErrIncompatible) {
			return err
		} else if err != nil {
			c.Log.Warn().Err(err).Dur("retry_in", backoff).Msg("cannot consume, retrying")
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 5*time.Second)
		}
	}
	ready()
	tick := time.NewTicker(check)
	defer tick.Stop()
	for {
		var closed <-chan struct{}
		if cc != nil {
			closed = cc.Closed()
		}
		select {
		case <-ctx.Done():
			if cc != nil {
				// Drain hands what was pulled to Handle; once Closed no
				// handler runs any more, which the caller may rely on.
				cc.Drain()
				select {
				case <-cc.Closed():
				case <-time.After(5 * time.Second):
					cc.Stop()
					<-cc.Closed()
				}
			}
			return nil
		case <-c.kick:
		case <-tick.C:
		case <-closed:
		}
		cc = c.heal(ctx, cc)
	}
}

func (c *Consumer) consume(ctx context.Context) (jetstream.ConsumeContext, error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s, err := c.JS.Stream(cctx, c.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) && c.Recreate != nil {
		if err = c.Recreate(cctx); err == nil {
			c.Log.Warn().Msg("stream was gone (a memory-backed stream after a server restart): re-created it")
			s, err = c.JS.Stream(cctx, c.Stream)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", c.Stream, err)
	}
	cons, err := topology.EnsureConsumer(cctx, s, c.Config)
	if err != nil {
		return nil, err
	}
	pull, expiry, hb := c.Pull, c.Expiry, c.Heartbeat
	if pull <= 0 {
		pull = 256
	}
	if expiry <= 0 {
		expiry = 30 * time.Second
	}
	if hb <= 0 {
		hb = 5 * time.Second
	}
	return cons.Consume(c.Handle, jetstream.PullMaxMessages(pull), jetstream.PullExpiry(expiry),
		jetstream.PullHeartbeat(hb), jetstream.ConsumeErrHandler(c.onError))
}

// onError runs on the client's goroutine: it only wakes the loop.
func (c *Consumer) onError(_ jetstream.ConsumeContext, err error) {
	if errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrConsumerNotFound) ||
		errors.Is(err, jetstream.ErrNoHeartbeat) {
		c.Log.Warn().Err(err).Msg("consumer problem; checking it")
		select {
		case c.kick <- struct{}{}:
		default:
		}
		return
	}
	c.Log.Debug().Err(err).Msg("consumer")
}

// heal returns a working consume context: cc when its consumer still
// exists, else one on a re-created consumer (nil when that failed: the next
// check retries).
func (c *Consumer) heal(ctx context.Context, cc jetstream.ConsumeContext) jetstream.ConsumeContext {
	hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if cc != nil {
		select {
		case <-cc.Closed():
			c.Log.Warn().Msg("consumer stopped; restarting it")
		default:
			s, err := c.JS.Stream(hctx, c.Stream)
			if err == nil {
				_, err = s.Consumer(hctx, c.Config.Durable)
			}
			if err == nil {
				return cc
			}
			if !errors.Is(err, jetstream.ErrConsumerNotFound) && !errors.Is(err, jetstream.ErrStreamNotFound) {
				c.Log.Debug().Err(err).Msg("consumer check failed") // e.g. reconnecting
				return cc
			}
			c.Log.Warn().Err(err).Str("consumer", c.Config.Durable).Msg("consumer is gone; re-creating it")
			cc.Stop()
		}
	}
	ncc, err := c.consume(ctx)
	if err != nil {
		c.Log.Error().Err(err).Msg("could not re-create the consumer; retrying")
		return nil
	}
	c.Log.Info().Str("consumer", c.Config.Durable).Msg("consumer re-created")
	return ncc
}

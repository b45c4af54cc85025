package dispatcher

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/shared/lifecycle"
	"github.com/mlsched/mlsched/shared/topology"
)

// consumer consumes one stream through the durable consumer all replicas
// share. Consumers can be deleted under us (an operator, a restart of a
// memory-backed server): on ErrConsumerDeleted or missed heartbeats it
// re-creates the consumer and resumes.
type consumer struct {
	lifecycle.Loop
	d       *Dispatcher
	stream  string
	handler jetstream.MessageHandler
}

func (d *Dispatcher) newConsumer(stream string, h jetstream.MessageHandler) *consumer {
	return &consumer{d: d, stream: stream, handler: h}
}

func (c *consumer) config() jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       topology.ConsumerDispatcher,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       c.d.cfg.AckWait,
		MaxAckPending: 2 * c.d.cfg.MaxInFlight,
		MaxDeliver:    -1, // work-queue streams keep what hits MaxDeliver: we settle every message ourselves
	}
}

// Start consumes until Stop, which drains what was pulled; it is started
// once it consumes. A consumer that exists with an incompatible
// configuration ends it with topology.ErrIncompatible (see Done).
func (c *consumer) Start(ctx context.Context) error { return c.Go(ctx, c.run) }

func (c *consumer) run(ctx context.Context, ready func()) error {
	log := c.d.log.With().Str("stream", c.stream).Logger()
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		cons, err := c.ensure(ctx)
		if errors.Is(err, topology.ErrIncompatible) {
			return err
		}
		if err != nil {
			log.Warn().Err(err).Dur("retry_in", backoff).Msg("cannot create consumer, retrying")
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 5*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
		broken := make(chan error, 1)
		pull := min(c.d.cfg.MaxInFlight, 256)
		cc, err := cons.Consume(c.handler,
			jetstream.PullMaxMessages(pull),
			jetstream.PullHeartbeat(5*time.Second),
			jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
				if errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrNoHeartbeat) ||
					errors.Is(err, jetstream.ErrConsumerNotFound) {
					select {
					case broken <- err:
					default:
					}
				}
			}))
		if err != nil {
			log.Warn().Err(err).Msg("consume failed, retrying")
			continue
		}
		ready()
		select {
		case <-ctx.Done():
			cc.Drain()
			<-cc.Closed()
			return nil
		case err := <-broken:
			log.Warn().Err(err).Msg("consumer lost, re-creating it")
			cc.Stop()
			<-cc.Closed()
		}
	}
	return nil
}

func (c *consumer) ensure(ctx context.Context) (jetstream.Consumer, error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s, err := c.d.js.Stream(cctx, c.stream)
	if err != nil {
		return nil, err
	}
	return topology.EnsureConsumer(cctx, s, c.config())
}

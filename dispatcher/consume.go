package dispatcher

import (
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/shared/jsconsume"
	"github.com/mlsched/mlsched/shared/topology"
)

// newConsumer consumes one stream through the durable consumer all replicas
// share (shared/jsconsume re-creates it when it is deleted under us). A
// consumer that exists with an incompatible configuration ends it with
// topology.ErrIncompatible.
func (d *Dispatcher) newConsumer(stream string, h jetstream.MessageHandler) *jsconsume.Consumer {
	return &jsconsume.Consumer{JS: d.js, Stream: stream, Handle: h,
		Config: jetstream.ConsumerConfig{
			Durable:       topology.ConsumerDispatcher,
			AckPolicy:     jetstream.AckExplicitPolicy,
			AckWait:       d.cfg.AckWait,
			MaxAckPending: 2 * d.cfg.MaxInFlight,
			MaxDeliver:    -1, // work-queue streams keep what hits MaxDeliver: we settle every message ourselves
		},
		Pull: min(d.cfg.MaxInFlight, 256), Heartbeat: 5 * time.Second, Check: 5 * time.Second,
		Log: d.log.With().Str("stream", stream).Logger()}
}

package worker

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/shared/protocol"
)

// heartbeat announces the node in the nodes bucket every interval; the
// bucket's TTL removes a node that stops announcing.
type heartbeat struct {
	kv       jetstream.KeyValue
	node     string
	every    time.Duration
	models   []protocol.ModelInfo
	capacity int
	inFlight func() int
	draining *atomic.Bool
	started  time.Time
	log      zerolog.Logger
}

// Run beats at once and then every interval until ctx ends.
func (h *heartbeat) Run(ctx context.Context) {
	t := time.NewTicker(h.every)
	defer t.Stop()
	for {
		bctx, cancel := context.WithTimeout(ctx, h.every)
		if err := h.Beat(bctx); err != nil && ctx.Err() == nil {
			h.log.Warn().Err(err).Msg("heartbeat failed")
		}
		cancel()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Beat puts the node's current heartbeat.
func (h *heartbeat) Beat(ctx context.Context) error {
	b, err := json.Marshal(protocol.Heartbeat{
		Node: h.node, Models: h.models, Capacity: h.capacity, InFlight: h.inFlight(),
		Draining: h.draining.Load(), StartedAt: h.started, SentAt: time.Now().UTC(),
	})
	if err != nil {
		return err
	}
	_, err = h.kv.Put(ctx, h.node, b)
	return err
}

// Remove deletes the node's entry, so dispatchers forget it at once.
func (h *heartbeat) Remove(ctx context.Context) error { return h.kv.Delete(ctx, h.node) }

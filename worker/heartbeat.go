package worker

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/shared/protocol"
)

// heartbeat announces the node in the nodes bucket every interval; the
// bucket's TTL removes a node that stops announcing.
type heartbeat struct {
	kv     jetstream.KeyValue
	node   string
	every  time.Duration
	models func() []protocol.ModelInfo // the models announced now
	// unready lists the hosted models not announced now, and why (may be nil).
	unready func() []protocol.UnreadyModel
	// kick makes Run beat at once (a model turned ready or unready).
	kick     chan struct{}
	capacity int
	inFlight func() int
	// queued is the work sent to the node and not started (nil: none).
	queued   func(context.Context) int
	draining *atomic.Bool
	started  time.Time
	log      zerolog.Logger
	// ensure recreates the bucket, which is memory-backed and so is gone
	// after a server restart.
	ensure func(context.Context) (jetstream.KeyValue, error)
	mu     sync.Mutex // guards kv
}

func (h *heartbeat) bucket() jetstream.KeyValue {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.kv
}

// Run beats at once and then every interval until ctx ends.
func (h *heartbeat) Run(ctx context.Context) {
	t := time.NewTicker(h.every)
	defer t.Stop()
	for {
		bctx, cancel := context.WithTimeout(ctx, max(h.every, time.Second))
		if err := h.Beat(bctx); err != nil && ctx.Err() == nil {
			h.log.Warn().Err(err).Msg("heartbeat failed; re-creating the node bucket")
			if kv, err := h.ensure(bctx); err == nil {
				h.mu.Lock()
				h.kv = kv
				h.mu.Unlock()
				if err := h.Beat(bctx); err == nil {
					h.log.Info().Msg("heartbeat restored")
				}
			}
		}
		cancel()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-h.kick:
		}
	}
}

// Beat puts the node's current heartbeat.
func (h *heartbeat) Beat(ctx context.Context) error {
	hb := protocol.Heartbeat{
		Node: h.node, Models: h.models(), Capacity: h.capacity, InFlight: h.inFlight(),
		Draining: h.draining.Load(), StartedAt: h.started, SentAt: time.Now().UTC(),
		CompactDispatch: true, // protocol.ParseDispatch reads both encodings
	}
	if h.unready != nil {
		hb.Unready = h.unready()
	}
	if h.queued != nil && !hb.Draining {
		// one request to the server, bounded so that it never delays a beat
		qctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		hb.Queued = h.queued(qctx)
		cancel()
	}
	b, err := json.Marshal(hb)
	if err != nil {
		return err
	}
	_, err = h.bucket().Put(ctx, h.node, b)
	return err
}

// Kick asks Run to beat now.
func (h *heartbeat) Kick() {
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

// Remove deletes the node's entry, so dispatchers forget it at once.
func (h *heartbeat) Remove(ctx context.Context) error { return h.bucket().Delete(ctx, h.node) }

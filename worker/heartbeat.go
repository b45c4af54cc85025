package worker

import (
	"context"
	"encoding/json"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/shared/protocol"
)

// loadEvery is how often a node whose load moves beats, besides its
// interval. A beat's running and queued figures steer every dispatcher's
// load model until the next one: stale by up to an interval (1 s), a queue
// the node has drained still looks full, and the dispatchers hold their
// tasks while it idles. Each replica counts the outcomes it receives
// against that figure, so one replica saw the drain and two did not
// (issue 20, TestFlowOverloadMix at 150 ms queue target: 189 tasks/s of
// 320 on 2 replicas, and 283 with 200 ms beats).
const loadEvery = 200 * time.Millisecond

// heartbeat announces the node in the nodes bucket every interval, and
// every loadEvery while its load moves (its in-flight count changed, or
// it had work queued); the bucket's TTL removes a node that stops
// announcing.
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
	prefetch int
	inFlight func() int
	// queued is the work sent to the node and not started (nil: none).
	queued   func(context.Context) int
	draining *atomic.Bool
	started  time.Time
	// host is the host name announced next to the node id (hostName).
	host string
	log  zerolog.Logger
	// ensure recreates the bucket, which is memory-backed and so is gone
	// after a server restart.
	ensure func(context.Context) (jetstream.KeyValue, error)
	mu     sync.Mutex // guards kv
	// lastInFlight and lastQueued are the last beat's load figures.
	lastInFlight, lastQueued atomic.Int64
}

func (h *heartbeat) bucket() jetstream.KeyValue {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.kv
}

// Run beats at once and then every interval, and every loadEvery while
// the load moves, until ctx ends.
func (h *heartbeat) Run(ctx context.Context) {
	t := time.NewTicker(h.every)
	defer t.Stop()
	load := time.NewTicker(min(h.every, loadEvery))
	defer load.Stop()
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
		if !h.next(ctx, t.C, load.C) {
			return
		}
	}
}

// next waits for the next beat: the interval, a kick, or loadEvery while
// the load moves; false once ctx ends.
func (h *heartbeat) next(ctx context.Context, every, load <-chan time.Time) bool {
	for {
		select {
		case <-ctx.Done():
			return false
		case <-every:
			return true
		case <-h.kick:
			return true
		case <-load:
			if h.loadMoved() {
				return true
			}
		}
	}
}

// loadMoved reports whether the load the last beat announced may be stale:
// the in-flight count changed since, or work was queued then.
func (h *heartbeat) loadMoved() bool {
	return int64(h.inFlight()) != h.lastInFlight.Load() || h.lastQueued.Load() > 0
}

// Beat puts the node's current heartbeat.
func (h *heartbeat) Beat(ctx context.Context) error {
	hb := protocol.Heartbeat{
		Node: h.node, Host: h.host, Models: h.models(), Capacity: h.capacity, Prefetch: h.prefetch, InFlight: h.inFlight(),
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
	if _, err = h.bucket().Put(ctx, h.node, b); err == nil {
		h.lastInFlight.Store(int64(hb.InFlight))
		h.lastQueued.Store(int64(hb.Queued))
	}
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

// hostName is what a heartbeat announces as the node's host: the machine's
// (a container's: its short id, as `docker ps` shows it), so that an
// operator can tell which container or host a node is, its id being a
// 56-character key for a pool worker. "" when the system will not say.
func hostName() string {
	h, err := os.Hostname()
	if err != nil {
		return ""
	}
	return h
}

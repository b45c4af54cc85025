// Package registry keeps the dispatcher's view of live worker nodes.
//
// Workers put a protocol.Heartbeat under their node id in the JetStream
// key-value bucket MLSCHED_NODES every heartbeat interval. The registry
// watches the bucket, so a restarted dispatcher knows every node at once, and
// expires a node whose heartbeat is older than the TTL by its own clock
// (receive time), so skewed worker clocks do not matter.
package registry

import (
	"context"
	"encoding/json"
	"errors"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/shared/jsplumb"
	"github.com/mlsched/mlsched/shared/protocol"
)

// Registry is a live view of the nodes. Safe for concurrent use.
type Registry struct {
	kv  jetstream.KeyValue
	ttl time.Duration
	log zerolog.Logger
	now func() time.Time

	mu    sync.Mutex
	nodes map[string]entry
	// clamped is when each node's absurd figures were last logged.
	clamped map[string]time.Time
	live    atomic.Pointer[[]protocol.Heartbeat]
	// compact holds the live nodes that read compact dispatches.
	compact atomic.Pointer[map[string]bool]
	// costs holds the declared cost of each (node, model) that declares
	// one; nil when none does, so that a cluster without costs pays one
	// load per dispatch for them.
	costs atomic.Pointer[map[NodeModel]protocol.ModelInfo]
	ready chan struct{}
	// members is the last published membership (ids, models and types);
	// joined gets a signal when it changes (under mu).
	members string
	joined  chan struct{}
	once    sync.Once

	refused    atomic.Int64 // heartbeats that failed validation
	nextWarn   time.Time    // bounded-rate logging of refused heartbeats (under mu)
	suppressed int64
}

type entry struct {
	hb   protocol.Heartbeat
	seen time.Time
}

// New returns a registry over the nodes bucket; ttl is how long a node stays
// live after its last heartbeat (default 10s).
func New(kv jetstream.KeyValue, ttl time.Duration, log zerolog.Logger) *Registry {
	if ttl <= 0 {
		ttl = 10 * time.Second
	}
	r := &Registry{kv: kv, ttl: ttl, log: log, now: time.Now, nodes: map[string]entry{}, clamped: map[string]time.Time{}, ready: make(chan struct{}), joined: make(chan struct{}, 1)}
	r.live.Store(&[]protocol.Heartbeat{})
	r.compact.Store(&map[string]bool{})
	return r
}

// Live returns the live nodes sorted by id. The slice must not be modified.
func (r *Registry) Live() []protocol.Heartbeat { return *r.live.Load() }

// CompactDispatch reports whether live node reads the compact dispatch
// encoding (protocol.HdrDispatch), as its last heartbeat said.
func (r *Registry) CompactDispatch(node string) bool { return (*r.compact.Load())[node] }

// NodeModel names a model on a node.
type NodeModel struct{ Node, Model string }

// Cost is what an attempt of model on node costs for a task of the given
// size, as the node announces it (protocol.ModelInfo.Cost); declared
// reports whether the model declares a cost there at all.
func (r *Registry) Cost(node, model string, size float64) (cost float64, declared bool) {
	m := r.costs.Load()
	if m == nil {
		return 0, false
	}
	mi, ok := (*m)[NodeModel{node, model}]
	if !ok {
		return 0, false
	}
	return mi.Cost(size), true
}

// Refused counts the heartbeats ignored as invalid (protocol.Heartbeat.Validate).
// Changed gets a signal (coalesced) whenever the membership changes: a node
// joins or leaves, or changes what it hosts. Load figures do not count. A
// decision table built from Live can be rebuilt at once instead of at its
// next refresh, so that a burst of tasks arriving just after a node joined
// is not turned away as "no node serves this type".
func (r *Registry) Changed() <-chan struct{} { return r.joined }

func (r *Registry) Refused() int64 { return r.refused.Load() }

// Ready is closed once the bucket's initial contents are loaded.
func (r *Registry) Ready() <-chan struct{} { return r.ready }

// Run watches the bucket until ctx is done, re-creating the watch when it
// fails (NATS restarts, bucket recreated).
func (r *Registry) Run(ctx context.Context) error {
	// Heartbeats come more often than the TTL, so a silent TTL means no node
	// is left or the watch went blind (a re-created bucket): Silence makes
	// jsplumb.Follow read the bucket afresh.
	jsplumb.Follow(ctx, r.kv, r.apply, func() { r.once.Do(func() { close(r.ready) }) },
		jsplumb.FollowOptions{Silence: r.ttl, Tick: r.ttl / 4, OnTick: r.expire, Log: r.log.With().Str("component", "node registry").Logger()})
	return nil
}

func (r *Registry) apply(e jetstream.KeyValueEntry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch e.Operation() {
	case jetstream.KeyValueDelete, jetstream.KeyValuePurge:
		delete(r.nodes, e.Key())
	default:
		var hb protocol.Heartbeat
		err := json.Unmarshal(e.Value(), &hb)
		if err == nil {
			err = hb.Validate(e.Key())
		}
		if err != nil {
			// Not a node the dispatcher may route to: a dotted id would make a
			// subject outside the dispatch stream, a huge capacity would draw
			// every task. Forget any earlier entry under the key.
			r.refused.Add(1)
			delete(r.nodes, e.Key())
			r.publishLocked()
			if now := r.now(); now.After(r.nextWarn) {
				r.nextWarn = now.Add(10 * time.Second)
				key := e.Key()
				if len(key) > 80 {
					key = key[:80] + "..."
				}
				r.log.Warn().Err(err).Str("key", key).Int64("suppressed_since_last", r.suppressed).
					Msg("node registry: ignoring an invalid heartbeat")
				r.suppressed = 0
			} else {
				r.suppressed++
			}
			return
		}
		// Absurd load figures are clamped, never a reason to stop routing
		// to the node; logged once a minute per node.
		if fixes := hb.Clamp(); len(fixes) > 0 {
			if now := r.now(); now.Sub(r.clamped[hb.Node]) >= clampLogEvery {
				r.clamped[hb.Node] = now
				r.log.Warn().Str("node", hb.Node).Strs("clamped", fixes).Msg("node registry: heartbeat with absurd load figures, clamped")
			}
		}
		// A heartbeat replayed from the bucket may be old: trust its age
		// as the bucket reports it, not the worker's clock.
		seen := e.Created()
		if now := r.now(); seen.After(now) || seen.IsZero() {
			seen = now
		}
		r.nodes[e.Key()] = entry{hb: hb, seen: seen}
	}
	r.publishLocked()
}

func (r *Registry) expire() {
	r.mu.Lock()
	defer r.mu.Unlock()
	cut := r.now().Add(-r.ttl)
	changed := false
	for id, e := range r.nodes {
		if e.seen.Before(cut) {
			delete(r.nodes, id)
			changed = true
			r.log.Warn().Str("node", id).Msg("node expired: no heartbeat within the TTL")
		}
	}
	if changed {
		r.publishLocked()
	}
}

func (r *Registry) publishLocked() {
	cut := r.now().Add(-r.ttl)
	live := make([]protocol.Heartbeat, 0, len(r.nodes))
	for _, e := range r.nodes {
		if !e.seen.Before(cut) {
			live = append(live, e.hb)
		}
	}
	sort.Slice(live, func(i, j int) bool { return live[i].Node < live[j].Node })
	r.live.Store(&live)
	compact := make(map[string]bool)
	for _, hb := range live {
		if hb.CompactDispatch {
			compact[hb.Node] = true
		}
	}
	r.compact.Store(&compact)
	var costs map[NodeModel]protocol.ModelInfo
	for _, hb := range live {
		for _, m := range hb.Models {
			if m.CostPerTask > 0 || m.CostPerUnit > 0 {
				if costs == nil {
					costs = map[NodeModel]protocol.ModelInfo{}
				}
				costs[NodeModel{hb.Node, m.Name}] = m
			}
		}
	}
	if costs == nil {
		r.costs.Store(nil)
	} else {
		r.costs.Store(&costs)
	}
	if m := membership(live); m != r.members {
		r.members = m
		select {
		case r.joined <- struct{}{}:
		default:
		}
	}
}

// membership describes which node hosts which models for which types.
func membership(live []protocol.Heartbeat) string {
	var b strings.Builder
	for _, hb := range live {
		b.WriteString(hb.Node)
		for _, m := range hb.Models {
			b.WriteByte(' ')
			b.WriteString(m.Name)
			for _, t := range m.Types {
				b.WriteByte(',')
				b.WriteString(t)
			}
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// clampLogEvery bounds the rate of the log line about a node's absurd
// heartbeat figures.
const clampLogEvery = time.Minute

// ErrNoNodes is returned by WaitFor when no node became live in time.
var ErrNoNodes = errors.New("no live node")

// WaitFor blocks until at least n nodes are live or ctx is done.
func (r *Registry) WaitFor(ctx context.Context, n int) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for len(r.Live()) < n {
		select {
		case <-ctx.Done():
			return errors.Join(ErrNoNodes, ctx.Err())
		case <-t.C:
		}
	}
	return nil
}

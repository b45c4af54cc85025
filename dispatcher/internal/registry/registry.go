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

	// served is when a live node last served each task type (under mu;
	// served.Load a copy for readers): a type whose nodes have all gone
	// within a short while is in an outage, not unserved.
	served     map[string]time.Time
	servedCopy atomic.Pointer[map[string]time.Time]
	// silent: nodes are known but none has been heard from for half the
	// TTL (the bucket or the watch is blind, see expire).
	silent atomic.Bool

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
	r := &Registry{kv: kv, ttl: ttl, log: log, now: time.Now, nodes: map[string]entry{}, clamped: map[string]time.Time{}, ready: make(chan struct{}), joined: make(chan struct{}, 1),
		served: map[string]time.Time{}}
	r.live.Store(&[]protocol.Heartbeat{})
	r.servedCopy.Store(&map[string]time.Time{})
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

// Served is when a live node last served typ (zero: never, as far as this
// registry has seen).
func (r *Registry) Served(typ string) time.Time { return (*r.servedCopy.Load())[typ] }

// ServedTypes is when a live node last served each type it remembers (the
// map must not be modified).
func (r *Registry) ServedTypes() map[string]time.Time { return *r.servedCopy.Load() }

// Silent reports whether the registry has heard from no node for half the
// TTL although it knows some: every node silent at once is the bucket (or
// this replica's view of it) failing, not every node dying.
func (r *Registry) Silent() bool { return r.silent.Load() }

// expire forgets the nodes not heard from within the TTL. Nodes beat every
// second or so (far more often than the TTL), so when none at all has been
// heard from for half the TTL, what went silent is the bucket, or this
// replica's watch of it (its stream leader cut off, paused or restarting),
// not every node: the registry is blind. Blind, it forgets nobody one by
// one (their last heartbeats differ by up to an interval, and for that
// while the types whose nodes were heard from first would look unserved
// while others are not: the chaos-cluster failure of issue 39), and
// forgets all of them at once when the last heard from is older than the
// TTL. Then nobody is live: an outage, which the dispatcher waits out
// (unserved.go).
func (r *Registry) expire() {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	cut := r.cutLocked(now)
	for id, e := range r.nodes {
		if e.seen.Before(cut) {
			delete(r.nodes, id)
			r.log.Warn().Str("node", id).Bool("registry_silent", r.silent.Load()).Msg("node expired: no heartbeat within the TTL")
		}
	}
	// published even when nobody expired: the served stamps and silence
	r.publishLocked()
}

// cutLocked is the time before which a node's last heartbeat makes it
// expired: the TTL ago, or while the registry is blind, all or none (see
// expire).
func (r *Registry) cutLocked(now time.Time) time.Time {
	cut := now.Add(-r.ttl)
	var newest time.Time
	for _, e := range r.nodes {
		if e.seen.After(newest) {
			newest = e.seen
		}
	}
	silent := len(r.nodes) > 0 && newest.Before(now.Add(-r.ttl/2))
	if silent != r.silent.Load() {
		r.silent.Store(silent)
		if silent {
			r.log.Warn().Int("nodes", len(r.nodes)).Dur("since", now.Sub(newest)).
				Msg("node registry silent: no node heard from for half the TTL; nodes are kept, then forgotten together (an outage, not deaths)")
		} else {
			r.log.Info().Msg("node registry: heartbeats again")
		}
	}
	if !silent {
		return cut
	}
	if newest.Before(cut) {
		return now.Add(time.Hour) // every one: the last heard from has expired too
	}
	return time.Time{} // none yet
}

func (r *Registry) publishLocked() {
	now := r.now()
	cut := r.cutLocked(now)
	live := make([]protocol.Heartbeat, 0, len(r.nodes))
	for _, e := range r.nodes {
		if !e.seen.Before(cut) {
			live = append(live, e.hb)
		}
	}
	sort.Slice(live, func(i, j int) bool { return live[i].Node < live[j].Node })
	r.live.Store(&live)
	r.noteServedLocked(live, now)
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

// noteServedLocked stamps the types the live nodes serve. The copy readers
// see is replaced when a type is new or its stamp is a second old, so a
// heartbeat a second costs a map copy at most that often.
func (r *Registry) noteServedLocked(live []protocol.Heartbeat, now time.Time) {
	stale := false
	for _, hb := range live {
		for _, m := range hb.Models {
			for _, t := range m.Types {
				if last, ok := r.served[t]; !ok || now.Sub(last) >= time.Second {
					stale = true
				}
				r.served[t] = now
			}
		}
	}
	if !stale {
		return
	}
	cp := make(map[string]time.Time, len(r.served))
	for t, at := range r.served {
		if now.Sub(at) > servedMemory {
			delete(r.served, t)
			continue
		}
		cp[t] = at
	}
	r.servedCopy.Store(&cp)
}

// servedMemory is how long a type no node serves is remembered as served.
const servedMemory = time.Hour

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

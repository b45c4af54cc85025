package stats

import (
	"context"
	"sync"
	"time"
)

// Memory is the in-process Store of the single-process mode and the
// simulator. Each series keeps a ring of buckets over the window, so Record
// is a few array updates under one mutex and allocates nothing once a
// (model, node) has been seen.
type Memory struct {
	w     Window
	slots int64 // ring length: the buckets of Window.Range
	now   func() time.Time

	mu       sync.Mutex
	models   map[string]*memModel
	breakers map[BreakerKey]Breaker
}

// MemoryOption configures a Memory store.
type MemoryOption func(*Memory)

// WithClock sets the clock that dates events with a zero At and decides
// which buckets are in the window (default time.Now). The simulator passes
// its simulated clock.
func WithClock(now func() time.Time) MemoryOption {
	return func(m *Memory) {
		if now != nil {
			m.now = now
		}
	}
}

// NewMemory returns an empty in-memory store over window w (zero fields take
// the defaults of Window).
func NewMemory(w Window, opts ...MemoryOption) *Memory {
	w = w.WithDefaults()
	m := &Memory{
		w:        w,
		slots:    w.Buckets() + 1,
		now:      time.Now,
		models:   make(map[string]*memModel),
		breakers: make(map[BreakerKey]Breaker),
	}
	for _, o := range opts {
		o(m)
	}
	return m
}

var _ Store = (*Memory)(nil)

type memBucket struct {
	idx    int64
	used   bool
	counts Counts
	failUs int64
	hist   Histogram
}

type memSeries struct {
	ring        []memBucket
	inFlight    int64
	consec      int64
	lastOutcome int64 // UnixNanos
}

type memModel struct {
	memSeries
	nodes map[string]*memSeries
}

// Record applies the events in order. An invalid event rejects the whole
// batch with ErrInvalidEvent.
func (m *Memory) Record(ctx context.Context, events []Event) error {
	if len(events) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := ValidateBatch(events); err != nil {
		return err
	}
	now := m.now()
	first, last := m.w.Range(now)
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range events {
		ev := &events[i]
		idx, inWindow := m.w.eventBucket(ev.At, first, last)
		at := ev.At
		if at.IsZero() {
			at = now
		}
		e := memEvent{
			kind: ev.Kind, late: ev.Late, idx: idx, inWindow: inWindow,
			latUs: ev.Latency.Microseconds(), at: at.UnixNano(), latBucket: -1,
		}
		if ev.Kind == KindSuccess {
			e.latBucket = BucketOf(ev.Latency)
		}
		mm := m.models[ev.Model]
		if mm == nil {
			mm = &memModel{memSeries: m.newSeries(), nodes: make(map[string]*memSeries)}
			m.models[ev.Model] = mm
		}
		m.apply(&mm.memSeries, &e)
		if ev.Node != "" {
			ns := mm.nodes[ev.Node]
			if ns == nil {
				s := m.newSeries()
				ns = &s
				mm.nodes[ev.Node] = ns
			}
			m.apply(ns, &e)
		}
	}
	return nil
}

// memEvent is an Event resolved once for both of its series.
type memEvent struct {
	kind      Kind
	late      bool
	inWindow  bool
	idx       int64
	latUs     int64
	at        int64
	latBucket int
}

func (m *Memory) newSeries() memSeries {
	return memSeries{ring: make([]memBucket, m.slots)}
}

func (m *Memory) apply(s *memSeries, e *memEvent) {
	if e.inWindow {
		slot := e.idx % m.slots
		if slot < 0 {
			slot += m.slots
		}
		b := &s.ring[slot]
		switch {
		case !b.used || b.idx < e.idx:
			*b = memBucket{idx: e.idx, used: true}
		case b.idx > e.idx:
			// the slot already holds a newer bucket: e is out of the window
			b = nil
		}
		if b != nil {
			b.counts.Count(e.kind, e.late)
			if e.kind.IsFailure() {
				b.failUs += e.latUs
			}
			if e.latBucket >= 0 {
				b.hist[e.latBucket]++
			}
		}
	}
	// The in-flight gauge is a signed sum, read clamped at 0: an attempt's
	// outcome may be recorded before its dispatch (replicas and batches race),
	// and the pair must cancel out in either order. A late outcome does not
	// finish its attempt again: the lost outcome already did.
	switch {
	case e.kind == KindDispatched:
		s.inFlight++
	case !e.late:
		s.inFlight--
	}
	switch {
	case e.kind == KindSuccess:
		s.consec = 0
	case e.kind.IsFailure():
		s.consec++
	}
	if e.kind.IsOutcome() && e.at > s.lastOutcome {
		s.lastOutcome = e.at
	}
}

// Snapshot sums the buckets in the window of every series.
func (m *Memory) Snapshot(ctx context.Context) (*Snapshot, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	now := m.now()
	first, last := m.w.Range(now)
	recent := m.w.RecentFirst(now)
	snap := &Snapshot{Taken: now, Window: m.w.Span(), Models: make(map[string]*ModelStats)}
	m.mu.Lock()
	defer m.mu.Unlock()
	for name, mm := range m.models {
		ms := &ModelStats{}
		seen := m.fill(&ms.Series, &mm.memSeries, BreakerKey{Model: name}, first, recent, last)
		for node, ns := range mm.nodes {
			s := &Series{}
			if m.fill(s, ns, BreakerKey{Model: name, Node: node}, first, recent, last) {
				if ms.Nodes == nil {
					ms.Nodes = make(map[string]*Series)
				}
				ms.Nodes[node] = s
				seen = true
			}
		}
		if seen {
			snap.Models[name] = ms
		}
	}
	// breakers of models or nodes that have no statistics at all
	for k, b := range m.breakers {
		if b.State == BreakerClosed {
			continue
		}
		ms := snap.Models[k.Model]
		if ms == nil {
			ms = &ModelStats{}
			ms.Breaker = m.breakers[BreakerKey{Model: k.Model}]
			snap.Models[k.Model] = ms
		}
		if k.Node != "" && ms.Nodes[k.Node] == nil {
			if ms.Nodes == nil {
				ms.Nodes = make(map[string]*Series)
			}
			ms.Nodes[k.Node] = &Series{Breaker: b}
		}
	}
	return snap, nil
}

// fill sums s into out and reports whether the series belongs in a
// snapshot: events in the window, a non-zero gauge or a non-closed breaker.
// Buckets from recent on are also summed into out.Recent.
func (m *Memory) fill(out *Series, s *memSeries, key BreakerKey, first, recent, last int64) bool {
	var events int64
	for i := range s.ring {
		b := &s.ring[i]
		if !b.used || b.idx < first || b.idx > last {
			continue
		}
		out.Counts.Add(b.counts)
		if b.idx >= recent {
			out.Recent.Add(b.counts)
		}
		out.Latency.Add(&b.hist)
		out.FailLatencySumUs += b.failUs
		events++
	}
	out.InFlight = max(s.inFlight, 0)
	out.ConsecutiveFailures = s.consec
	out.LastOutcome = FromUnixNanos(s.lastOutcome)
	out.Breaker = m.breakers[key]
	return events > 0 || s.inFlight > 0 || s.consec != 0 || out.Breaker.State != BreakerClosed
}

// SetBreaker is a compare-and-set on (State, Since); a breaker never set is
// Breaker{} (closed since the zero time).
func (m *Memory) SetBreaker(ctx context.Context, key BreakerKey, from, to Breaker) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	cur := m.breakers[key]
	if cur.State != from.State || UnixNanos(cur.Since) != UnixNanos(from.Since) {
		return false, nil
	}
	to.Since = FromUnixNanos(UnixNanos(to.Since))
	m.breakers[key] = to
	return true, nil
}

// Close does nothing; the store stays usable.
func (m *Memory) Close() error { return nil }

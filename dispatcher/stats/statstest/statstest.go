// Package statstest is the conformance suite every stats.Store backend
// runs, so that the in-memory store of the simulator and the Redis store of
// the cluster keep exactly the same semantics.
package statstest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mlsched/mlsched/dispatcher/stats"
)

// Window is the window every store under test must be built with.
var Window = stats.Window{Size: time.Minute, Bucket: 10 * time.Second}

// Epoch is where every fake clock starts: the start of a bucket.
var Epoch = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// Clock is a fake clock safe for concurrent use.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a clock at t.
func NewClock(t time.Time) *Clock { return &Clock{now: t} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	c.now = t
	c.mu.Unlock()
}

// NewStore builds an empty store over Window whose clock is now.
type NewStore func(t *testing.T, now func() time.Time) stats.Store

// Run runs the conformance suite against the stores newStore builds. Every
// case gets its own store and clock and runs in parallel with the others.
func Run(t *testing.T, newStore func(t *testing.T, now func() time.Time) stats.Store) {
	cases := []struct {
		name string
		fn   func(t *testing.T, h *harness)
	}{
		{"Empty", testEmpty},
		{"CountsPerKindModelNode", testCounts},
		{"ZeroAtUsesClock", testZeroAt},
		{"WindowExpiry", testWindowExpiry},
		{"WindowBucketBoundary", testBucketBoundary},
		{"RecentBuckets", testRecent},
		{"OutOfWindowEventMovesGaugesOnly", testOldEvent},
		{"FutureEventClampedToNow", testFuture},
		{"LatencyQuantiles", testLatency},
		{"FailLatencySum", testFailLatency},
		{"InFlightGauge", testInFlight},
		{"ConsecutiveFailures", testConsecutive},
		{"TaskErrorsAreNotFailures", testTaskErrors},
		{"LateFlag", testLate},
		{"LastOutcome", testLastOutcome},
		{"InvalidEventRejectsBatch", testInvalid},
		{"BreakerCAS", testBreakerCAS},
		{"BreakerOnlyModelsAppear", testBreakerOnly},
		{"BreakerConcurrentCAS", testBreakerConcurrent},
		{"ConcurrentRecord", testConcurrentRecord},
		{"ManyModelsAndNodes", testManyModels},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			clock := NewClock(Epoch)
			s := newStore(t, clock.Now)
			t.Cleanup(func() { _ = s.Close() })
			h := &harness{t: t, s: s, clock: clock}
			c.fn(t, h)
		})
	}
}

type harness struct {
	t     *testing.T
	s     stats.Store
	clock *Clock
}

func (h *harness) ctx() context.Context { return h.t.Context() }

func (h *harness) record(events ...stats.Event) {
	h.t.Helper()
	if err := h.s.Record(h.ctx(), events); err != nil {
		h.t.Fatalf("Record: %v", err)
	}
}

func (h *harness) snap() *stats.Snapshot {
	h.t.Helper()
	s, err := h.s.Snapshot(h.ctx())
	if err != nil {
		h.t.Fatalf("Snapshot: %v", err)
	}
	if s.Models == nil {
		h.t.Fatal("Snapshot.Models is nil")
	}
	return s
}

func (h *harness) model(s *stats.Snapshot, m string) *stats.ModelStats {
	h.t.Helper()
	ms := s.Models[m]
	if ms == nil {
		h.t.Fatalf("model %q missing from snapshot (models: %v)", m, keys(s.Models))
	}
	return ms
}

func (h *harness) node(s *stats.Snapshot, m, n string) *stats.Series {
	h.t.Helper()
	ns := h.model(s, m).Nodes[n]
	if ns == nil {
		h.t.Fatalf("node %q of model %q missing from snapshot", n, m)
	}
	return ns
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

func ev(model, node string, k stats.Kind, at time.Time) stats.Event {
	return stats.Event{Model: model, Node: node, Kind: k, At: at}
}

func wantCounts(t *testing.T, what string, got, want stats.Counts) {
	t.Helper()
	if got != want {
		t.Errorf("%s counts = %+v, want %+v", what, got, want)
	}
}

func testEmpty(t *testing.T, h *harness) {
	s := h.snap()
	if len(s.Models) != 0 {
		t.Fatalf("empty store has models %v", keys(s.Models))
	}
	if s.Window != Window.Span() {
		t.Fatalf("Snapshot.Window = %v: build the store with statstest.Window (%v)", s.Window, Window.Span())
	}
	if !s.Taken.Equal(Epoch) {
		t.Fatalf("Snapshot.Taken = %v, want the clock's %v", s.Taken, Epoch)
	}
	if err := h.s.Record(h.ctx(), nil); err != nil {
		t.Fatalf("empty Record: %v", err)
	}
}

func testCounts(t *testing.T, h *harness) {
	at := Epoch.Add(time.Second)
	var batch []stats.Event
	add := func(model, node string, k stats.Kind, n int) {
		for range n {
			batch = append(batch, ev(model, node, k, at))
		}
	}
	add("a", "n1", stats.KindDispatched, 7)
	add("a", "n1", stats.KindSuccess, 3)
	add("a", "n1", stats.KindModelError, 1)
	add("a", "n2", stats.KindDispatched, 5)
	add("a", "n2", stats.KindTimeout, 2)
	add("a", "n2", stats.KindTaskError, 1)
	add("a", "n2", stats.KindExpired, 1)
	add("b", "n1", stats.KindDispatched, 1)
	add("b", "n1", stats.KindSuccess, 1)
	h.record(batch...)

	s := h.snap()
	if len(s.Models) != 2 {
		t.Fatalf("models = %v, want a and b", keys(s.Models))
	}
	a := h.model(s, "a")
	wantCounts(t, "a", a.Counts, stats.Counts{Dispatched: 12, Successes: 3, ModelErrors: 1, Timeouts: 2, TaskErrors: 1, Expired: 1})
	wantCounts(t, "a/n1", h.node(s, "a", "n1").Counts, stats.Counts{Dispatched: 7, Successes: 3, ModelErrors: 1})
	wantCounts(t, "a/n2", h.node(s, "a", "n2").Counts, stats.Counts{Dispatched: 5, Timeouts: 2, TaskErrors: 1, Expired: 1})
	wantCounts(t, "b", h.model(s, "b").Counts, stats.Counts{Dispatched: 1, Successes: 1})
	wantCounts(t, "b/n1", h.node(s, "b", "n1").Counts, stats.Counts{Dispatched: 1, Successes: 1})
	if len(a.Nodes) != 2 || len(s.Models["b"].Nodes) != 1 {
		t.Errorf("node sets: a %v, b %v", keys(a.Nodes), keys(s.Models["b"].Nodes))
	}
	if got := a.Failures(); got != 3 {
		t.Errorf("a failures = %d, want 3", got)
	}

	// a second batch adds up; an event without node counts for the model only
	h.record(ev("a", "n1", stats.KindSuccess, at), ev("a", "", stats.KindSuccess, at))
	s = h.snap()
	if got := h.model(s, "a").Successes; got != 5 {
		t.Errorf("a successes after second batch = %d, want 5", got)
	}
	if got := h.node(s, "a", "n1").Successes; got != 4 {
		t.Errorf("a/n1 successes after second batch = %d, want 4", got)
	}
	if _, ok := h.model(s, "a").Nodes[""]; ok {
		t.Error("an event without node created a node series \"\"")
	}
}

func testZeroAt(t *testing.T, h *harness) {
	h.clock.Set(Epoch.Add(25 * time.Second))
	h.record(stats.Event{Model: "m", Node: "n", Kind: stats.KindSuccess, Latency: time.Millisecond})
	s := h.snap()
	if got := h.model(s, "m").Successes; got != 1 {
		t.Fatalf("successes = %d, want 1", got)
	}
	if got := h.model(s, "m").LastOutcome; !got.Equal(Epoch.Add(25 * time.Second)) {
		t.Errorf("LastOutcome = %v, want the clock's time", got)
	}
	// dated by the clock at Epoch+25s: gone once that bucket leaves the window
	h.clock.Set(Epoch.Add(20*time.Second + Window.Span()))
	if m := h.snap().Models["m"]; m != nil {
		t.Errorf("event dated by the clock still in the window: %+v", m.Counts)
	}
}

func testWindowExpiry(t *testing.T, h *harness) {
	h.record(ev("m", "n", stats.KindSuccess, Epoch), ev("m", "n", stats.KindModelError, Epoch))
	h.clock.Set(Epoch.Add(30 * time.Second))
	h.record(ev("m", "n", stats.KindSuccess, Epoch.Add(30*time.Second)))

	h.clock.Set(Epoch.Add(Window.Span() - time.Nanosecond))
	s := h.snap()
	if got := h.model(s, "m").Judged(); got != 3 {
		t.Fatalf("just before expiry judged = %d, want 3", got)
	}
	if got := h.model(s, "m").Latency.Count(); got != 2 {
		t.Fatalf("latency count = %d, want 2", got)
	}

	h.clock.Set(Epoch.Add(Window.Span()))
	s = h.snap()
	m := h.model(s, "m")
	wantCounts(t, "after first expiry", m.Counts, stats.Counts{Successes: 1})
	wantCounts(t, "node after first expiry", h.node(s, "m", "n").Counts, stats.Counts{Successes: 1})
	if got := m.Latency.Count(); got != 1 {
		t.Errorf("latency count after expiry = %d, want 1", got)
	}

	h.clock.Set(Epoch.Add(30*time.Second + Window.Span()))
	s = h.snap()
	if m := s.Models["m"]; m != nil {
		t.Fatalf("model with no events in the window and zero gauges is in the snapshot: %+v", m.Series)
	}

	// the store keeps working on buckets reused after expiry
	at := h.clock.Now()
	h.record(ev("m", "n", stats.KindTimeout, at))
	wantCounts(t, "after reuse", h.model(h.snap(), "m").Counts, stats.Counts{Timeouts: 1})
}

func testBucketBoundary(t *testing.T, h *harness) {
	endOfFirst := Epoch.Add(Window.Bucket - time.Nanosecond)
	startOfSecond := Epoch.Add(Window.Bucket)
	h.record(ev("m", "n", stats.KindSuccess, endOfFirst), ev("m", "n", stats.KindModelError, startOfSecond))
	h.clock.Set(startOfSecond)
	wantCounts(t, "both in", h.model(h.snap(), "m").Counts, stats.Counts{Successes: 1, ModelErrors: 1})
	h.clock.Set(Epoch.Add(Window.Span() - time.Nanosecond))
	wantCounts(t, "both still in", h.model(h.snap(), "m").Counts, stats.Counts{Successes: 1, ModelErrors: 1})

	// the first bucket leaves the window as a whole, the second stays
	h.clock.Set(Epoch.Add(Window.Span()))
	wantCounts(t, "first bucket out", h.model(h.snap(), "m").Counts, stats.Counts{ModelErrors: 1})
	h.clock.Set(Epoch.Add(Window.Span() + Window.Bucket - time.Nanosecond))
	wantCounts(t, "second bucket in", h.model(h.snap(), "m").Counts, stats.Counts{ModelErrors: 1})
	h.clock.Set(Epoch.Add(Window.Span() + Window.Bucket))
	if m := h.snap().Models["m"]; m != nil && m.Judged() != 0 {
		t.Fatalf("events beyond the window: %+v", m.Counts)
	}
}

// Series.Recent holds the last Window.RecentBuckets() buckets (2 by default)
// of the model and of each node, plus the skew bucket ahead, and is a
// subset of the window's counts.
func testRecent(t *testing.T, h *harness) {
	if n := Window.RecentBuckets(); n != 2 {
		t.Fatalf("default RecentBuckets = %d, want 2", n)
	}
	b := Window.Bucket
	h.clock.Set(Epoch.Add(2*b + b/2))
	h.record(
		ev("m", "n1", stats.KindSuccess, Epoch), ev("m", "n1", stats.KindSuccess, Epoch), // bucket 0
		ev("m", "n1", stats.KindModelError, Epoch.Add(b)), ev("m", "n2", stats.KindSuccess, Epoch.Add(b)), // bucket 1
		ev("m", "n2", stats.KindTimeout, Epoch.Add(2*b)), ev("m", "n2", stats.KindDispatched, Epoch.Add(2*b)), // bucket 2
	)
	s := h.snap()
	m := h.model(s, "m")
	wantCounts(t, "window", m.Counts, stats.Counts{Dispatched: 1, Successes: 3, ModelErrors: 1, Timeouts: 1})
	wantCounts(t, "recent", m.Recent, stats.Counts{Dispatched: 1, Successes: 1, ModelErrors: 1, Timeouts: 1})
	wantCounts(t, "n1 recent", h.node(s, "m", "n1").Recent, stats.Counts{ModelErrors: 1})
	wantCounts(t, "n2 recent", h.node(s, "m", "n2").Recent, stats.Counts{Dispatched: 1, Successes: 1, Timeouts: 1})

	// an event one bucket ahead (clock skew) is recent too
	h.record(ev("m", "n1", stats.KindSuccess, Epoch.Add(3*b+time.Second)))
	wantCounts(t, "recent with skew", h.model(h.snap(), "m").Recent, stats.Counts{Dispatched: 1, Successes: 2, ModelErrors: 1, Timeouts: 1})

	// one bucket later, bucket 1 is no longer recent but still in the window
	h.clock.Set(Epoch.Add(3 * b))
	m = h.model(h.snap(), "m")
	wantCounts(t, "recent later", m.Recent, stats.Counts{Dispatched: 1, Successes: 1, Timeouts: 1})
	if m.Judged() != 6 {
		t.Errorf("window judged = %d, want 6", m.Judged())
	}
	// nothing recent: Recent is zero while the window still has counts
	h.clock.Set(Epoch.Add(5 * b))
	m = h.model(h.snap(), "m")
	wantCounts(t, "no recent", m.Recent, stats.Counts{})
	if m.Judged() == 0 {
		t.Error("window lost its counts")
	}
}

func testOldEvent(t *testing.T, h *harness) {
	h.clock.Set(Epoch.Add(10 * time.Minute))
	old := Epoch // far out of the window
	h.record(ev("m", "n", stats.KindDispatched, old), ev("m", "n", stats.KindDispatched, old),
		ev("m", "n", stats.KindTimeout, old))
	m := h.model(h.snap(), "m")
	wantCounts(t, "out-of-window events", m.Counts, stats.Counts{})
	if m.InFlight != 1 || m.ConsecutiveFailures != 1 {
		t.Errorf("gauges = in-flight %d, consecutive %d; want 1, 1", m.InFlight, m.ConsecutiveFailures)
	}
}

func testFuture(t *testing.T, h *harness) {
	// one bucket ahead is tolerated (clock skew between replicas) ...
	h.record(ev("m", "n", stats.KindSuccess, Epoch.Add(Window.Bucket+time.Second)))
	// ... further ahead is counted now
	h.record(ev("m", "n", stats.KindModelError, Epoch.Add(time.Hour)))
	wantCounts(t, "at epoch", h.model(h.snap(), "m").Counts, stats.Counts{Successes: 1, ModelErrors: 1})
	h.clock.Set(Epoch.Add(Window.Span()))
	wantCounts(t, "first bucket out", h.model(h.snap(), "m").Counts, stats.Counts{Successes: 1})
	h.clock.Set(Epoch.Add(Window.Span() + Window.Bucket))
	if m := h.snap().Models["m"]; m != nil && m.Judged() != 0 {
		t.Fatalf("events beyond the window: %+v", m.Counts)
	}
}

func testLatency(t *testing.T, h *harness) {
	var batch []stats.Event
	add := func(d time.Duration, n int) {
		for range n {
			batch = append(batch, stats.Event{Model: "m", Node: "n", Kind: stats.KindSuccess, Latency: d, At: Epoch})
		}
	}
	add(time.Millisecond, 50)
	add(10*time.Millisecond, 45)
	add(100*time.Millisecond, 5)
	// failures never enter the success histogram
	batch = append(batch, stats.Event{Model: "m", Node: "n", Kind: stats.KindModelError, Latency: time.Second, At: Epoch})
	h.record(batch...)
	s := h.snap()
	for _, series := range []*stats.Series{&h.model(s, "m").Series, h.node(s, "m", "n")} {
		if got := series.Latency.Count(); got != 100 {
			t.Fatalf("latency count = %d, want 100", got)
		}
		within := func(name string, got, want time.Duration) {
			t.Helper()
			// a quantile is interpolated within the bucket of the latency
			if lo, hi := bucketRange(want); got < lo || got > hi {
				t.Errorf("%s = %v, want within its bucket [%v, %v]", name, got, lo, hi)
			}
		}
		within("p50", series.Latency.Quantile(0.50), time.Millisecond)
		within("p95", series.Latency.Quantile(0.95), 10*time.Millisecond)
		within("p99", series.Latency.Quantile(0.99), 100*time.Millisecond)
	}
}

func testFailLatency(t *testing.T, h *harness) {
	h.record(
		stats.Event{Model: "m", Node: "n", Kind: stats.KindModelError, Latency: 3 * time.Millisecond, At: Epoch},
		stats.Event{Model: "m", Node: "n", Kind: stats.KindTimeout, Latency: 2 * time.Second, At: Epoch},
		stats.Event{Model: "m", Node: "n", Kind: stats.KindSuccess, Latency: time.Hour, At: Epoch},
		stats.Event{Model: "m", Node: "n", Kind: stats.KindTaskError, Latency: time.Hour, At: Epoch},
		stats.Event{Model: "m", Node: "n", Kind: stats.KindExpired, Latency: time.Hour, At: Epoch},
	)
	s := h.snap()
	for name, series := range map[string]*stats.Series{"model": &h.model(s, "m").Series, "node": h.node(s, "m", "n")} {
		if got, want := series.FailLatencySumUs, int64(2_003_000); got != want {
			t.Errorf("%s FailLatencySumUs = %d, want %d", name, got, want)
		}
	}
}

func testInFlight(t *testing.T, h *harness) {
	at := Epoch
	h.record(ev("m", "n1", stats.KindDispatched, at), ev("m", "n1", stats.KindDispatched, at),
		ev("m", "n1", stats.KindDispatched, at), ev("m", "n2", stats.KindDispatched, at))
	h.record(ev("m", "n1", stats.KindSuccess, at), ev("m", "n1", stats.KindTimeout, at))
	s := h.snap()
	if got := h.model(s, "m").InFlight; got != 2 {
		t.Errorf("model in-flight = %d, want 2", got)
	}
	if got := h.node(s, "m", "n1").InFlight; got != 1 {
		t.Errorf("n1 in-flight = %d, want 1", got)
	}
	if got := h.node(s, "m", "n2").InFlight; got != 1 {
		t.Errorf("n2 in-flight = %d, want 1", got)
	}

	// every outcome kind finishes an attempt; a snapshot never shows less than 0
	h.record(ev("m", "n1", stats.KindTaskError, at), ev("m", "n1", stats.KindExpired, at),
		ev("m", "n1", stats.KindModelError, at), ev("m", "n2", stats.KindSuccess, at))
	s = h.snap()
	if got := h.node(s, "m", "n1").InFlight; got != 0 {
		t.Errorf("n1 in-flight after extra outcomes = %d, want 0", got)
	}
	if got := h.model(s, "m").InFlight; got != 0 {
		t.Errorf("model in-flight after extra outcomes = %d, want 0", got)
	}

	// An outcome may be recorded before its dispatch (replicas and batches
	// race): the gauge is a signed sum, so the pair cancels out either way.
	h.record(ev("m", "n3", stats.KindSuccess, at))
	h.record(ev("m", "n3", stats.KindDispatched, at))
	s = h.snap()
	if got := h.node(s, "m", "n3").InFlight; got != 0 {
		t.Errorf("n3 in-flight after an outcome then its dispatch = %d, want 0", got)
	}
	// A late outcome (its attempt was already counted lost) does not finish
	// the attempt a second time.
	late := ev("m", "n4", stats.KindSuccess, at)
	late.Late = true
	h.record(ev("m", "n4", stats.KindDispatched, at), ev("m", "n4", stats.KindTimeout, at), late)
	h.record(ev("m", "n4", stats.KindDispatched, at))
	s = h.snap()
	if got := h.node(s, "m", "n4").InFlight; got != 1 {
		t.Errorf("n4 in-flight after dispatch, lost, late outcome, dispatch = %d, want 1", got)
	}

	// gauges are not windowed
	h.clock.Set(Epoch.Add(10 * Window.Span()))
	s = h.snap()
	m := h.model(s, "m")
	wantCounts(t, "expired window", m.Counts, stats.Counts{})
	if h.node(s, "m", "n4").InFlight != 1 {
		t.Errorf("in-flight after the window moved = n4 %d; want 1", h.node(s, "m", "n4").InFlight)
	}
	if _, ok := m.Nodes["n2"]; ok {
		t.Error("n2 has no events in the window and zero gauges but is in the snapshot")
	}
}

func testConsecutive(t *testing.T, h *harness) {
	at := Epoch
	consec := func(want, wantNode int64) {
		t.Helper()
		s := h.snap()
		if got := h.model(s, "m").ConsecutiveFailures; got != want {
			t.Errorf("model consecutive failures = %d, want %d", got, want)
		}
		if got := h.node(s, "m", "n").ConsecutiveFailures; got != wantNode {
			t.Errorf("node consecutive failures = %d, want %d", got, wantNode)
		}
	}
	h.record(ev("m", "n", stats.KindModelError, at), ev("m", "n", stats.KindTimeout, at))
	h.record(ev("m", "n", stats.KindModelError, at))
	consec(3, 3)
	h.record(ev("m", "n", stats.KindTaskError, at), ev("m", "n", stats.KindExpired, at), ev("m", "n", stats.KindDispatched, at))
	consec(3, 3)
	h.record(ev("m", "n", stats.KindSuccess, at))
	consec(0, 0)
	// within one batch order matters: fail, success, fail, fail = 2
	h.record(ev("m", "n", stats.KindModelError, at), ev("m", "n", stats.KindSuccess, at),
		ev("m", "n", stats.KindTimeout, at), ev("m", "n", stats.KindModelError, at))
	consec(2, 2)
	// a success on another node resets the model, not this node
	h.record(ev("m", "other", stats.KindSuccess, at))
	consec(0, 2)
	// not windowed
	h.clock.Set(Epoch.Add(10 * Window.Span()))
	consec(0, 2)
}

func testTaskErrors(t *testing.T, h *harness) {
	h.record(ev("m", "n", stats.KindModelError, Epoch))
	h.record(
		stats.Event{Model: "m", Node: "n", Kind: stats.KindTaskError, Latency: time.Second, At: Epoch},
		stats.Event{Model: "m", Node: "n", Kind: stats.KindTaskError, Latency: time.Second, At: Epoch},
	)
	m := h.model(h.snap(), "m")
	if m.TaskErrors != 2 || m.Failures() != 1 || m.Judged() != 1 {
		t.Errorf("task errors %d, failures %d, judged %d; want 2, 1, 1", m.TaskErrors, m.Failures(), m.Judged())
	}
	if m.ConsecutiveFailures != 1 {
		t.Errorf("consecutive failures = %d, want 1 (task errors leave it alone)", m.ConsecutiveFailures)
	}
	if m.FailLatencySumUs != 0 {
		t.Errorf("FailLatencySumUs = %d, want 0", m.FailLatencySumUs)
	}
}

func testLate(t *testing.T, h *harness) {
	h.record(
		stats.Event{Model: "m", Node: "n", Kind: stats.KindSuccess, Late: true, At: Epoch},
		stats.Event{Model: "m", Node: "n", Kind: stats.KindTimeout, Late: true, At: Epoch},
		stats.Event{Model: "m", Node: "n", Kind: stats.KindSuccess, At: Epoch},
	)
	s := h.snap()
	want := stats.Counts{Successes: 2, Timeouts: 1, Late: 2}
	wantCounts(t, "model", h.model(s, "m").Counts, want)
	wantCounts(t, "node", h.node(s, "m", "n").Counts, want)
}

func testLastOutcome(t *testing.T, h *harness) {
	t1, t2 := Epoch.Add(time.Second+123), Epoch.Add(2*time.Second+456)
	h.record(ev("m", "n1", stats.KindSuccess, t1))
	h.record(ev("m", "n2", stats.KindTimeout, t2), ev("m", "n2", stats.KindDispatched, t2.Add(time.Second)))
	s := h.snap()
	if got := h.model(s, "m").LastOutcome; !got.Equal(t2) {
		t.Errorf("model LastOutcome = %v, want %v (dispatches are not outcomes)", got, t2)
	}
	if got := h.node(s, "m", "n1").LastOutcome; !got.Equal(t1) {
		t.Errorf("n1 LastOutcome = %v, want %v", got, t1)
	}
	h.record(ev("m", "n3", stats.KindDispatched, t2))
	if got := h.node(h.snap(), "m", "n3").LastOutcome; !got.IsZero() {
		t.Errorf("n3 has no outcome but LastOutcome = %v", got)
	}
}

func testInvalid(t *testing.T, h *harness) {
	bad := []stats.Event{
		{Model: "", Node: "n", Kind: stats.KindSuccess},
		{Model: "has space", Node: "n", Kind: stats.KindSuccess},
		{Model: "m", Node: "n\x00", Kind: stats.KindSuccess},
		{Model: "m", Node: "n", Kind: stats.Kind(200)},
	}
	for _, b := range bad {
		err := h.s.Record(h.ctx(), []stats.Event{ev("ok", "n", stats.KindSuccess, Epoch), b})
		if !errors.Is(err, stats.ErrInvalidEvent) {
			t.Errorf("Record(%+v) = %v, want ErrInvalidEvent", b, err)
		}
	}
	if s := h.snap(); len(s.Models) != 0 {
		t.Errorf("a rejected batch was partly applied: %v", keys(s.Models))
	}
}

func testBreakerCAS(t *testing.T, h *harness) {
	ctx := h.ctx()
	key := stats.BreakerKey{Model: "m"}
	nodeKey := stats.BreakerKey{Model: "m", Node: "n"}
	t1 := Epoch.Add(time.Second + 1)
	t2 := Epoch.Add(2*time.Second + 2)
	open := stats.Breaker{State: stats.BreakerOpen, Since: t1}
	half := stats.Breaker{State: stats.BreakerHalfOpen, Since: t2}

	cas := func(k stats.BreakerKey, from, to stats.Breaker, want bool) {
		t.Helper()
		ok, err := h.s.SetBreaker(ctx, k, from, to)
		if err != nil {
			t.Fatalf("SetBreaker: %v", err)
		}
		if ok != want {
			t.Fatalf("SetBreaker(%v, %v -> %v) = %v, want %v", k, from, to, ok, want)
		}
	}
	breakerOf := func(k stats.BreakerKey) stats.Breaker {
		t.Helper()
		s := h.snap()
		if k.Node == "" {
			return h.model(s, k.Model).Breaker
		}
		return h.node(s, k.Model, k.Node).Breaker
	}

	// a breaker never set is closed since the zero time
	cas(key, stats.Breaker{State: stats.BreakerOpen}, open, false)
	cas(key, stats.Breaker{}, open, true)
	if b := breakerOf(key); b.State != stats.BreakerOpen || !b.Since.Equal(t1) {
		t.Fatalf("breaker = %+v, want %+v", b, open)
	}
	// stale from: the state was closed, or the since does not match
	cas(key, stats.Breaker{}, half, false)
	cas(key, stats.Breaker{State: stats.BreakerOpen, Since: t1.Add(time.Nanosecond)}, half, false)
	cas(key, open, half, true)
	if b := breakerOf(key); b.State != stats.BreakerHalfOpen || !b.Since.Equal(t2) {
		t.Fatalf("breaker = %+v, want %+v", b, half)
	}
	// node breakers are separate from the model's
	if b := breakerOf(key); b.State != stats.BreakerHalfOpen {
		t.Fatal("model breaker changed")
	}
	cas(nodeKey, stats.Breaker{}, open, true)
	if b := breakerOf(nodeKey); b.State != stats.BreakerOpen || !b.Since.Equal(t1) {
		t.Fatalf("node breaker = %+v, want %+v", b, open)
	}
	if b := breakerOf(key); b.State != stats.BreakerHalfOpen {
		t.Fatalf("model breaker = %+v after a node transition", b)
	}
	// breakers show on series that have statistics too
	h.record(ev("m", "n", stats.KindSuccess, Epoch))
	s := h.snap()
	if b := h.model(s, "m").Breaker; b.State != stats.BreakerHalfOpen {
		t.Errorf("model breaker with stats = %+v", b)
	}
	if b := h.node(s, "m", "n").Breaker; b.State != stats.BreakerOpen {
		t.Errorf("node breaker with stats = %+v", b)
	}
	// back to closed
	closed := stats.Breaker{State: stats.BreakerClosed, Since: t2.Add(time.Second)}
	cas(key, half, closed, true)
	if b := breakerOf(key); b.State != stats.BreakerClosed || !b.Since.Equal(closed.Since) {
		t.Errorf("closed breaker = %+v, want %+v", b, closed)
	}
	cas(key, stats.Breaker{}, open, false) // closed, but not since the zero time
}

func testBreakerOnly(t *testing.T, h *harness) {
	ctx := h.ctx()
	open := stats.Breaker{State: stats.BreakerOpen, Since: Epoch}
	if ok, err := h.s.SetBreaker(ctx, stats.BreakerKey{Model: "x"}, stats.Breaker{}, open); !ok || err != nil {
		t.Fatalf("SetBreaker = %v, %v", ok, err)
	}
	if ok, err := h.s.SetBreaker(ctx, stats.BreakerKey{Model: "y", Node: "n"}, stats.Breaker{}, open); !ok || err != nil {
		t.Fatalf("SetBreaker = %v, %v", ok, err)
	}
	s := h.snap()
	if b := h.model(s, "x").Breaker; b.State != stats.BreakerOpen || !b.Since.Equal(Epoch) {
		t.Errorf("x breaker = %+v", b)
	}
	if b := h.node(s, "y", "n").Breaker; b.State != stats.BreakerOpen {
		t.Errorf("y/n breaker = %+v", b)
	}
	if b := h.model(s, "y").Breaker; b.State != stats.BreakerClosed {
		t.Errorf("y breaker = %+v, want closed", b)
	}
	// once closed again, a model without statistics leaves the snapshot
	if ok, _ := h.s.SetBreaker(ctx, stats.BreakerKey{Model: "x"}, open, stats.Breaker{Since: Epoch.Add(time.Second)}); !ok {
		t.Fatal("close failed")
	}
	if _, ok := h.snap().Models["x"]; ok {
		t.Error("model with a closed breaker and no statistics is in the snapshot")
	}
}

func testBreakerConcurrent(t *testing.T, h *harness) {
	ctx := h.ctx()
	key := stats.BreakerKey{Model: "m", Node: "n"}
	const n = 16
	var wins atomic.Int64
	var winner atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, n)
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			to := stats.Breaker{State: stats.BreakerOpen, Since: Epoch.Add(time.Duration(i+1) * time.Millisecond)}
			ok, err := h.s.SetBreaker(ctx, key, stats.Breaker{}, to)
			if err != nil {
				errs <- err
				return
			}
			if ok {
				wins.Add(1)
				winner.Store(int64(i + 1))
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("SetBreaker: %v", err)
	}
	if got := wins.Load(); got != 1 {
		t.Fatalf("%d concurrent CAS won, want exactly 1", got)
	}
	b := h.node(h.snap(), "m", "n").Breaker
	if want := Epoch.Add(time.Duration(winner.Load()) * time.Millisecond); b.State != stats.BreakerOpen || !b.Since.Equal(want) {
		t.Fatalf("breaker = %+v, want open since the winner's %v", b, want)
	}
}

func testConcurrentRecord(t *testing.T, h *harness) {
	const workers, batches, per = 8, 50, 10
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			node := fmt.Sprintf("n%d", w%4)
			batch := make([]stats.Event, 0, per)
			for range batches {
				batch = batch[:0]
				for i := range per {
					k := stats.KindSuccess
					if i%5 == 0 {
						k = stats.KindTimeout
					}
					batch = append(batch, stats.Event{Model: "m", Node: node, Kind: stats.KindDispatched, At: Epoch},
						stats.Event{Model: "m", Node: node, Kind: k, Latency: time.Millisecond, At: Epoch})
				}
				if err := h.s.Record(h.ctx(), batch); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	// snapshots race with the writers
	for range 5 {
		h.snap()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("Record: %v", err)
	}
	s := h.snap()
	total := int64(workers * batches * per)
	wantCounts(t, "model", h.model(s, "m").Counts, stats.Counts{Dispatched: total, Successes: total * 4 / 5, Timeouts: total / 5})
	for n := range 4 {
		node := h.node(s, "m", fmt.Sprintf("n%d", n))
		if node.Dispatched != total/4 || node.Judged() != total/4 {
			t.Errorf("n%d counts = %+v, want %d dispatched and judged", n, node.Counts, total/4)
		}
	}
	if got := h.model(s, "m").Latency.Count(); got != total*4/5 {
		t.Errorf("latency count = %d, want %d", got, total*4/5)
	}
	if got := h.model(s, "m").InFlight; got != 0 {
		t.Errorf("in-flight = %d, want 0", got)
	}
}

func testManyModels(t *testing.T, h *harness) {
	const models, nodes = 50, 4
	var batch []stats.Event
	for m := range models {
		for n := range nodes {
			for range m + n + 1 {
				batch = append(batch, stats.Event{
					Model: fmt.Sprintf("model-%02d", m), Node: fmt.Sprintf("node-%d", n),
					Kind: stats.KindSuccess, Latency: time.Duration(m+1) * time.Millisecond, At: Epoch,
				})
			}
		}
	}
	h.record(batch...)
	s := h.snap()
	if len(s.Models) != models {
		t.Fatalf("%d models in the snapshot, want %d", len(s.Models), models)
	}
	for m := range models {
		name := fmt.Sprintf("model-%02d", m)
		ms := h.model(s, name)
		if len(ms.Nodes) != nodes {
			t.Fatalf("%s has %d nodes, want %d", name, len(ms.Nodes), nodes)
		}
		var sum int64
		for n := range nodes {
			ns := h.node(s, name, fmt.Sprintf("node-%d", n))
			if ns.Successes != int64(m+n+1) {
				t.Fatalf("%s/node-%d successes = %d, want %d", name, n, ns.Successes, m+n+1)
			}
			sum += ns.Successes
		}
		if ms.Successes != sum {
			t.Fatalf("%s successes = %d, want the sum of its nodes %d", name, ms.Successes, sum)
		}
		if lo, hi := bucketRange(time.Duration(m+1) * time.Millisecond); ms.Latency.Quantile(0.5) < lo || ms.Latency.Quantile(0.5) > hi {
			t.Fatalf("%s p50 = %v, want within [%v, %v]", name, ms.Latency.Quantile(0.5), lo, hi)
		}
	}
}

// bucketRange is the range of the histogram bucket holding d: where an
// interpolated quantile of latencies all equal to d lies.
func bucketRange(d time.Duration) (lo, hi time.Duration) {
	i := stats.BucketOf(d)
	if i > 0 {
		lo = stats.BucketBound(i - 1)
	}
	return lo, stats.BucketBound(i)
}

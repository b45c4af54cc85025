package statstest

import (
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/mlsched/mlsched/dispatcher/stats"
)

// Shared is a backend several replicas share and that can lose what it
// holds, for the reset cases. The in-memory store has none: a process that
// loses its memory loses the replica with it.
type Shared struct {
	// Replica builds a store over Window on the shared backend whose clock
	// is now, as another dispatcher replica would.
	Replica func(t *testing.T, now func() time.Time) stats.Store
	// Wipe empties the backend, as a restart without persistence does.
	Wipe func(t *testing.T)
	// Checkpoint saves the backend's state; the function it returns puts
	// that state back, as a failover to a replica that missed the writes
	// made since.
	Checkpoint func(t *testing.T) (rewind func(t *testing.T))
}

// RunReset runs the reset cases: a store that is wiped or rewound under its
// replicas is re-seeded from what they remember, without counting anything
// twice. newShared builds a fresh backend per case.
func RunReset(t *testing.T, newShared func(t *testing.T) Shared) {
	cases := []struct {
		name string
		fn   func(t *testing.T, r *resetHarness)
	}{
		{"WipeReseedsFromReplicas", testWipeReseeds},
		{"WipeConcurrentReseedsCountOnce", testWipeConcurrent},
		{"RewindReseeds", testRewind},
		{"RewindReseedsUnreadBatches", testRewindPending},
		{"ReseededWindowStillSlides", testReseedSlides},
		{"ReseededBreakersKeepTransitions", testReseedBreakers},
		{"FreshReplicaWritesFirst", testFreshReplicaWritesFirst},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			sh := newShared(t)
			r := &resetHarness{t: t, sh: sh, clock: NewClock(Epoch)}
			c.fn(t, r)
		})
	}
}

type resetHarness struct {
	t     *testing.T
	sh    Shared
	clock *Clock
}

func (r *resetHarness) replica() *harness {
	s := r.sh.Replica(r.t, r.clock.Now)
	r.t.Cleanup(func() { _ = s.Close() })
	return &harness{t: r.t, s: s, clock: r.clock}
}

// history records a learned past over two buckets: three models that
// differ in reliability and latency, on two nodes, with attempts in flight.
func history(h *harness, at time.Time) {
	h.t.Helper()
	var evs []stats.Event
	add := func(model, node string, k stats.Kind, n int, lat time.Duration, at time.Time) {
		for range n {
			evs = append(evs, stats.Event{Model: model, Node: node, Kind: k, Latency: lat, At: at})
		}
	}
	for i, at := range []time.Time{at, at.Add(20 * time.Second)} {
		add("good", "n1", stats.KindDispatched, 50+i, 0, at)
		add("good", "n1", stats.KindSuccess, 49, 30*time.Millisecond, at)
		add("good", "n2", stats.KindDispatched, 40, 0, at)
		add("good", "n2", stats.KindSuccess, 39, 40*time.Millisecond, at)
		add("good", "n2", stats.KindModelError, 1, 5*time.Millisecond, at)
		add("bad", "n1", stats.KindDispatched, 30, 0, at)
		add("bad", "n1", stats.KindSuccess, 20, 10*time.Millisecond, at)
		add("bad", "n1", stats.KindModelError, 8, time.Millisecond, at)
		add("bad", "n1", stats.KindTimeout, 2, time.Second, at)
		add("slow", "n2", stats.KindDispatched, 10, 0, at)
		add("slow", "n2", stats.KindSuccess, 9, 900*time.Millisecond, at)
		add("slow", "n2", stats.KindTaskError, 1, time.Millisecond, at)
	}
	h.record(evs...)
}

// work is what happens after a reset: complete attempts on "good".
func work(h *harness, n int, at time.Time) {
	h.t.Helper()
	var evs []stats.Event
	for range n {
		evs = append(evs,
			stats.Event{Model: "good", Node: "n1", Kind: stats.KindDispatched, At: at},
			stats.Event{Model: "good", Node: "n1", Kind: stats.KindSuccess, Latency: 20 * time.Millisecond, At: at})
	}
	h.record(evs...)
}

// sameStats compares two snapshots series by series, Taken aside.
func sameStats(t *testing.T, what string, got, want *stats.Snapshot) {
	t.Helper()
	if reflect.DeepEqual(got.Models, want.Models) {
		return
	}
	for name, w := range want.Models {
		g := got.Models[name]
		if g == nil {
			t.Errorf("%s: model %q missing", what, name)
			continue
		}
		if !reflect.DeepEqual(g.Series, w.Series) {
			t.Errorf("%s: model %q\n got %+v\nwant %+v", what, name, g.Series, w.Series)
		}
		for n, ws := range w.Nodes {
			if gs := g.Nodes[n]; gs == nil || !reflect.DeepEqual(*gs, *ws) {
				t.Errorf("%s: %s/%s\n got %+v\nwant %+v", what, name, n, gs, ws)
			}
		}
	}
	for name := range got.Models {
		if want.Models[name] == nil {
			t.Errorf("%s: unexpected model %q", what, name)
		}
	}
}

// openBreakers opens a model breaker and a node breaker.
func openBreakers(h *harness) (model, node stats.Breaker) {
	h.t.Helper()
	model = stats.Breaker{State: stats.BreakerOpen, Since: Epoch.Add(7 * time.Second)}
	node = stats.Breaker{State: stats.BreakerHalfOpen, Since: Epoch.Add(9 * time.Second)}
	for k, b := range map[stats.BreakerKey]stats.Breaker{{Model: "bad"}: model, {Model: "good", Node: "n2"}: node} {
		if ok, err := h.s.SetBreaker(h.ctx(), k, stats.Breaker{}, b); !ok || err != nil {
			h.t.Fatalf("SetBreaker(%v) = %v, %v", k, ok, err)
		}
	}
	return model, node
}

func testWipeReseeds(t *testing.T, r *resetHarness) {
	a, b := r.replica(), r.replica()
	history(a, Epoch.Add(time.Second))
	openBreakers(a)
	r.clock.Set(Epoch.Add(25 * time.Second))
	before := a.snap()
	b.snap()

	r.sh.Wipe(t)
	// the first write after the wipe finds it, re-seeds, then applies
	work(b, 3, r.clock.Now())
	expect := snapAfterWork(t, before, 3, r.clock.Now())
	sameStats(t, "after wipe, replica a", a.snap(), expect)
	sameStats(t, "after wipe, replica b", b.snap(), expect)
	sameStats(t, "after wipe, a new replica", r.replica().snap(), expect)
}

// snapAfterWork is before plus n complete attempts of work().
func snapAfterWork(t *testing.T, before *stats.Snapshot, n int64, at time.Time) *stats.Snapshot {
	t.Helper()
	out := cloneSnap(before)
	g := out.Models["good"]
	for _, s := range []*stats.Series{&g.Series, g.Nodes["n1"]} {
		s.ConsecutiveFailures = 0
		s.LastOutcome = at
		s.Dispatched += n
		s.Successes += n
		s.Recent.Dispatched += n
		s.Recent.Successes += n
		s.Latency[stats.BucketOf(20*time.Millisecond)] += n
	}
	return out
}

func cloneSnap(s *stats.Snapshot) *stats.Snapshot {
	out := &stats.Snapshot{Taken: s.Taken, Window: s.Window, Models: map[string]*stats.ModelStats{}}
	for name, m := range s.Models {
		c := &stats.ModelStats{Series: m.Series}
		if m.Nodes != nil {
			c.Nodes = map[string]*stats.Series{}
			for n, ns := range m.Nodes {
				v := *ns
				c.Nodes[n] = &v
			}
		}
		out.Models[name] = c
	}
	return out
}

func testWipeConcurrent(t *testing.T, r *resetHarness) {
	const replicas = 4
	hs := make([]*harness, replicas)
	for i := range hs {
		hs[i] = r.replica()
	}
	history(hs[0], Epoch.Add(time.Second))
	openBreakers(hs[0])
	r.clock.Set(Epoch.Add(25 * time.Second))
	before := hs[0].snap()
	for _, h := range hs[1:] {
		sameStats(t, "before wipe", h.snap(), before)
	}
	r.sh.Wipe(t)
	// every replica notices at once, reading and writing
	var wg sync.WaitGroup
	for _, h := range hs {
		wg.Go(func() {
			for range 5 {
				if _, err := h.s.Snapshot(h.ctx()); err != nil {
					t.Errorf("Snapshot: %v", err)
				}
				if err := h.s.Record(h.ctx(), []stats.Event{
					{Model: "good", Node: "n1", Kind: stats.KindDispatched, At: r.clock.Now()},
					{Model: "good", Node: "n1", Kind: stats.KindSuccess, Latency: 20 * time.Millisecond, At: r.clock.Now()},
				}); err != nil {
					t.Errorf("Record: %v", err)
				}
			}
		})
	}
	wg.Wait()
	expect := snapAfterWork(t, before, replicas*5, r.clock.Now())
	for i, h := range hs {
		sameStats(t, "replica "+string(rune('a'+i)), h.snap(), expect)
	}
}

func testRewind(t *testing.T, r *resetHarness) {
	a, b := r.replica(), r.replica()
	history(a, Epoch.Add(time.Second))
	r.clock.Set(Epoch.Add(25 * time.Second))
	a.snap()
	rewind := r.sh.Checkpoint(t)
	work(a, 4, r.clock.Now()) // the writes the promoted replica misses
	want := b.snap()          // b read them
	rewind(t)
	sameStats(t, "after rewind, replica b", b.snap(), want)
	sameStats(t, "after rewind, replica a", a.snap(), want)
	work(a, 1, r.clock.Now())
	sameStats(t, "after rewind and more work", r.replica().snap(), snapAfterWork(t, want, 1, r.clock.Now()))
}

func testRewindPending(t *testing.T, r *resetHarness) {
	a, b := r.replica(), r.replica()
	history(a, Epoch.Add(time.Second))
	r.clock.Set(Epoch.Add(25 * time.Second))
	before := a.snap()
	rewind := r.sh.Checkpoint(t)
	work(a, 4, r.clock.Now()) // acknowledged, but read by nobody
	rewind(t)
	// a finds the rewind on its next write (the store's sequence is behind
	// the one it got back) and re-seeds the batch it remembers
	work(a, 1, r.clock.Now())
	sameStats(t, "after rewind", b.snap(), snapAfterWork(t, before, 5, r.clock.Now()))
}

func testReseedSlides(t *testing.T, r *resetHarness) {
	a := r.replica()
	a.record(ev("m", "n", stats.KindSuccess, Epoch.Add(time.Second)))
	r.clock.Set(Epoch.Add(35 * time.Second))
	a.record(ev("m", "n", stats.KindModelError, Epoch.Add(31*time.Second)))
	a.snap()
	r.sh.Wipe(t)
	s := a.snap()
	wantCounts(t, "re-seeded", a.model(s, "m").Counts, stats.Counts{Successes: 1, ModelErrors: 1})
	wantCounts(t, "re-seeded recent", a.model(s, "m").Recent, stats.Counts{ModelErrors: 1})
	// the first bucket leaves the window when it would have
	r.clock.Set(Epoch.Add(Window.Size + 10*time.Second))
	s = a.snap()
	wantCounts(t, "later", a.model(s, "m").Counts, stats.Counts{ModelErrors: 1})
}

func testReseedBreakers(t *testing.T, r *resetHarness) {
	a, b := r.replica(), r.replica()
	history(a, Epoch.Add(time.Second))
	open, half := openBreakers(a)
	r.clock.Set(Epoch.Add(25 * time.Second))
	a.snap()
	r.sh.Wipe(t)
	s := b.snap() // b never read the store: it remembers nothing
	if len(s.Models) != 0 {
		t.Fatalf("a replica with no memory of the store sees %v", keys(s.Models))
	}
	s = a.snap()
	if got := a.model(s, "bad").Breaker; got.State != open.State || !got.Since.Equal(open.Since) {
		t.Errorf("model breaker after re-seed = %+v, want %+v", got, open)
	}
	if got := a.node(s, "good", "n2").Breaker; got.State != half.State || !got.Since.Equal(half.Since) {
		t.Errorf("node breaker after re-seed = %+v, want %+v", got, half)
	}
	// the next transition compares with the re-seeded state
	to := stats.Breaker{State: stats.BreakerHalfOpen, Since: Epoch.Add(20 * time.Second)}
	if ok, err := b.s.SetBreaker(b.ctx(), stats.BreakerKey{Model: "bad"}, open, to); !ok || err != nil {
		t.Fatalf("SetBreaker from the re-seeded state = %v, %v", ok, err)
	}
	if got := b.model(b.snap(), "bad").Breaker; got.State != to.State {
		t.Errorf("breaker = %+v, want %+v", got, to)
	}
}

// A replica that remembers nothing writes first to the wiped store (and
// names its generation): the replicas that remember still restore the
// gauges, not only the counts.
func testFreshReplicaWritesFirst(t *testing.T, r *resetHarness) {
	a := r.replica()
	history(a, Epoch.Add(time.Second))
	r.clock.Set(Epoch.Add(25 * time.Second))
	before := a.snap()
	if c := a.model(before, "bad").ConsecutiveFailures; c == 0 {
		t.Fatal("history left no consecutive failures to restore")
	}
	r.sh.Wipe(t)
	fresh := r.replica()
	fresh.record(ev("other", "n9", stats.KindDispatched, r.clock.Now()))
	s := a.snap()
	got, want := a.model(s, "bad"), a.model(before, "bad")
	if got.ConsecutiveFailures != want.ConsecutiveFailures || got.InFlight != want.InFlight || got.Counts != want.Counts {
		t.Errorf("after a fresh replica wrote first: %+v, want %+v", got.Series, want.Series)
	}
	if o := a.model(s, "other"); o.InFlight != 1 {
		t.Errorf("the fresh replica's write: in flight %d, want 1", o.InFlight)
	}
}

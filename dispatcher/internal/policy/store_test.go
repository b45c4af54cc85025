package policy

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/shared/protocol"
)

// clock is a settable clock for the memory store.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time          { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) advance(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

// loop is the dispatcher's refresh in miniature, over the real in-memory
// store: record, snapshot, apply transitions with CAS, build the table.
type loop struct {
	t     *testing.T
	e     *Engine
	store *stats.Memory
	clk   *clock
	hbs   []protocol.Heartbeat
	tab   *Table
}

func (l *loop) record(model, node string, kinds ...stats.Kind) {
	l.t.Helper()
	ctx := context.Background()
	for _, k := range kinds {
		evs := []stats.Event{{Model: model, Node: node, Kind: stats.KindDispatched}, {Model: model, Node: node, Kind: k, Latency: 5 * time.Millisecond}}
		if err := l.store.Record(ctx, evs); err != nil {
			l.t.Fatal(err)
		}
	}
}

// refresh applies due transitions and rebuilds the table; it returns the
// transitions that applied.
func (l *loop) refresh() []Transition {
	l.t.Helper()
	ctx := context.Background()
	snap, err := l.store.Snapshot(ctx)
	if err != nil {
		l.t.Fatal(err)
	}
	var applied []Transition
	for _, tr := range l.e.Transitions(snap, l.clk.now()) {
		ok, err := l.store.SetBreaker(ctx, tr.Key, tr.From, tr.To)
		if err != nil {
			l.t.Fatal(err)
		}
		if ok {
			applied = append(applied, tr)
		}
	}
	if snap, err = l.store.Snapshot(ctx); err != nil {
		l.t.Fatal(err)
	}
	l.tab = NewTable(snap, l.hbs, l.clk.now())
	return applied
}

func (l *loop) state(model string) stats.BreakerState {
	l.t.Helper()
	snap, err := l.store.Snapshot(context.Background())
	if err != nil {
		l.t.Fatal(err)
	}
	if ms := snap.Models[model]; ms != nil {
		return ms.Breaker.State
	}
	return stats.BreakerClosed
}

func newLoop(t *testing.T, cfg Config) *loop {
	clk := &clock{t: t0}
	return &loop{
		t: t, e: engine(t, cfg), clk: clk,
		store: stats.NewMemory(stats.Window{Size: time.Minute, Bucket: time.Second}, stats.WithClock(clk.now)),
		hbs:   []protocol.Heartbeat{hb("n1", "t", 50, "flaky", "backup"), hb("n2", "t", 50, "flaky", "backup")},
	}
}

// TestBreakerWithMemoryStore drives the whole breaker cycle through the
// real in-memory store, task errors included.
func TestBreakerWithMemoryStore(t *testing.T) {
	t.Parallel()
	l := newLoop(t, Config{ExploreShare: -1, Breaker: BreakerConfig{ConsecutiveFailures: 4, MinRequests: 1000, Cooldown: 5 * time.Second, HalfOpenProbes: 2}})
	S, F, TE := stats.KindSuccess, stats.KindModelError, stats.KindTaskError
	l.record("flaky", "n1", S, S, S, S, S, S, S, S, S, S)
	l.record("backup", "n1", S, S, S, S, S, S, S, S, F)
	l.refresh()
	if d, _ := l.e.Decide(l.tab, &Request{Type: "t"}); d.Model != "flaky" {
		t.Fatalf("healthy flaky should win: %+v", d)
	}

	// task errors by the thousand never open it
	for i := 0; i < 10; i++ {
		l.record("flaky", "n1", TE, TE, TE, TE, TE, TE, TE, TE, TE, TE)
	}
	if trs := l.refresh(); len(trs) != 0 || l.state("flaky") != stats.BreakerClosed {
		t.Fatalf("task errors changed a breaker: %+v", trs)
	}

	// four consecutive failures (across nodes) open it
	l.record("flaky", "n1", F, F)
	l.record("flaky", "n2", F, F)
	l.refresh()
	if l.state("flaky") != stats.BreakerOpen {
		t.Fatalf("state %s, want open", l.state("flaky"))
	}
	if got := counts(t, l.e, l.tab, &Request{Type: "t"}, 20); got["flaky"] != 0 {
		t.Fatalf("open breaker let through %v", got)
	}

	// cooldown: half-open, two probes only
	l.clk.advance(5 * time.Second)
	l.refresh()
	if l.state("flaky") != stats.BreakerHalfOpen {
		t.Fatalf("state %s, want half-open", l.state("flaky"))
	}
	var probes []Decision
	for i := 0; i < 20; i++ {
		d, err := l.e.Decide(l.tab, &Request{Type: "t"})
		if err != nil {
			t.Fatal(err)
		}
		if d.Model == "flaky" {
			probes = append(probes, d)
			l.store.Record(context.Background(), []stats.Event{{Model: d.Model, Node: d.Node, Kind: stats.KindDispatched}})
		}
	}
	if len(probes) != 2 {
		t.Fatalf("%d probes, want 2", len(probes))
	}
	// the probes are in flight: a new table still holds them back
	l.refresh()
	if got := counts(t, l.e, l.tab, &Request{Type: "t"}, 20); got["flaky"] != 0 {
		t.Fatalf("probes in flight, yet %v", got)
	}
	// a task error on a probe decides nothing
	l.clk.advance(time.Second)
	l.store.Record(context.Background(), []stats.Event{{Model: "flaky", Node: probes[0].Node, Kind: TE}})
	if trs := l.refresh(); len(trs) != 0 {
		t.Fatalf("a task error moved a half-open breaker: %+v", trs)
	}
	// a failed probe reopens
	l.store.Record(context.Background(), []stats.Event{{Model: "flaky", Node: probes[1].Node, Kind: F, Latency: time.Millisecond}})
	l.refresh()
	if l.state("flaky") != stats.BreakerOpen {
		t.Fatalf("state %s after a failed probe, want open", l.state("flaky"))
	}

	// cooldown again; a successful probe closes
	l.clk.advance(5 * time.Second)
	l.refresh()
	d, err := l.e.Decide(l.tab, &Request{Type: "t"})
	if err != nil || d.Model != "flaky" {
		t.Fatalf("want a probe: %+v %v", d, err)
	}
	l.clk.advance(time.Second)
	l.record("flaky", d.Node, S)
	l.refresh()
	if l.state("flaky") != stats.BreakerClosed {
		t.Fatalf("state %s after a good probe, want closed", l.state("flaky"))
	}
}

// TestHalfOpenMadeByAnotherReplica: a replica that did not compute the
// open → half-open transition judges from what it sees next.
func TestHalfOpenMadeByAnotherReplica(t *testing.T) {
	t.Parallel()
	l := newLoop(t, Config{Breaker: BreakerConfig{ConsecutiveFailures: 2, Cooldown: time.Second}})
	other := engine(t, Config{Breaker: BreakerConfig{ConsecutiveFailures: 2, Cooldown: time.Second}})
	l.record("flaky", "n1", stats.KindModelError, stats.KindModelError)
	l.refresh()
	l.clk.advance(time.Second)
	l.refresh() // l.e made it half-open
	if l.state("flaky") != stats.BreakerHalfOpen {
		t.Fatalf("state %s", l.state("flaky"))
	}
	snap, _ := l.store.Snapshot(context.Background())
	if trs := other.Transitions(snap, l.clk.now()); len(trs) != 0 {
		t.Fatalf("first sight: %+v", trs)
	}
	l.clk.advance(time.Second)
	l.record("flaky", "n1", stats.KindTaskError)
	snap, _ = l.store.Snapshot(context.Background())
	if trs := other.Transitions(snap, l.clk.now()); len(trs) != 0 {
		t.Fatalf("task error: %+v", trs)
	}
	l.record("flaky", "n1", stats.KindSuccess)
	snap, _ = l.store.Snapshot(context.Background())
	// the model and its (model, n1) breaker both close
	trs := other.Transitions(snap, l.clk.now())
	if len(trs) != 2 || trs[0].Key.Node != "" || trs[0].To.State != stats.BreakerClosed || trs[1].To.State != stats.BreakerClosed {
		t.Fatalf("success seen by the other replica: %+v", trs)
	}
}

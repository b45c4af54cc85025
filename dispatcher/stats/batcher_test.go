package stats_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/mlsched/mlsched/dispatcher/stats"
)

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}

func dispatched(t *testing.T, s stats.Store, model string) int64 {
	t.Helper()
	snap, err := s.Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if m := snap.Models[model]; m != nil {
		return m.Dispatched
	}
	return 0
}

func addN(t *testing.T, b *stats.Batcher, model string, n int) {
	t.Helper()
	for range n {
		if err := b.Add(stats.Event{Model: model, Node: "n", Kind: stats.KindDispatched}); err != nil {
			t.Fatal(err)
		}
	}
}

func TestBatcherFlushesFullBatch(t *testing.T) {
	t.Parallel()
	mem := stats.NewMemory(stats.Window{})
	b := stats.NewBatcher(mem, stats.BatcherConfig{MaxBatch: 10, FlushInterval: time.Hour})
	b.Start(t.Context())
	t.Cleanup(func() { _ = b.Stop(context.Background()) })
	addN(t, b, "m", 9)
	if got := b.Stats().Buffered; got != 9 {
		t.Fatalf("buffered = %d, want 9", got)
	}
	addN(t, b, "m", 1)
	eventually(t, "a full batch flushed without waiting for the interval", func() bool {
		return dispatched(t, mem, "m") == 10
	})
	if st := b.Stats(); st.Flushed != 10 || st.Buffered != 0 || st.Degraded {
		t.Fatalf("stats = %+v", st)
	}
}

func TestBatcherFlushesOnInterval(t *testing.T) {
	t.Parallel()
	mem := stats.NewMemory(stats.Window{})
	b := stats.NewBatcher(mem, stats.BatcherConfig{FlushInterval: 5 * time.Millisecond})
	b.Start(t.Context())
	t.Cleanup(func() { _ = b.Stop(context.Background()) })
	addN(t, b, "m", 3)
	eventually(t, "the interval flush", func() bool { return dispatched(t, mem, "m") == 3 })
}

func TestBatcherStopFlushesTheRest(t *testing.T) {
	t.Parallel()
	mem := stats.NewMemory(stats.Window{})
	b := stats.NewBatcher(mem, stats.BatcherConfig{FlushInterval: time.Hour, MaxBatch: 2})
	ctx, cancel := context.WithCancel(context.Background())
	b.Start(ctx)
	addN(t, b, "m", 1)
	cancel() // as the dispatcher does: the loop's context ends before Stop
	if err := b.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := dispatched(t, mem, "m"); got != 1 {
		t.Fatalf("dispatched = %d after Stop, want 1", got)
	}
	if err := b.Add(stats.Event{Model: "m", Kind: stats.KindSuccess}); !errors.Is(err, stats.ErrStopped) {
		t.Fatalf("Add after Stop = %v, want ErrStopped", err)
	}
	if st := b.Stats(); st.Dropped != 1 || st.Flushed != 1 {
		t.Fatalf("stats = %+v, want 1 dropped (after Stop) and 1 flushed", st)
	}
}

func TestBatcherRejectsInvalidEvents(t *testing.T) {
	t.Parallel()
	b := stats.NewBatcher(stats.NewMemory(stats.Window{}), stats.BatcherConfig{})
	for _, ev := range []stats.Event{{Model: ""}, {Model: "a b"}, {Model: "m", Kind: 99}} {
		if err := b.Add(ev); !errors.Is(err, stats.ErrInvalidEvent) {
			t.Errorf("Add(%+v) = %v, want ErrInvalidEvent", ev, err)
		}
	}
	if st := b.Stats(); st.Rejected != 3 || st.Buffered != 0 {
		t.Fatalf("stats = %+v, want 3 rejected and nothing buffered", st)
	}
}

func TestBatcherConcurrentAdds(t *testing.T) {
	t.Parallel()
	mem := stats.NewMemory(stats.Window{})
	b := stats.NewBatcher(mem, stats.BatcherConfig{MaxBatch: 64, FlushInterval: time.Millisecond})
	b.Start(t.Context())
	const workers, per = 8, 2000
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range per {
				k := stats.KindDispatched
				if i%2 == 1 {
					k = stats.KindSuccess
				}
				_ = b.Add(stats.Event{Model: "m", Node: fmt.Sprintf("n%d", w), Kind: k})
			}
		})
	}
	wg.Wait()
	if err := b.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
	snap, err := mem.Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	m := snap.Models["m"]
	if m == nil || m.Dispatched != workers*per/2 || m.Successes != workers*per/2 || m.InFlight != 0 {
		t.Fatalf("model = %+v, want %d dispatched and successes", m, workers*per/2)
	}
	if st := b.Stats(); st.Flushed != workers*per || st.Dropped != 0 {
		t.Fatalf("stats = %+v", st)
	}
}

package stats_test

import (
	"context"
	"fmt"
	"time"

	"github.com/mlsched/mlsched/dispatcher/stats"
)

// A store driven by a simulated clock: events are bucketed by their time,
// and leave the window as the clock moves on.
func ExampleMemory() {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	m := stats.NewMemory(stats.Window{Size: time.Minute, Bucket: 10 * time.Second}, stats.WithClock(clock))
	ctx := context.Background()

	_ = m.Record(ctx, []stats.Event{
		{Model: "llama", Node: "gpu-1", Kind: stats.KindDispatched},
		{Model: "llama", Node: "gpu-1", Kind: stats.KindSuccess, Latency: 120 * time.Millisecond},
		{Model: "llama", Node: "gpu-1", Kind: stats.KindDispatched},
		{Model: "llama", Node: "gpu-1", Kind: stats.KindTimeout, Latency: 2 * time.Second},
	})
	snap, _ := m.Snapshot(ctx)
	llama := snap.Models["llama"]
	fmt.Println("judged", llama.Judged(), "failures", llama.Failures(), "in flight", llama.InFlight)
	fmt.Println("p50", llama.Latency.Quantile(0.5), "consecutive failures", llama.Nodes["gpu-1"].ConsecutiveFailures)

	now = now.Add(time.Minute) // the bucket leaves the window; the gauges stay
	snap, _ = m.Snapshot(ctx)
	llama = snap.Models["llama"]
	fmt.Println("judged", llama.Judged(), "consecutive failures", llama.ConsecutiveFailures)
	// Output:
	// judged 2 failures 1 in flight 0
	// p50 120.669366ms consecutive failures 1
	// judged 0 consecutive failures 1
}

// The dispatcher's write path: Add never waits for the store.
func ExampleBatcher() {
	store := stats.NewMemory(stats.Window{})
	b := stats.NewBatcher(store, stats.BatcherConfig{FlushInterval: 10 * time.Millisecond})
	b.Start(context.Background())

	_ = b.Add(stats.Event{Model: "llama", Node: "gpu-1", Kind: stats.KindDispatched})
	_ = b.Add(stats.Event{Model: "bad name", Kind: stats.KindSuccess}) // refused: ErrInvalidEvent

	_ = b.Stop(context.Background()) // writes what is left
	st := b.Stats()
	fmt.Println("flushed", st.Flushed, "rejected", st.Rejected, "buffered", st.Buffered)
	// Output: flushed 1 rejected 1 buffered 0
}

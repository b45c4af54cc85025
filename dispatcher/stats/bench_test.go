package stats_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/mlsched/mlsched/dispatcher/stats"
)

// benchEvents is a realistic mix over models x nodes: dispatches and
// outcomes with latencies, dated by a clock that moves 1ms per event.
func benchEvents(n, models, nodes int, start time.Time) []stats.Event {
	evs := make([]stats.Event, n)
	for i := range evs {
		k := stats.KindDispatched
		switch i % 10 {
		case 1, 3, 5, 7:
			k = stats.KindSuccess
		case 9:
			k = stats.KindModelError
		}
		evs[i] = stats.Event{
			Model: fmt.Sprintf("model-%d", i%models), Node: fmt.Sprintf("node-%d", (i/models)%nodes),
			Kind: k, Latency: time.Duration(1+i%50) * time.Millisecond, At: start.Add(time.Duration(i) * time.Millisecond),
		}
	}
	return evs
}

func BenchmarkMemoryRecord(b *testing.B) {
	for _, size := range []int{1, 100} {
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) {
			start := time.Unix(1_900_000_000, 0)
			now := start
			m := stats.NewMemory(stats.Window{}, stats.WithClock(func() time.Time { return now }))
			evs := benchEvents(100_000, 10, 4, start)
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				j := (i * size) % len(evs)
				batch := evs[j:min(j+size, len(evs))]
				now = batch[0].At
				if err := m.Record(ctx, batch); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*size), "ns/event")
		})
	}
}

func BenchmarkMemorySnapshot(b *testing.B) {
	start := time.Unix(1_900_000_000, 0)
	now := start
	m := stats.NewMemory(stats.Window{}, stats.WithClock(func() time.Time { return now }))
	// 10 models x 4 nodes, events spread over the whole 5m window
	evs := benchEvents(300_000, 10, 4, start)
	for i := 0; i < len(evs); i += 1000 {
		now = evs[i].At
		if err := m.Record(context.Background(), evs[i:i+1000]); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s, err := m.Snapshot(context.Background())
		if err != nil || len(s.Models) != 10 {
			b.Fatalf("snapshot: %v, %d models", err, len(s.Models))
		}
	}
}

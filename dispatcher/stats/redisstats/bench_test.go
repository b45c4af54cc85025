package redisstats_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/dispatcher/stats/redisstats"
	"github.com/mlsched/mlsched/shared/redistest"
)

func benchEvents(n, models, nodes int) []stats.Event {
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
			Kind: k, Latency: time.Duration(1+i%50) * time.Millisecond,
		}
	}
	return evs
}

// BenchmarkRecord measures one script call per batch over 10 models x 4
// nodes against a local redis-server; ns/event is the per-event cost.
func BenchmarkRecord(b *testing.B) {
	srv := redistest.Start(b)
	c := srv.Client(b)
	for _, size := range []int{100, 1000} {
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) {
			s := redisstats.New(c, stats.Window{}, redisstats.WithPrefix(prefix()))
			evs := benchEvents(size, 10, 4)
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := s.Record(ctx, evs); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*size), "ns/event")
		})
	}
}

// BenchmarkSnapshot reads a full 5m window (30 buckets) of 10 models x 4
// nodes.
func BenchmarkSnapshot(b *testing.B) {
	srv := redistest.Start(b)
	c := srv.Client(b)
	start := time.Now().Add(-5 * time.Minute)
	var now time.Time
	s := redisstats.New(c, stats.Window{}, redisstats.WithPrefix(prefix()), redisstats.WithClock(func() time.Time { return now }))
	ctx := context.Background()
	evs := benchEvents(1000, 10, 4)
	for i := range 30 { // one batch per 10s bucket
		now = start.Add(time.Duration(i) * 10 * time.Second)
		if err := s.Record(ctx, evs); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		snap, err := s.Snapshot(ctx)
		if err != nil || len(snap.Models) != 10 || len(snap.Models["model-0"].Nodes) != 4 {
			b.Fatalf("snapshot: %v", err)
		}
	}
}

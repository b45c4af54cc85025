package stats_test

import (
	"context"
	"crypto/rand"
	"testing"
	"time"

	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/dispatcher/stats/redisstats"
	"github.com/mlsched/mlsched/shared/redistest"
)

func outageConfig(maxBuffer int) stats.BatcherConfig {
	return stats.BatcherConfig{
		FlushInterval: 5 * time.Millisecond,
		MaxBuffer:     maxBuffer,
		RetryMin:      5 * time.Millisecond,
		RetryMax:      50 * time.Millisecond,
		RecordTimeout: time.Second,
	}
}

// stopBatcher stops b at the end of a test, bounded: with Redis still down
// (a test that failed during the outage) Stop would retry forever.
func stopBatcher(b *stats.Batcher) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = b.Stop(ctx)
}

// TestBatcherRedisOutage: updates made while Redis is down arrive once it is
// back, and the batcher reports Degraded meanwhile.
func TestBatcherRedisOutage(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	store := redisstats.New(srv.Client(t), stats.Window{}, redisstats.WithPrefix("b"+rand.Text()[:8]+":"))
	b := stats.NewBatcher(store, outageConfig(1000))
	b.Start(t.Context())
	t.Cleanup(func() { stopBatcher(b) })

	addN(t, b, "before", 5)
	eventually(t, "the first flush", func() bool { return b.Stats().Flushed == 5 })

	srv.Stop()
	addN(t, b, "during", 50)
	eventually(t, "Degraded during the outage", func() bool { return b.Stats().Degraded })
	if st := b.Stats(); st.Buffered != 50 || st.Dropped != 0 || st.LastError == "" {
		t.Fatalf("stats during the outage = %+v, want 50 buffered, none dropped, an error", st)
	}

	srv.Restart(t) // an empty server: what was written before is gone
	eventually(t, "the buffered updates after the outage", func() bool {
		st := b.Stats()
		return st.Flushed == 55 && st.Buffered == 0 && !st.Degraded
	})
	if got := dispatched(t, store, "during"); got != 50 {
		t.Fatalf("dispatched during the outage = %d in Redis, want 50", got)
	}
}

// TestBatcherRedisOutageOverflow: past MaxBuffer the oldest updates are
// dropped and counted; the newest arrive.
func TestBatcherRedisOutageOverflow(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	store := redisstats.New(srv.Client(t), stats.Window{}, redisstats.WithPrefix("b"+rand.Text()[:8]+":"))
	b := stats.NewBatcher(store, outageConfig(100))
	b.Start(t.Context())
	t.Cleanup(func() { stopBatcher(b) })

	srv.Stop()
	addN(t, b, "old", 150)
	addN(t, b, "new", 100)
	// A flush may be in flight, waiting for its error: the drops from its
	// batch are counted once it has failed.
	eventually(t, "100 buffered and 150 dropped, Degraded during the outage", func() bool {
		st := b.Stats()
		return st.Buffered == 100 && st.Dropped == 150 && st.Degraded
	})

	srv.Restart(t)
	eventually(t, "the newest updates after the outage", func() bool {
		st := b.Stats()
		return st.Flushed == 100 && st.Buffered == 0 && !st.Degraded
	})
	if got := dispatched(t, store, "new"); got != 100 {
		t.Errorf("new = %d, want 100", got)
	}
	if got := dispatched(t, store, "old"); got != 0 {
		t.Errorf("old = %d, want 0: the oldest are the ones dropped", got)
	}
	if st := b.Stats(); st.Dropped != 150 {
		t.Errorf("dropped = %d, want 150", st.Dropped)
	}
}

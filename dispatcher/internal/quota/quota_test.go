package quota_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mlsched/mlsched/dispatcher/internal/quota"
	"github.com/mlsched/mlsched/shared/redistest"
)

// Three replicas sharing one Redis admit no more than the tenant's rate
// between them (an upper bound: a slow machine only admits fewer), while
// tenants without a quota are never limited.
func TestSharedQuotaAcrossReplicas(t *testing.T) {
	rs := redistest.Start(t)
	const rate = 100.0
	rates := map[string]float64{"a": rate}
	var limiters []*quota.Limiter
	for _, name := range []string{"r1", "r2", "r3"} {
		limiters = append(limiters, quota.New(quota.Params{Rates: rates, Redis: rs.Client(t), Replica: name}))
	}
	ctx := context.Background()
	var admitted, refused atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for _, l := range limiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Since(start) < 2500*time.Millisecond { // past a count of the live replicas (every 2 s)
				if ok, wait := l.Allow(ctx, "a"); ok {
					admitted.Add(1)
				} else if wait <= 0 {
					t.Errorf("refused without a retry-after")
					return
				} else {
					refused.Add(1)
				}
				if ok, _ := l.Allow(ctx, "free"); !ok {
					t.Errorf("a tenant without a quota was refused")
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	if got, limit := float64(admitted.Load()), rate*elapsed+rate/10+1; got > limit || got < 1 {
		t.Fatalf("admitted %v in %.2fs across 3 replicas, want 1..%.0f (refused %d)", got, elapsed, limit, refused.Load())
	}
	if refused.Load() == 0 {
		t.Fatalf("nothing refused: the quota was not enforced")
	}
	for _, l := range limiters {
		if d := l.Degraded(); d != "" {
			t.Fatalf("degraded with Redis up: %s", d)
		}
	}

	// Redis down: each replica enforces its share, the rate divided by
	// the 3 replicas it saw, and says so.
	rs.Stop()
	l := limiters[0]
	var n int
	start = time.Now()
	for time.Since(start) < time.Second {
		if ok, _ := l.Allow(ctx, "a"); ok {
			n++
		}
	}
	elapsed = time.Since(start).Seconds()
	if d := l.Degraded(); d == "" {
		t.Fatal("not degraded with Redis down")
	}
	if limit := rate/3*elapsed + rate/30 + 2; float64(n) > limit {
		t.Fatalf("degraded replica admitted %d in %.2fs, want at most its share %.0f", n, elapsed, limit)
	}
}

// The memory store's limiter (one replica) applies the same bucket.
func TestLocalQuota(t *testing.T) {
	l := quota.New(quota.Params{Rates: map[string]float64{"a": 50}, Replica: "solo"})
	var n int
	start := time.Now()
	for time.Since(start) < 500*time.Millisecond {
		if ok, _ := l.Allow(context.Background(), "a"); ok {
			n++
		}
	}
	if limit := 50*time.Since(start).Seconds() + 5 + 1; float64(n) > limit || n < 1 {
		t.Fatalf("admitted %d, want 1..%.0f", n, limit)
	}
	if l.Limited("b") || !l.Limited("a") {
		t.Fatal("Limited is wrong")
	}
}

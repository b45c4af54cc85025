package quota_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/mlsched/mlsched/dispatcher/internal/quota"
	"github.com/mlsched/mlsched/shared/redistest"
)

// Two replicas sharing one Redis keep a tenant to its cap between them; a
// finished task frees its place (released by either replica); a task of a
// replica that died frees it at its deadline; with Redis down each
// replica enforces the cap divided by the replicas it saw, and says so.
func TestSharedConcurrencyCap(t *testing.T) {
	rs := redistest.Start(t)
	caps := map[string]int{"a": 4}
	r1 := quota.New(quota.Params{Caps: caps, Redis: rs.Client(t), Replica: "r1"})
	r2 := quota.New(quota.Params{Caps: caps, Redis: rs.Client(t), Replica: "r2"})
	ctx := context.Background()
	long := time.Minute
	for i := range 2 {
		// r2 first: r1 counts the live replicas (both) at its first call
		if ok, _ := r2.Acquire(ctx, "a", fmt.Sprintf("u%d", i), long, false); !ok {
			t.Fatalf("r2: task %d refused under the cap", i)
		}
		if ok, _ := r1.Acquire(ctx, "a", fmt.Sprintf("t%d", i), long, false); !ok {
			t.Fatalf("r1: task %d refused under the cap", i)
		}
	}
	ok, wait := r1.Acquire(ctx, "a", "over", long, false)
	if ok || wait <= 0 {
		t.Fatalf("5th task across 2 replicas: ok=%v retry after %v, want refused with a retry-after", ok, wait)
	}
	if ok, _ := r2.Acquire(ctx, "a", "t0", long, false); !ok {
		t.Fatal("a task already in flight (its deadline moved) was refused")
	}
	if ok, _ := r2.Acquire(ctx, "b", "free", long, false); !ok || r1.Capped("b") || !r1.Capped("a") {
		t.Fatal("a tenant without a cap was refused, or Capped is wrong")
	}
	r2.Release(ctx, "t0") // t0 was r1's: any replica stores a result
	if ok, _ := r1.Acquire(ctx, "a", "over", long, false); !ok {
		t.Fatal("refused after a task finished")
	}
	if n, err := r1.InFlight(ctx, "a"); err != nil || n != 4 {
		t.Fatalf("in flight = %d, %v; want 4", n, err)
	}

	// A replica dies with a task in flight: it leaves at its deadline.
	if ok, _ := r1.Acquire(ctx, "a", "forced", 300*time.Millisecond, true); !ok {
		t.Fatal("a forced acquire (a retry) was refused")
	}
	r2.Release(ctx, "over")
	if ok, _ := r2.Acquire(ctx, "a", "x", long, false); ok {
		t.Fatal("admitted over the cap while the forced task is in flight")
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		ok, _ := r2.Acquire(ctx, "a", "x", long, false)
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a dead replica's task never left the set at its deadline")
		}
		time.Sleep(20 * time.Millisecond) // polling a condition, with a deadline
	}

	// Redis down: each replica holds tenant a to 4/2 = 2 of its own.
	rs.Stop()
	var n int
	for i := range 5 {
		if ok, _ := r1.Acquire(ctx, "a", fmt.Sprintf("d%d", i), long, false); ok {
			n++
		}
	}
	if r1.Degraded() == "" {
		t.Fatal("not degraded with Redis down")
	}
	if n != 2 {
		t.Fatalf("degraded replica admitted %d in flight, want its share 2 (cap 4, 2 replicas)", n)
	}
	r1.Release(ctx, "d0")
	if ok, _ := r1.Acquire(ctx, "a", "d9", long, false); !ok {
		t.Fatal("degraded: refused after a local task finished")
	}
}

// The memory store's limiter (one replica) applies the cap locally.
func TestLocalConcurrencyCap(t *testing.T) {
	l := quota.New(quota.Params{Caps: map[string]int{"a": 2}, Replica: "solo"})
	ctx := context.Background()
	for _, id := range []string{"1", "2"} {
		if ok, _ := l.Acquire(ctx, "a", id, time.Minute, false); !ok {
			t.Fatalf("task %s refused under the cap", id)
		}
	}
	if ok, wait := l.Acquire(ctx, "a", "3", time.Minute, false); ok || wait <= 0 {
		t.Fatalf("3rd task: ok=%v wait=%v, want refused", ok, wait)
	}
	l.Release(ctx, "1")
	if ok, _ := l.Acquire(ctx, "a", "3", time.Minute, false); !ok {
		t.Fatal("refused after a release")
	}
	if l.Degraded() != "" {
		t.Fatal("the memory store is never degraded")
	}
}

package redistest_test

import (
	"context"
	"testing"
	"time"

	"github.com/mlsched/mlsched/shared/redistest"
)

func TestStartClientStopRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := redistest.Start(t)
	if s.Addr == "" || s.Addr == "127.0.0.1:6379" {
		t.Fatalf("unexpected addr %q", s.Addr)
	}
	c := s.Client(t)
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if got, err := c.Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Fatalf("get = %q, %v", got, err)
	}

	s.Stop()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("ping succeeded while the server is stopped")
	}

	s.Restart(t)
	// the same client reconnects to the same address; the data is gone
	deadline := time.Now().Add(5 * time.Second)
	var err error
	for time.Now().Before(deadline) {
		if err = c.Ping(ctx).Err(); err == nil {
			break
		}
		<-time.After(10 * time.Millisecond) // poll interval
	}
	if err != nil {
		t.Fatalf("ping after restart: %v", err)
	}
	if n, err := c.Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Fatalf("exists after restart = %d, %v; want an empty server", n, err)
	}
}

func TestServersAreIsolated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := redistest.Start(t), redistest.Start(t)
	if a.Addr == b.Addr {
		t.Fatalf("two servers on %s", a.Addr)
	}
	if err := a.Client(t).Set(ctx, "k", "a", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, _ := b.Client(t).Exists(ctx, "k").Result(); n != 0 {
		t.Fatal("key leaked between servers")
	}
}

func TestStartProcess(t *testing.T) {
	t.Parallel()
	p, err := redistest.StartProcess(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	p.Stop()
	p.Stop() // idempotent
}

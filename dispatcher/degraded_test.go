package dispatcher_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/mlsched/mlsched/dispatcher"
	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/dispatcher/stats/redisstats"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/redisconn"
	"github.com/mlsched/mlsched/shared/redistest"
)

// When Redis goes away the dispatcher keeps dispatching on its last snapshot,
// says it is degraded, buffers statistics updates, and writes them once Redis
// is back.
func TestRedisOutageDegradesButKeepsDispatching(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t)
	e := newEnv(t, func(c *dispatcher.Config) { c.RedisURL = "redis://" + rs.Addr + "/0" })
	e.startNode("n1", []string{"echo"}, map[string]behavior{"m1": succeed})
	e.submit(protocol.Task{ID: "before", Type: "echo"})
	if res := e.result("before"); res.Status != protocol.StatusSucceeded {
		t.Fatalf("before outage: %+v", res)
	}
	if r := e.d.Report(); r.Store != "redis" || r.Degraded {
		t.Fatalf("report before the outage: store %q degraded %v", r.Store, r.Degraded)
	}

	rs.Stop()
	for i := 0; i < 5; i++ {
		e.submit(protocol.Task{ID: fmt.Sprintf("during-%d", i), Type: "echo"})
	}
	for i := 0; i < 5; i++ {
		if res := e.result(fmt.Sprintf("during-%d", i)); res.Status != protocol.StatusSucceeded || res.Model != "m1" {
			t.Fatalf("during outage: %+v", res)
		}
	}
	e.waitFor("degraded mode", func() bool {
		r := e.d.Report()
		return r.Degraded && r.DegradedReason != "" && r.Buffered > 0
	})

	rs.Restart(t) // an empty Redis on the same address
	e.waitFor("recovery", func() bool {
		r := e.d.Report()
		return !r.Degraded && r.Buffered == 0
	})
	// The updates made during the outage reached Redis after it came back.
	cfg := e.d.Config()
	store := redisstats.New(rs.Client(t), cfg.Window())
	snap, err := store.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// ... on top of what the dispatcher had learned before: Redis came back
	// empty and the dispatcher re-seeded it from its snapshot
	m := snap.Models["m1"]
	if m == nil || m.Successes < 6 || m.Dispatched < 6 {
		t.Fatalf("statistics after recovery: %+v", m)
	}
	if n := e.d.Counters().StoreResets.Load(); n < 1 {
		t.Errorf("store resets = %d, want the restart noticed", n)
	}
	if r := e.d.Report(); r.Dropped != 0 {
		t.Fatalf("dropped %d updates within the buffer bound", r.Dropped)
	}
}

// With MLSCHED_REDIS_URL naming a Sentinel setup, the master is killed
// with -9 in the middle of a run: every task still gets its one result, the
// dispatcher is degraded at most until Sentinel promotes the replica, and
// the statistics on the new master count every attempt.
func TestRedisSentinelFailover(t *testing.T) {
	t.Parallel()
	rs := redistest.StartSentinel(t)
	e := newEnv(t, func(c *dispatcher.Config) { c.RedisURL = rs.URL() })
	e.startNode("n1", []string{"echo"}, map[string]behavior{"m1": succeed})
	const n = 200
	submit := func(from, to int) {
		for i := from; i < to; i++ {
			e.submit(protocol.Task{ID: fmt.Sprintf("sf-%03d", i), Type: "echo"})
		}
	}
	submit(0, n/2)
	e.waitFor("first half done", func() bool { return e.resultCount(fmt.Sprintf("sf-%03d", n/2-1)) == 1 })
	// how long the dispatcher (running by now) says it is degraded, for
	// the log (not asserted: timing on a shared machine)
	var degraded time.Duration
	// Report reads what Run builds: call it only once Ready says the replica
	// started (an atomic, so the race detector sees the order).
	e.waitFor("the dispatcher started", func() bool { return e.d.Ready(e.ctx).Ready() })
	stopWatch := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopWatch:
				return
			case <-tick.C:
				if e.d.Report().Degraded {
					degraded += 10 * time.Millisecond
				}
			}
		}
	}()
	old := rs.KillMaster(t)
	submit(n/2, 3*n/4) // while Sentinel fails over
	rs.WaitFailover(t, old, 30*time.Second)
	submit(3*n/4, n)
	for i := range n {
		id := fmt.Sprintf("sf-%03d", i)
		if res := e.result(id); res.Status != protocol.StatusSucceeded {
			t.Fatalf("%s: %+v", id, res)
		}
		if c := e.resultCount(id); c != 1 {
			t.Fatalf("%s has %d results", id, c)
		}
	}
	e.waitFor("statistics written to the new master", func() bool {
		r := e.d.Report()
		return !r.Degraded && r.Buffered == 0
	})
	c, err := redisconn.Open(redisconn.Config{URL: rs.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cfg := e.d.Config()
	store := redisstats.New(c, cfg.Window())
	var m *stats.ModelStats
	e.waitFor("every attempt counted", func() bool {
		snap, err := store.Snapshot(context.Background())
		if err != nil {
			return false
		}
		m = snap.Models["m1"]
		return m != nil && m.Successes >= n
	})
	close(stopWatch)
	<-watched
	t.Logf("%d tasks, %d successes counted on the new master, degraded for about %v", n, m.Successes, degraded)
	if m.Successes > n+1000 { // at least once: a batch whose reply died with the master may count twice
		t.Errorf("%d successes counted for %d tasks", m.Successes, n)
	}
	if r := e.d.Report(); r.Dropped != 0 {
		t.Errorf("dropped %d statistics updates", r.Dropped)
	}
	if n := e.d.Counters().StoreResets.Load(); n < 1 {
		t.Errorf("store resets = %d, want the failover noticed (new replication id)", n)
	}
}

package dispatcher_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/mlsched/mlsched/dispatcher"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/redistest"
	"github.com/mlsched/mlsched/shared/stats/redisstats"
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
	m := snap.Models["m1"]
	if m == nil || m.Successes < 5 || m.Dispatched < 5 {
		t.Fatalf("statistics after recovery: %+v", m)
	}
	if r := e.d.Report(); r.Dropped != 0 {
		t.Fatalf("dropped %d updates within the buffer bound", r.Dropped)
	}
}

package redistest_test

import (
	"testing"
	"time"

	"github.com/mlsched/mlsched/shared/redisconn"
	"github.com/mlsched/mlsched/shared/redistest"
)

// The setup fails over for real: the master is killed, a sentinel promotes
// the replica, and a client of the Sentinel URL writes to the new master.
func TestSentinelFailover(t *testing.T) {
	t.Parallel()
	s := redistest.StartSentinel(t)
	c, err := redisconn.Open(redisconn.Config{URL: s.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := t.Context()
	if err := c.Set(ctx, "k", "before", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Do(ctx, "WAIT", 1, 1000).Err(); err != nil { // replicated before the kill
		t.Fatal(err)
	}
	old := s.KillMaster(t)
	now := s.WaitFailover(t, old, 30*time.Second)
	deadline := time.Now().Add(10 * time.Second)
	for {
		v, err := c.Get(ctx, "k").Result()
		if err == nil {
			if v != "before" {
				t.Fatalf("k = %q after failover, want before", v)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no read through the new master %s: %v", now, err)
		}
		time.Sleep(50 * time.Millisecond) // the client follows the switch: poll
	}
	if err := c.Set(ctx, "k", "after", 0).Err(); err != nil {
		t.Fatalf("write after failover: %v", err)
	}
	s.RestartAsReplica(t, old, now)
}

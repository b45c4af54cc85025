package natstest_test

import (
	"context"
	"testing"
	"time"

	"github.com/mlsched/mlsched/shared/natstest"
	"github.com/mlsched/mlsched/shared/topology"
)

// mlsched's streams are created R3 on a 3-server cluster, every replica
// catches up, and a second Ensure (another replica of a component starting)
// accepts them. A message survives the shutdown of the stream's leader.
func TestClusterR3Topology(t *testing.T) {
	c := natstest.NewCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := topology.Config{Replicas: 3}
	if err := topology.Ensure(ctx, c.JS, cfg); err != nil {
		t.Fatal(err)
	}
	if err := topology.Ensure(ctx, c.JS, cfg); err != nil {
		t.Fatalf("second Ensure: %v", err)
	}
	for _, sc := range topology.Streams(cfg) {
		if err := c.WaitStreamCurrent(ctx, sc.Name); err != nil {
			t.Fatal(err)
		}
		s, err := c.JS.Stream(ctx, sc.Name)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.Config.Replicas != 3 || len(info.Cluster.Replicas) != 2 {
			t.Fatalf("%s: %d replicas configured, %d followers; want 3 and 2", sc.Name, info.Config.Replicas, len(info.Cluster.Replicas))
		}
	}
	if _, err := c.JS.Publish(ctx, topology.ResultSubject("r1"), []byte("kept")); err != nil {
		t.Fatal(err)
	}
	s, err := c.JS.Stream(ctx, topology.StreamResults)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, srv := range c.Servers {
		if srv.Name() == info.Cluster.Leader {
			srv.Shutdown()
		}
	}
	// A new leader is elected within seconds; the generous deadline of its
	// own is for a loaded machine (CI shares two cores with everything else).
	rctx, rcancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer rcancel()
	var got []byte
	for got == nil {
		m, err := s.GetLastMsgForSubject(rctx, topology.ResultSubject("r1"))
		switch {
		case err == nil:
			got = m.Data
		case rctx.Err() != nil:
			t.Fatalf("read after the leader's shutdown: %v", err)
		default:
			time.Sleep(20 * time.Millisecond) // polling with the ctx deadline
		}
	}
	if string(got) != "kept" {
		t.Fatalf("read %q after the leader's shutdown", got)
	}
}

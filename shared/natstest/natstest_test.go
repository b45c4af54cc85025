package natstest_test

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/shared/jsplumb"
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
	// As the dispatcher and the worker do: a request made while the new
	// cluster still elects its leaders may get no answer, so each attempt has
	// a deadline of its own and is retried.
	ensure := func(ctx context.Context) error { return topology.Ensure(ctx, c.JS, cfg) }
	if err := jsplumb.Retry(ctx, zerolog.Nop(), "topology", ensure); err != nil {
		t.Fatal(err)
	}
	if err := jsplumb.Retry(ctx, zerolog.Nop(), "topology", ensure); err != nil {
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
		// Each read gets a short timeout of its own: a request made while the
		// client reconnects, or to a server that just left, gets no answer at
		// all and would otherwise wait out the whole deadline.
		actx, acancel := context.WithTimeout(rctx, 2*time.Second)
		m, err := s.GetLastMsgForSubject(actx, topology.ResultSubject("r1"))
		acancel()
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

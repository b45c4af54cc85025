package dispatcher

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/dispatcher/internal/policy"
	"github.com/mlsched/mlsched/dispatcher/internal/registry"
	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/dispatcher/stats/redisstats"
	"github.com/mlsched/mlsched/shared/natstest"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/redistest"
	"github.com/mlsched/mlsched/shared/topology"
)

// The snapshot refresher alone, on a real NATS server (the node registry) and
// a real redis-server (the statistics): the first table exists once it has
// started, it follows the store, it keeps the last snapshot and says so while
// Redis is down, and it leaves degraded mode when Redis is back.
func TestRefresherFollowsStoreAndDegrades(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := DefaultConfig()
	ns := natstest.New(t)
	kv, err := topology.EnsureNodesBucket(ctx, ns.JS, cfg.Topology())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	hb, _ := json.Marshal(protocol.Heartbeat{Node: "n1", Capacity: 4, StartedAt: now, SentAt: now,
		Models: []protocol.ModelInfo{{Name: "m1", Types: []string{"echo"}, TimeoutMs: 1500}}})
	if _, err := kv.Put(ctx, "n1", hb); err != nil {
		t.Fatal(err)
	}
	reg := registry.New(kv, 30*time.Second, zerolog.Nop())
	go func() { _ = reg.Run(ctx) }()
	<-reg.Ready()

	rs := redistest.Start(t)
	store := redisstats.New(rs.Client(t), cfg.Window())
	engine, err := policy.NewEngine(cfg.PolicyConfig())
	if err != nil {
		t.Fatal(err)
	}
	r := &refresher{store: store, engine: engine, reg: reg, interval: 20 * time.Millisecond, log: zerolog.Nop()}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	<-r.Started()
	// The first table is built before Started: the first decision has one.
	if tab := r.table.Load(); tab == nil || len(tab.Candidates("echo")) != 1 {
		t.Fatalf("first table: %+v", tab)
	}
	if got := (*r.timeouts.Load())["m1"]; got != 1500 {
		t.Fatalf("announced timeout of m1 = %d, want 1500", got)
	}
	if r.degraded.Load() != nil {
		t.Fatalf("degraded with Redis up: %s", *r.degraded.Load())
	}

	if err := store.Record(ctx, []stats.Event{{Model: "m1", Node: "n1", Kind: stats.KindSuccess, Latency: 5 * time.Millisecond}}); err != nil {
		t.Fatal(err)
	}
	within(t, "the snapshot to show the recorded success", func() bool {
		s := r.snap.Load()
		return s != nil && s.Models["m1"] != nil && s.Models["m1"].Successes == 1
	})

	rs.Stop()
	within(t, "degraded mode", func() bool { return r.degraded.Load() != nil })
	if s := r.snap.Load(); s == nil || s.Models["m1"] == nil || s.Models["m1"].Successes != 1 {
		t.Fatalf("the last snapshot was not kept while degraded: %+v", s)
	}
	if tab := r.table.Load(); len(tab.Candidates("echo")) != 1 {
		t.Fatal("the table lost its candidate while degraded")
	}

	rs.Restart(t)
	within(t, "leaving degraded mode", func() bool { return r.degraded.Load() == nil })
	if err := r.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
}

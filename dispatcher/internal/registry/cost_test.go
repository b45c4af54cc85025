package registry_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/dispatcher/internal/registry"
	"github.com/mlsched/mlsched/shared/natstest"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// A model's cost is what its node announces, per node: the same model may
// cost differently where it runs on other hardware; a model that declares
// none is not priced at 0 but undeclared.
func TestRegistryCostsPerNode(t *testing.T) {
	t.Parallel()
	ns := natstest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	kv, err := topology.EnsureNodesBucket(ctx, ns.JS, topology.Config{NodeTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	put := func(hb protocol.Heartbeat) {
		hb.Capacity, hb.SentAt = 4, time.Now()
		data, _ := json.Marshal(hb)
		if _, err := kv.Put(ctx, hb.Node, data); err != nil {
			t.Fatal(err)
		}
	}
	r := registry.New(kv, time.Minute, zerolog.Nop())
	go r.Run(ctx)
	<-r.Ready()
	if _, ok := r.Cost("a", "big", 10); ok {
		t.Fatal("a cost with no node")
	}
	put(protocol.Heartbeat{Node: "a", Models: []protocol.ModelInfo{
		{Name: "big", Types: []string{"t"}, CostPerTask: 1, CostPerUnit: 0.5},
		{Name: "free", Types: []string{"t"}}}})
	put(protocol.Heartbeat{Node: "b", Models: []protocol.ModelInfo{{Name: "big", Types: []string{"t"}, CostPerTask: 3}}})
	// The costs are read from a table the registry updates after its
	// live set: wait for both, not only for the nodes.
	waitFor(t, "two nodes and their costs", func() bool {
		_, okA := r.Cost("a", "big", 10)
		_, okB := r.Cost("b", "big", 10)
		return len(r.Live()) == 2 && okA && okB
	})
	if c, ok := r.Cost("a", "big", 10); !ok || c != 6 {
		t.Fatalf("big on a: %g %v, want 6", c, ok)
	}
	if c, ok := r.Cost("b", "big", 10); !ok || c != 3 {
		t.Fatalf("big on b: %g %v, want 3", c, ok)
	}
	if _, ok := r.Cost("a", "free", 10); ok {
		t.Fatal("a model without a cost reads as declared")
	}
}

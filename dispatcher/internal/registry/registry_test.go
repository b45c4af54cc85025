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

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestRegistryTracksHeartbeatsDeletesAndExpiry(t *testing.T) {
	t.Parallel()
	ns := natstest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	kv, err := topology.EnsureNodesBucket(ctx, ns.JS, topology.Config{NodeTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	put := func(node string) {
		hb := protocol.Heartbeat{Node: node, Capacity: 4, Models: []protocol.ModelInfo{{Name: "m", Types: []string{"t"}}}, SentAt: time.Now()}
		data, _ := json.Marshal(hb)
		if _, err := kv.Put(ctx, node, data); err != nil {
			t.Fatal(err)
		}
	}
	put("a") // present before the registry starts: loaded at once
	ttl := 400 * time.Millisecond
	r := registry.New(kv, ttl, zerolog.Nop())
	go r.Run(ctx)
	<-r.Ready()
	waitFor(t, "node a", func() bool { return len(r.Live()) == 1 && r.Live()[0].Node == "a" })

	put("b")
	if _, err := kv.Put(ctx, "junk", []byte("not json")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "nodes a and b", func() bool { return len(r.Live()) == 2 })
	if got := r.Live()[1]; got.Node != "b" || got.Capacity != 4 || got.Models[0].Name != "m" {
		t.Fatalf("node b = %+v", got)
	}

	if err := kv.Delete(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a deleted", func() bool { return len(r.Live()) == 1 && r.Live()[0].Node == "b" })

	// b stops sending heartbeats: it expires after the TTL by the registry's clock.
	waitFor(t, "b expired", func() bool { return len(r.Live()) == 0 })
}

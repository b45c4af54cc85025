package registry_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/dispatcher/internal/registry"
	"github.com/mlsched/mlsched/shared/natstest"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// The nodes bucket is memory-backed, so a NATS restart loses it and the
// first worker heartbeat re-creates it, its sequence starting again at 1. A
// watch resumes at its old sequence and would skip every new heartbeat until
// the new sequence caught up (found by the chaos test: all nodes gone for
// ~10s after a 1s NATS restart, longer the longer the cluster had run). The
// registry must see the nodes of the re-created bucket within a few TTLs.
func TestRegistrySurvivesBucketRecreation(t *testing.T) {
	t.Parallel()
	ns := natstest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := topology.Config{NodeTTL: time.Minute}
	kv, err := topology.EnsureNodesBucket(ctx, ns.JS, cfg)
	if err != nil {
		t.Fatal(err)
	}
	put := func(node string) {
		t.Helper()
		data, _ := json.Marshal(protocol.Heartbeat{Node: node, Capacity: 1, SentAt: time.Now()})
		if _, err := kv.Put(ctx, node, data); err != nil {
			t.Fatal(err)
		}
	}
	ttl := 300 * time.Millisecond
	r := registry.New(kv, ttl, zerolog.Nop())
	go r.Run(ctx)
	<-r.Ready()
	for range 200 { // a long-lived bucket: a high sequence
		put("old")
	}
	waitFor(t, "node old", func() bool { return len(r.Live()) == 1 })

	if err := ns.JS.DeleteKeyValue(ctx, topology.BucketNodes); err != nil {
		t.Fatal(err)
	}
	if kv, err = topology.EnsureNodesBucket(ctx, ns.JS, cfg); err != nil {
		t.Fatal(err)
	}
	// The new node heartbeats as a worker does, every TTL/3.
	beat := time.NewTicker(ttl / 3)
	defer beat.Stop()
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; ; i++ {
		put("new")
		live := r.Live()
		if len(live) == 1 && live[0].Node == "new" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the bucket was re-created the registry sees %v, want [new] (%s)", nodes(live), fmt.Sprint(i, " heartbeats sent"))
		}
		<-beat.C
	}
}

func nodes(hbs []protocol.Heartbeat) []string {
	out := make([]string, len(hbs))
	for i, h := range hbs {
		out[i] = h.Node
	}
	return out
}

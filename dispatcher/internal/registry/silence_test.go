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

// Issue 39: when every node goes silent at once (the bucket or the watch
// failing, not every node dying), the registry does not forget them one by
// one as their last heartbeats age (which for a while makes the types of
// the nodes heard from first look unserved while others are served): it
// says it is silent, keeps them, and forgets them together. A node that
// goes silent while others beat still expires on its own.
func TestSilentRegistryForgetsItsNodesTogether(t *testing.T) {
	t.Parallel()
	ns := natstest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	kv, err := topology.EnsureNodesBucket(ctx, ns.JS, topology.Config{NodeTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	put := func(node, typ string) {
		hb := protocol.Heartbeat{Node: node, Capacity: 4, Models: []protocol.ModelInfo{{Name: "m-" + typ, Types: []string{typ}}}, SentAt: time.Now()}
		data, _ := json.Marshal(hb)
		if _, err := kv.Put(ctx, node, data); err != nil {
			t.Fatal(err)
		}
	}
	ttl := time.Second
	r := registry.New(kv, ttl, zerolog.Nop())
	go r.Run(ctx)
	<-r.Ready()

	// One node silent while another beats: it expires alone.
	put("lone", "l")
	put("beating", "b")
	stop := make(chan struct{})
	beaten := make(chan struct{})
	go func() {
		defer close(beaten)
		tk := time.NewTicker(100 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
				put("beating", "b")
			}
		}
	}()
	waitFor(t, "the silent node expired alone", func() bool { return len(r.Live()) == 1 && r.Live()[0].Node == "beating" })
	if r.Silent() {
		t.Fatal("silent while a node beats")
	}
	close(stop)
	<-beaten
	waitFor(t, "the last node expired", func() bool { return len(r.Live()) == 0 })

	// Three nodes heard from a few hundred ms apart, then none at all.
	put("a", "x")
	waitFor(t, "a", func() bool { return len(r.Live()) == 1 })
	deadline := time.Now().Add(150 * time.Millisecond)
	waitFor(t, "150ms", func() bool { return time.Now().After(deadline) })
	put("b", "y")
	deadline = time.Now().Add(150 * time.Millisecond)
	waitFor(t, "150ms", func() bool { return time.Now().After(deadline) })
	put("c", "z")
	waitFor(t, "a, b and c", func() bool { return len(r.Live()) == 3 })
	sawSilent := false
	waitFor(t, "every node forgotten", func() bool {
		n := len(r.Live())
		if n != 0 && n != 3 {
			t.Fatalf("%d nodes live: the silent registry forgot its nodes one by one", n)
		}
		sawSilent = sawSilent || r.Silent()
		time.Sleep(2 * time.Millisecond)
		return n == 0
	})
	if !sawSilent {
		t.Fatal("the registry never said it was silent")
	}
	for _, typ := range []string{"x", "y", "z"} {
		if r.Served(typ).IsZero() {
			t.Fatalf("type %s: no served time", typ)
		}
	}
	if !r.Served("never").IsZero() {
		t.Fatal("a type no node served has a served time")
	}
}

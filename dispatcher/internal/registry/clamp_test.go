package registry_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/dispatcher/internal/registry"
	"github.com/mlsched/mlsched/shared/logtest"
	"github.com/mlsched/mlsched/shared/natstest"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// A heartbeat with absurd load figures is clamped and logged; the node
// stays live and routable.
func TestRegistryClampsAbsurdLoadFigures(t *testing.T) {
	t.Parallel()
	ns := natstest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	kv, err := topology.EnsureNodesBucket(ctx, ns.JS, topology.Config{NodeTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	var logs logtest.Buffer
	r := registry.New(kv, time.Minute, zerolog.New(&logs))
	go r.Run(ctx)
	<-r.Ready()
	hb := protocol.Heartbeat{Node: "n", Capacity: -5, InFlight: 1 << 40, Queued: -1,
		Models: []protocol.ModelInfo{{Name: "m", Types: []string{"t"}, MaxConcurrency: -3, InFlight: 1 << 30}}}
	data, _ := json.Marshal(hb)
	if _, err := kv.Put(ctx, "n", data); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "node n", func() bool { return len(r.Live()) == 1 })
	got := r.Live()[0]
	if got.Capacity != 0 || got.InFlight != protocol.MaxQueued || got.Queued != 0 ||
		got.Models[0].MaxConcurrency != 0 || got.Models[0].InFlight != protocol.MaxQueued {
		t.Fatalf("clamped heartbeat = %+v", got)
	}
	waitFor(t, "the clamp logged", func() bool { return strings.Contains(logs.String(), "absurd load figures") })
	for _, want := range []string{"capacity -5 clamped to 0", "model m max_concurrency -3 clamped to 0", "queued -1 clamped to 0"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log %s lacks %q", logs.String(), want)
		}
	}
}

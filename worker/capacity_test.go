package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// heartbeatOf reads the node's current heartbeat.
func (h *harness) heartbeatOf() (protocol.Heartbeat, bool) {
	var hb protocol.Heartbeat
	kv, err := h.srv.JS.KeyValue(context.Background(), topology.BucketNodes)
	if err != nil {
		return hb, false
	}
	e, err := kv.Get(context.Background(), h.node)
	if err != nil {
		return hb, false
	}
	return hb, json.Unmarshal(e.Value(), &hb) == nil
}

// A model's max_concurrency caps its tasks on the node below the node's
// concurrency, while another model still uses the free slots; the
// heartbeat announces the limit, the model's in-flight count, and the work
// queued on the node.
func TestModelMaxConcurrency(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "n-limit")
	const limit, total = 2, 8
	var cur, peak, other atomic.Int32
	gate := make(chan struct{})
	cfg := h.config()
	cfg.Concurrency, cfg.Prefetch = 4, 2
	limited := goModel("big", "gated")
	limited.MaxConcurrency = new(int)
	*limited.MaxConcurrency = limit
	h.start(cfg, WithHandler("gated", func(ctx context.Context, _ Task) (any, error) {
		c := cur.Add(1)
		defer cur.Add(-1)
		for {
			p := peak.Load()
			if c <= p || peak.CompareAndSwap(p, c) {
				break
			}
		}
		select {
		case <-gate:
			return "ok", nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}), WithHandler("quick", func(context.Context, Task) (any, error) { other.Add(1); return "ok", nil }),
		WithModels([]ModelSpec{limited, goModel("small", "quick")}))
	for i := range total {
		h.dispatch(fmt.Sprintf("b%d", i), "big", dispatchOpts{})
	}
	// big runs 2 at once; 4 more big tasks are delivered (the consumer lets
	// Concurrency + Prefetch = 6 be unacknowledged) and wait for the limit;
	// 2 wait in the stream.
	waitFor(t, 10*time.Second, "the limit reached and the queue announced", func() bool {
		hb, ok := h.heartbeatOf()
		if !ok || cur.Load() != limit {
			return false
		}
		for _, m := range hb.Models {
			if m.Name == "big" && m.MaxConcurrency == limit && m.InFlight == 6 {
				return hb.Queued == total-limit && hb.InFlight == limit
			}
		}
		return false
	})
	if p := peak.Load(); p != limit {
		t.Fatalf("peak %d tasks of big at once, want its max_concurrency %d", p, limit)
	}
	close(gate)
	got := h.collect(total, 20*time.Second)
	for id, o := range got {
		if o.Status != protocol.OutcomeSuccess {
			t.Errorf("%s: %q", id, o.Status)
		}
	}
	if p := peak.Load(); p != limit {
		t.Errorf("peak %d tasks of big at once, want %d", p, limit)
	}
}

// A model's declared cost reaches the dispatcher in the node's heartbeat,
// which the dispatcher validates as it does every heartbeat; a model
// without a cost announces none.
func TestHeartbeatAnnouncesCost(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "n-cost")
	priced := goModel("priced", "echo")
	priced.Cost = &ModelCost{PerTask: 0.25, PerUnit: 0.001}
	h.start(h.config(), WithHandler("echo", func(context.Context, Task) (any, error) { return "ok", nil }),
		WithModels([]ModelSpec{priced, goModel("free", "echo")}))
	var got protocol.Heartbeat
	waitFor(t, 10*time.Second, "both models announced", func() bool {
		hb, ok := h.heartbeatOf()
		got = hb
		return ok && len(hb.Models) == 2
	})
	if err := got.Validate(h.node); err != nil {
		t.Fatalf("the dispatcher would refuse the heartbeat: %v", err)
	}
	for _, m := range got.Models {
		switch m.Name {
		case "priced":
			if m.CostPerTask != 0.25 || m.CostPerUnit != 0.001 {
				t.Errorf("priced announces cost %g per task, %g per unit; want 0.25, 0.001", m.CostPerTask, m.CostPerUnit)
			}
		case "free":
			if m.CostPerTask != 0 || m.CostPerUnit != 0 {
				t.Errorf("free announces a cost: %+v", m)
			}
		default:
			t.Errorf("unexpected model %q", m.Name)
		}
	}
}

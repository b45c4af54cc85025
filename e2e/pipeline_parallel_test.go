package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/dispatcher"
	"github.com/mlsched/mlsched/e2e/harness"
	"github.com/mlsched/mlsched/shared/client"
	"github.com/mlsched/mlsched/shared/natsconn"
	"github.com/mlsched/mlsched/shared/natstest"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
	"github.com/mlsched/mlsched/worker"
	"github.com/mlsched/mlsched/worker/model"
)

// barrier lets n callers through once all n are waiting, or fails each
// at its context's end.
type barrier struct {
	mu      sync.Mutex
	n, in   int
	release chan struct{}
}

func newBarrier(n int) *barrier { return &barrier{n: n, release: make(chan struct{})} }

func (b *barrier) wait(ctx context.Context) error {
	b.mu.Lock()
	b.in++
	if b.in == b.n {
		close(b.release)
	}
	b.mu.Unlock()
	select {
	case <-b.release:
		return nil
	case <-ctx.Done():
		return errors.New("the ensemble's members did not run together")
	}
}

// An ensemble's members run in parallel (issue 45): the three members'
// models each wait until all three are running, so members run one after
// another would fail the first at its timeout. Their outputs are merged by
// name, each member's output stored in MLSCHED_PIPELINE before the step
// after the ensemble starts, one result. A member that fails fails the
// pipeline naming it, once, whatever its siblings do. Real nats-server,
// dispatcher and worker in process.
func TestEnsembleMembersRunInParallel(t *testing.T) {
	t.Parallel()
	ns := natstest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	cfg := dispatcher.DefaultConfig()
	cfg.NATS.URL, cfg.Name, cfg.HTTPAddr = ns.URL, "parallel", "off"
	cfg.SnapshotInterval = 50 * time.Millisecond
	d, err := dispatcher.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	together := newBarrier(3)
	member := func(name string) worker.Handler {
		return func(ctx context.Context, t worker.Task) (any, error) {
			if err := together.wait(ctx); err != nil {
				return nil, err
			}
			return map[string]any{"by": name, "in": json.RawMessage(t.Payload)}, nil
		}
	}
	failing := func(context.Context, worker.Task) (any, error) { return nil, errors.New("judge down") }
	echo := func(_ context.Context, t worker.Task) (any, error) { return json.RawMessage(t.Payload), nil }
	spec := func(name, typ string) worker.ModelSpec {
		return worker.ModelSpec{Name: name, Types: []string{typ}, Executor: model.ExecutorGo, Go: &model.GoSpec{Handler: name}}
	}
	w, err := worker.New(worker.Config{NATS: natsconn.Config{URL: ns.URL}, NodeID: "pn", Concurrency: 8,
		HeartbeatInterval: 100 * time.Millisecond},
		worker.WithHandler("ma", member("a")), worker.WithHandler("mb", member("b")), worker.WithHandler("mc", member("c")),
		worker.WithHandler("mfail", failing), worker.WithHandler("mecho", echo),
		worker.WithModels([]worker.ModelSpec{spec("ma", "ja"), spec("mb", "jb"), spec("mc", "jc"), spec("mfail", "jfail"), spec("mecho", "echo")}),
		worker.WithLogger(zerolog.Nop()))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() { _ = d.Run(ctx) })
	wg.Go(func() { _ = w.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()

	member1 := func(name, typ string) protocol.PipelineStep {
		return protocol.PipelineStep{Name: name, Type: typ, TimeoutMs: 5000, MaxAttempts: 1}
	}
	c := client.New(ns.JS)
	ok := &protocol.Pipeline{Steps: []protocol.PipelineStep{
		{Name: "first", Type: "echo"},
		{Name: "vote", Input: "$.doc", Ensemble: []protocol.PipelineStep{member1("a", "ja"), member1("b", "jb"), member1("c", "jc")}},
		{Name: "last", Type: "echo"},
	}}
	bad := &protocol.Pipeline{Steps: []protocol.PipelineStep{
		{Name: "first", Type: "echo"},
		{Name: "vote", Ensemble: []protocol.PipelineStep{member1("fine", "echo"), member1("broken", "jfail")}},
	}}
	if _, err := c.Submit(ctx, protocol.Task{ID: "ens-ok", Type: "echo", Payload: json.RawMessage(`{"doc":{"n":7}}`), Pipeline: ok}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Submit(ctx, protocol.Task{ID: "ens-bad", Type: "echo", Payload: json.RawMessage(`{"n":8}`), Pipeline: bad}); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	res, err := c.Wait(wctx, "ens-ok")
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != protocol.StatusSucceeded || ensembleSteps(res) != "first:succeeded,a:succeeded,b:succeeded,c:succeeded,last:succeeded" {
		t.Fatalf("ens-ok: %s %s: %s (steps %s)", res.Status, res.ErrorCode, res.Error, ensembleSteps(res))
	}
	var merged map[string]struct {
		By string          `json:"by"`
		In json.RawMessage `json:"in"`
	}
	if err := json.Unmarshal(res.Output, &merged); err != nil || len(merged) != 3 || merged["b"].By != "b" || string(merged["c"].In) != `{"n":7}` {
		t.Fatalf("ens-ok output %s: %v", res.Output, err)
	}
	for _, s := range res.Steps[1:4] {
		if s.Ensemble != "vote" || s.Attempts != 1 || s.Model != "m"+s.Name {
			t.Errorf("member record %+v", s)
		}
	}
	if res.Attempts != 5 {
		t.Errorf("attempts %d, want 5", res.Attempts)
	}
	kv, err := ns.JS.KeyValue(ctx, topology.BucketPipeline)
	if err != nil {
		t.Fatal(err)
	}
	okKeys := 0
	keys, err := kv.Keys(ctx)
	for _, k := range keys {
		if strings.HasPrefix(k, base64.RawURLEncoding.EncodeToString([]byte("ens-ok"))+".") {
			okKeys++
		}
	}
	if err != nil || okKeys != 3 {
		t.Errorf("%s holds %v (%v), want ens-ok's 3 members' outputs", topology.BucketPipeline, keys, err)
	}

	res, err = c.Wait(wctx, "ens-bad")
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != protocol.StatusFailed || res.ErrorCode != protocol.CodePipelineError || res.FailedStep != "broken" {
		t.Fatalf("ens-bad: %+v", res)
	}
	// The sibling that succeeded stored its output and its step was acked
	// (nothing left in flight in MLSCHED_TASKS): it ended there, with no
	// second result beside the failure.
	ts, err := ns.JS.Stream(ctx, topology.StreamTasks)
	if err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 10*time.Second, "the failed ensemble's sibling stored and acked", func() error {
		keys, err := kv.Keys(ctx)
		if err != nil || len(keys) != 4 {
			return fmt.Errorf("%s holds %d keys (%v), want 4", topology.BucketPipeline, len(keys), err)
		}
		for cl := ts.ListConsumers(ctx); ; {
			ci, ok := <-cl.Info()
			if !ok {
				return cl.Err()
			}
			if ci.NumAckPending > 0 || ci.NumPending > 0 {
				return fmt.Errorf("consumer %s: %d pending, %d unacked", ci.Name, ci.NumPending, ci.NumAckPending)
			}
		}
	})
	rs, err := ns.JS.Stream(ctx, topology.StreamResults)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := rs.Info(ctx); err != nil || info.State.Msgs != 2 {
		t.Errorf("results stream: %+v (%v), want 2 results", info, err)
	}
}

func ensembleSteps(r *protocol.Result) string {
	s := ""
	for i, st := range r.Steps {
		if i > 0 {
			s += ","
		}
		s += st.Name + ":" + string(st.Status)
	}
	return s
}

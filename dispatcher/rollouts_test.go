package dispatcher

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/dispatcher/internal/policy"
	"github.com/mlsched/mlsched/dispatcher/rollout"
	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/shared/natstest"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// waitFor polls cond until it holds or the deadline passes.
func waitRollout(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Two replicas count a rollout's outcomes into one record in the bucket;
// the record survives both being replaced, and the engines' splits follow
// its share, promotion and rollback.
func TestRolloutsAcrossReplicasAndRestarts(t *testing.T) {
	t.Parallel()
	ns := natstest.New(t)
	ctx := context.Background()
	kv, err := topology.EnsureRolloutsBucket(ctx, ns.JS, topology.Config{})
	if err != nil {
		t.Fatal(err)
	}
	store := rollout.Store{KV: kv}
	var breaker atomic.Bool
	start := func() (*rollouts, *policy.Engine, context.CancelFunc) {
		e, err := policy.NewEngine(policy.Config{ExploreShare: -1, Seed: 7})
		if err != nil {
			t.Fatal(err)
		}
		ro := newRollouts(kv, e, func(m string) bool { return m == "fraud@v8" && breaker.Load() }, 20*time.Millisecond, zerolog.Nop())
		rctx, cancel := context.WithCancel(ctx)
		if err := ro.Start(rctx); err != nil {
			t.Fatal(err)
		}
		return ro, e, func() { cancel(); _ = ro.Stop() }
	}
	a, ea, stopA := start()
	b, _, stopB := start()

	if _, err := store.Update(ctx, "fraud", func(prev *rollout.Rollout) (*rollout.Rollout, error) {
		return rollout.Start(rollout.Spec{Model: "fraud@v8", Steps: []float64{10, 50, 100}, MinTasks: 100}, prev, time.Now())
	}); err != nil {
		t.Fatal(err)
	}
	waitRollout(t, "both replicas to follow the rollout", func() bool { return len(a.list()) == 1 && len(b.list()) == 1 })
	if c := b.transitionCounts(); c[rollout.Running] != 1 {
		t.Fatalf("the start, seen live, counted %v", c)
	}

	// the engine caps the new version at the step's 10%
	tab := policy.NewTable(nil, []protocol.Heartbeat{{Node: "n1", Capacity: 100, SentAt: time.Now(), Models: []protocol.ModelInfo{
		{Name: "fraud@v7", Types: []string{"fraud"}}, {Name: "fraud@v8", Types: []string{"fraud"}}}}}, time.Now())
	n := 0
	for range 1000 {
		d, err := ea.Decide(tab, &policy.Request{Type: "fraud"})
		if err != nil {
			t.Fatal(err)
		}
		if d.Model == "fraud@v8" {
			n++
		}
	}
	if n < 99 || n > 101 {
		t.Fatalf("new version took %d of 1000 at a 10%% step", n)
	}

	// outcomes counted on both replicas add up in the record; a retry's
	// and a task error's do not count
	for i := range 60 {
		for _, ro := range []*rollouts{a, b} {
			ro.observe("fraud@v8", stats.KindSuccess, 1)
			ro.observe("fraud@v7", stats.KindSuccess, 1)
			if i%20 == 0 {
				ro.observe("fraud@v7", stats.KindModelError, 1)
			}
		}
	}
	a.observe("fraud@v8", stats.KindModelError, 2)
	a.observe("fraud@v8", stats.KindTaskError, 1)
	a.observe("other", stats.KindModelError, 1)
	waitRollout(t, "the counts in the bucket", func() bool {
		r, _, err := store.Get(ctx, "fraud")
		return err == nil && r.New.N() == 120 && r.Incumbent.N() == 126
	})

	// every replica goes; new ones resume at the same step with the same counts
	stopA()
	stopB()
	a, ea, stopA = start()
	defer func() { stopA() }()
	waitRollout(t, "the new replica to load the rollout", func() bool { return len(a.list()) == 1 })
	if r := a.list()[0].Rollout; r.Step != 0 || r.New.N() != 120 || r.State != rollout.Running {
		t.Fatalf("after restart: step %d, %d new outcomes, %s", r.Step, r.New.N(), r.State)
	}

	// enough good outcomes promote to the next step (the test: 1/21 vs 0)
	for range 500 {
		a.observe("fraud@v8", stats.KindSuccess, 1)
		a.observe("fraud@v7", stats.KindSuccess, 1)
	}
	waitRollout(t, "promotion to 50%", func() bool {
		r, _, err := store.Get(ctx, "fraud")
		return err == nil && r.Step == 1 && r.New.N() == 0
	})
	waitRollout(t, "the split at 50%", func() bool {
		for _, v := range a.list() {
			return v.Rollout.Share() == 0.5
		}
		return false
	})
	// the breaker opens: rolled back with its evidence, the split at 0
	breaker.Store(true)
	a.observe("fraud@v8", stats.KindModelError, 1)
	waitRollout(t, "the rollback", func() bool {
		r, _, err := store.Get(ctx, "fraud")
		return err == nil && r.State == rollout.RolledBack && r.Evidence != nil
	})
	waitRollout(t, "the split at 0", func() bool {
		d, err := ea.Decide(tab, &policy.Request{Type: "fraud"})
		return err == nil && d.Model == "fraud@v7" && a.list()[0].Rollout.Share() == 0
	})
	for range 200 {
		if d, _ := ea.Decide(tab, &policy.Request{Type: "fraud"}); d.Model != "fraud@v7" {
			t.Fatalf("a rolled-back version got a task")
		}
	}
	if c := a.transitionCounts(); c[rollout.RolledBack] != 1 || c[rollout.Running] != 1 {
		t.Fatalf("transitions seen %v", c)
	}
}

package e2e

import (
	"context"
	"fmt"
	"math"
	"os"
	"testing"
	"time"

	"github.com/mlsched/mlsched/dispatcher/rollout"
	"github.com/mlsched/mlsched/e2e/harness"
	"github.com/mlsched/mlsched/shared/client"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// rolloutCluster is 2 dispatcher replicas and 2 workers hosting fraud@v7
// and fraud@v8 (sim models, testdata/rollout/<kind>.yaml).
type rolloutCluster struct {
	c      *harness.Cluster
	ds     []*harness.Dispatcher
	store  rollout.Store
	client *client.Client
	next   int
}

func newRolloutCluster(t *testing.T, kind string) *rolloutCluster {
	c := harness.New(t)
	c.StartNATS()
	c.StartRedis()
	rc := &rolloutCluster{c: c}
	for range 2 {
		rc.ds = append(rc.ds, c.StartDispatcher(harness.DispatcherOptions{Env: map[string]string{
			"MLSCHED_SNAPSHOT_INTERVAL": "100ms", "MLSCHED_NODE_TTL": "10s"}}))
	}
	for i, node := range []string{"node-1", "node-2"} {
		c.StartWorker(harness.WorkerOptions{NodeID: node, ModelsFile: "testdata/rollout/" + kind + ".yaml",
			Concurrency: 32, SimSeed: int64(31*i + 5)})
	}
	ctx := context.Background()
	for _, d := range rc.ds {
		harness.Eventually(t, harness.ReadyTimeout, d.Name+" sees both nodes", func() error {
			r, err := d.Stats(ctx)
			if err != nil {
				return err
			}
			if len(r.Nodes) != 2 {
				return fmt.Errorf("%d nodes", len(r.Nodes))
			}
			return nil
		})
	}
	_, js := c.Connect()
	kv, err := topology.EnsureRolloutsBucket(ctx, js, topology.Config{})
	if err != nil {
		t.Fatal(err)
	}
	rc.store = rollout.Store{KV: kv}
	rc.client = client.New(js)
	return rc
}

func (rc *rolloutCluster) start(t *testing.T, spec rollout.Spec) {
	if _, err := rc.store.Update(context.Background(), spec.Family(), func(prev *rollout.Rollout) (*rollout.Rollout, error) {
		return rollout.Start(spec, prev, time.Now())
	}); err != nil {
		t.Fatal(err)
	}
	rc.follow(t, spec.Model)
}

// follow waits until both replicas follow the rollout: the watch is fast,
// but a task decided before it would not be capped.
func (rc *rolloutCluster) follow(t *testing.T, model string) {
	harness.Eventually(t, 10*time.Second, "replicas follow the rollout", func() error {
		for _, d := range rc.ds {
			r, err := d.Stats(context.Background())
			if err != nil {
				return err
			}
			if len(r.Rollouts) != 1 || r.Rollouts[0].Model != model {
				return fmt.Errorf("%s reports rollouts %+v", d.Name, r.Rollouts)
			}
		}
		return nil
	})
}

func (rc *rolloutCluster) get(t *testing.T) *rollout.Rollout {
	r, _, err := rc.store.Get(context.Background(), "fraud")
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// batch submits n tasks of the family, waits for every result, and returns
// how many first attempts went to the new version, how many of them
// failed, and whether every task succeeded.
func (rc *rolloutCluster) batch(t *testing.T, n int) (onNew, newFailed, failedTasks int) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tasks := make([]protocol.Task, n)
	ids := make([]string, n)
	for i := range tasks {
		rc.next++
		ids[i] = fmt.Sprintf("r-%d", rc.next)
		// 4 attempts: the incumbent itself fails 1% of attempts, so with 3
		// a task of 4000 failed all of them about once in 200 runs (seen
		// under make test's load: r-1178, 3 times model_error on fraud@v7).
		tasks[i] = protocol.Task{ID: ids[i], Type: "fraud", MaxAttempts: 4}
	}
	if _, errs := rc.client.SubmitMany(ctx, tasks, 0); errs != nil {
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := rc.client.WaitAll(ctx, ids, func(r *protocol.Result) {
		if r.Status != protocol.StatusSucceeded {
			failedTasks++
			t.Logf("task %s: %s %s (%s), history %+v", r.ID, r.Status, r.ErrorCode, r.Error, r.History)
		}
		if len(r.History) > 0 && r.History[0].Model == "fraud@v8" {
			onNew++
			if r.History[0].Status != protocol.OutcomeSuccess {
				newFailed++
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	return
}

// TestRolloutLive runs the rollouts on a live cluster of 2
// dispatcher replicas and 2 workers: a bad new version (15% against 1%) is
// rolled back within 300 of its own tasks with no task lost; a good one
// (0.5%) is promoted to 100% unattended, its share over every batch of 200
// tasks within one step never above the cap by more than 2pp, and when every
// dispatcher is killed mid-rollout it resumes at the same step with the same
// counts and the cap still holds.
func TestRolloutLive(t *testing.T) {
	requireBinaries(t, "dispatcher", "worker")
	t.Run("bad", func(t *testing.T) {
		t.Parallel()
		rc := newRolloutCluster(t, "bad")
		rc.start(t, rollout.Spec{Model: "fraud@v8", Steps: []float64{5, 25, 50, 100}, MinTasks: 300, MaxDrop: 0.01})
		total, newFailed, failedTasks := 0, 0, 0
		for rc.get(t).State == rollout.Running && total < 20000 {
			_, nf, ft := rc.batch(t, 200)
			total, newFailed, failedTasks = total+200, newFailed+nf, failedTasks+ft
		}
		// the run goes on to 4000 tasks after the rollback: the version
		// gets nothing more
		on := 0
		for first := true; first || total < 4000; first = false {
			o, _, ft := rc.batch(t, 200)
			total, failedTasks, on = total+200, failedTasks+ft, on+o
		}
		r := rc.get(t)
		t.Logf("bad canary: %s after %d tasks; evidence %+v; %d first attempts failed on it (%.3f%% of all), %d tasks failed",
			r.State, total, r.Evidence, newFailed, 100*float64(newFailed)/float64(total), failedTasks)
		if r.State != rollout.RolledBack || r.Evidence == nil {
			t.Fatalf("not rolled back: %s", r.State)
		}
		if r.Evidence.New.N() > 300 {
			t.Errorf("rolled back after %d of its own tasks, want <= 300", r.Evidence.New.N())
		}
		if share := float64(newFailed) / float64(total); share > 0.005 {
			t.Errorf("%.3f%% of all tasks failed their first attempt on the canary, want <= 0.5%%", 100*share)
		}
		if failedTasks != 0 {
			t.Errorf("%d tasks failed: every failed canary attempt must be retried to success", failedTasks)
		}
		if on != 0 {
			t.Errorf("the rolled-back version took %d first attempts after its rollback", on)
		}
	})
	t.Run("good-with-restarts", func(t *testing.T) {
		t.Parallel()
		rc := newRolloutCluster(t, "good")
		// short by default (make test); MLSCHED_ROLLOUT_FULL=1 runs the
		// issue's steps, 5,25,50,100 with min-tasks 300 (about 11000 tasks)
		steps, minTasks := []float64{10, 50, 100}, int64(150)
		if os.Getenv("MLSCHED_ROLLOUT_FULL") == "1" {
			steps, minTasks = []float64{5, 25, 50, 100}, 300
		}
		rc.start(t, rollout.Spec{Model: "fraud@v8", Steps: steps, MinTasks: minTasks, MaxDrop: 0.01})
		restarted := false
		worst, total := math.Inf(-1), 0
		for total < 60000 {
			before := rc.get(t)
			if before.State != rollout.Running {
				break
			}
			if !restarted && before.Step == 1 && before.New.N() > 20 {
				// every dispatcher killed mid-rollout: the record is as
				// it was, and the new replicas resume from it
				for _, d := range rc.ds {
					d.Kill()
				}
				killed := rc.get(t)
				for _, d := range rc.ds {
					if err := d.Start(); err != nil {
						t.Fatal(err)
					}
				}
				rc.follow(t, "fraud@v8")
				after := rc.get(t)
				if after.Step != killed.Step || after.New != killed.New || after.Incumbent != killed.Incumbent {
					t.Fatalf("after the restart: step %d counts %+v/%+v, before %d %+v/%+v",
						after.Step, after.New, after.Incumbent, killed.Step, killed.New, killed.Incumbent)
				}
				t.Logf("killed both dispatchers at step %d with %d+%d outcomes; resumed with the same", killed.Step, killed.New.N(), killed.Incumbent.N())
				restarted = true
				continue
			}
			on, _, ft := rc.batch(t, 200)
			total += 200
			if ft != 0 {
				t.Errorf("%d tasks failed", ft)
			}
			if after := rc.get(t); after.Step == before.Step && after.State == rollout.Running {
				over := 100 * (float64(on)/200 - before.Share())
				worst = max(worst, over)
				if over > 2 {
					t.Errorf("step %d (cap %g%%): %d of 200 first attempts on the new version, %.1fpp over", before.Step, 100*before.Share(), on, over)
				}
			}
		}
		r := rc.get(t)
		t.Logf("good canary: %s after %d tasks, share at most %.1fpp over its cap in batches of 200; history %d events", r.State, total, worst, len(r.History))
		if r.State != rollout.Promoted || !restarted {
			t.Fatalf("state %s, restarted %v", r.State, restarted)
		}
		for _, e := range r.History {
			if e.By != "auto" && e.To != rollout.Running {
				t.Errorf("a manual transition: %+v", e)
			}
		}
	})
}

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mlsched/mlsched/e2e/harness"
	"github.com/mlsched/mlsched/shared/client"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

const groupModels = `models:
  - name: quick
    types: [echo]
    executor: sim
    sim: {latency: {dist: uniform, min: 1ms, max: 2ms}, failure_rate: 0}
`

// TestGroupCommitLive runs a burst through real processes on a nats-server
// with sync_interval always: a producer with client.WithGroupCommit and a
// dispatcher with MLSCHED_GROUP_COMMIT on (the default) store tasks and
// results in atomic batches, and every task still has exactly one result.
// With MLSCHED_GROUP_COMMIT=false nothing is batched.
func TestGroupCommitLive(t *testing.T) {
	requireBinaries(t, "dispatcher", "worker")
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprintf("group_commit=%v", on), func(t *testing.T) {
			n := envInt(t, "MLSCHED_GROUP_COMMIT_TASKS", 2000)
			c := harness.New(t)
			c.StartNATS()
			c.StartRedis()
			models := filepath.Join(t.TempDir(), "models.yaml")
			if err := os.WriteFile(models, []byte(groupModels), 0o600); err != nil {
				t.Fatal(err)
			}
			d := c.StartDispatcher(harness.DispatcherOptions{Env: map[string]string{
				"MLSCHED_GROUP_COMMIT": fmt.Sprint(on), "MLSCHED_MAX_IN_FLIGHT": "2048"}})
			for i := range 2 {
				c.StartWorker(harness.WorkerOptions{NodeID: fmt.Sprintf("gc-%d", i), ModelsFile: models, Concurrency: 64, SimSeed: int64(i + 1)})
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			harness.Eventually(t, harness.ReadyTimeout, "the dispatcher sees both nodes", func() error {
				r, err := d.Stats(ctx)
				if err != nil {
					return err
				}
				if len(r.Nodes) != 2 {
					return fmt.Errorf("%d nodes", len(r.Nodes))
				}
				return nil
			})
			waitTableRefreshed(ctx, t, d)

			_, js := c.Connect(nats.Name("e2e-group-commit"))
			cl := client.New(js, client.WithGroupCommit(on))
			defer cl.Close()
			tasks := make([]protocol.Task, n)
			ids := make([]string, n)
			for i := range tasks {
				ids[i] = fmt.Sprintf("gc-%05d", i)
				tasks[i] = protocol.Task{ID: ids[i], Type: "echo", Payload: json.RawMessage(`{}`)}
			}
			_, errs := cl.SubmitMany(ctx, tasks, 1024)
			for i, err := range errs {
				if err != nil {
					t.Fatalf("%s: %v", ids[i], err)
				}
			}
			got := map[string]int{}
			if err := cl.WaitAll(ctx, ids, func(r *protocol.Result) {
				got[r.ID]++
				if r.Status != protocol.StatusSucceeded {
					t.Errorf("%s: %s %s %s", r.ID, r.Status, r.ErrorCode, r.Error)
				}
			}); err != nil {
				t.Fatal(err)
			}
			for _, id := range ids {
				if got[id] != 1 {
					t.Fatalf("%s: %d results", id, got[id])
				}
			}
			// Every result is stored once; count those stored in a batch.
			rs, err := js.Stream(ctx, topology.StreamResults)
			if err != nil {
				t.Fatal(err)
			}
			batched := 0
			for _, id := range ids {
				m, err := rs.GetLastMsgForSubject(ctx, topology.ResultSubject(id))
				if err != nil {
					t.Fatalf("%s: %v", id, err)
				}
				if m.Header.Get("Nats-Batch-Id") != "" {
					batched++
				}
			}
			info, err := rs.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if info.State.Msgs != uint64(n) {
				t.Fatalf("the results stream holds %d results, want %d", info.State.Msgs, n)
			}
			t.Logf("group commit %v: %d of %d results stored in batches", on, batched, n)
			switch {
			case on && batched == 0:
				t.Fatalf("no result of a burst of %d was stored in a batch", n)
			case !on && batched > 0:
				t.Fatalf("%d results stored in batches with MLSCHED_GROUP_COMMIT=false", batched)
			}
		})
	}
}

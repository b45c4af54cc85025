package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mlsched/mlsched/dispatcher/authconf"
	"github.com/mlsched/mlsched/e2e/harness"
	"github.com/mlsched/mlsched/shared/client"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// TestWorkerOnNodeKeyWaitsForDispatcher: compose starts processes in any
// order. A worker on its node key may not create streams, so started before
// any dispatcher it must wait (saying so) rather than exit, and serve once a
// dispatcher has created the topology.
func TestWorkerOnNodeKeyWaitsForDispatcher(t *testing.T) {
	requireBinaries(t, "dispatcher", "worker")
	c := harness.New(t)
	keys := c.EnableAuth("node-1")
	c.StartNATS()
	c.StartRedis()
	models := filepath.Join(t.TempDir(), "models.yaml")
	if err := os.WriteFile(models, []byte("models:\n  - name: ok\n    types: [classify]\n    executor: sim\n    sim: {latency: {dist: uniform, min: 1ms, max: 2ms}, failure_rate: 0}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	w := c.StartWorker(harness.WorkerOptions{NodeID: "node-1", ModelsFile: models, NoWait: true})

	want := "waiting for the dispatcher to create stream " + topology.StreamTasks
	harness.Eventually(t, harness.ReadyTimeout, "the worker says it waits for the dispatcher", func() error {
		if !w.Running() {
			return fmt.Errorf("the worker exited:\n%s", w.Logs())
		}
		if !strings.Contains(w.Logs(), want) {
			return fmt.Errorf("no %q in the worker's log yet", want)
		}
		return nil
	})

	d := c.StartDispatcher(harness.DispatcherOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	harness.Eventually(t, harness.ReadyTimeout, "the dispatcher sees node-1", func() error {
		if !w.Running() {
			return fmt.Errorf("the worker exited:\n%s", w.Logs())
		}
		r, err := d.Stats(ctx)
		if err != nil {
			return err
		}
		if len(r.Nodes) != 1 {
			return fmt.Errorf("the dispatcher knows %d nodes", len(r.Nodes))
		}
		return nil
	})

	cl, err := client.Dial(keys.Role(c, authconf.Producer, ""))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := cl.Submit(ctx, protocol.Task{ID: "after-wait", Type: "classify"}); err != nil {
		t.Fatal(err)
	}
	res, err := cl.Wait(ctx, "after-wait")
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != protocol.StatusSucceeded || res.Node != "node-1" {
		t.Fatalf("result %+v, want succeeded on node-1", res)
	}
}

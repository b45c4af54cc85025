package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mlsched/mlsched/e2e/harness"
	"github.com/mlsched/mlsched/shared/client"
	"github.com/mlsched/mlsched/shared/protocol"
)

// TestTasksWaitForNodesAnnouncingAfterAReconnect: the chaos failure of seed
// 29198843. After nats-server was killed and restarted, some types' nodes
// had announced themselves again and others not yet, and the valid tasks
// of the latter beyond MLSCHED_UNSERVED_MAX were rejected at once as
// no_model. For twice the node TTL after its NATS connection comes back a
// dispatcher now keeps every task waiting for a node, as while none is
// live: here a node of type x is back, the one of type y starts after the
// reconnect (and is seen once the registry re-reads its bucket, which the
// restart emptied), and all six y tasks succeed, none refused (with the
// old rule four were rejected).
func TestTasksWaitForNodesAnnouncingAfterAReconnect(t *testing.T) {
	requireBinaries(t, "dispatcher", "worker")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := harness.New(t)
	n := c.StartNATS()
	c.StartRedis()
	dir := t.TempDir()
	models := func(name, typ string) string {
		p := filepath.Join(dir, name+".yaml")
		spec := fmt.Sprintf("models:\n  - name: %s\n    types: [%s]\n    executor: sim\n    sim: {latency: {dist: uniform, min: 1ms, max: 2ms}, failure_rate: 0}\n", name, typ)
		if err := os.WriteFile(p, []byte(spec), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ttl := map[string]string{"MLSCHED_NODE_TTL": "10s"}
	d := c.StartDispatcher(harness.DispatcherOptions{Env: map[string]string{
		"MLSCHED_NODE_TTL": "10s", "MLSCHED_UNSERVED_MAX": "2", "MLSCHED_NO_NODE_WAIT": "60s"}})
	c.StartWorker(harness.WorkerOptions{NodeID: "rx", ModelsFile: models("mx", "x"), Env: ttl})
	sees := func(node string) func() error {
		return func() error {
			r, err := d.Stats(ctx)
			if err != nil {
				return err
			}
			if !slices.ContainsFunc(r.Nodes, func(hb protocol.Heartbeat) bool { return hb.Node == node }) {
				return fmt.Errorf("node %s not live (%d live)", node, len(r.Nodes))
			}
			return nil
		}
	}
	harness.Eventually(t, harness.ReadyTimeout, "the dispatcher sees node rx", sees("rx"))

	n.Kill()
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, harness.ReadyTimeout, "the dispatcher sees node rx after the reconnect", sees("rx"))

	_, js := c.Connect(nats.Name("e2e-reconnect"))
	cl := client.New(js)
	defer cl.Close()
	var ids []string
	for i := range 6 {
		id := fmt.Sprintf("y-%d", i)
		ids = append(ids, id)
		if _, err := cl.Submit(ctx, protocol.Task{ID: id, Type: "y", Payload: json.RawMessage(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	harness.Eventually(t, harness.ReadyTimeout, "the six y tasks waiting for a node", func() error {
		r, err := d.Stats(ctx)
		if err != nil {
			return err
		}
		if r.Unserved+int(r.Counters["unserved_refused"]) < len(ids) {
			return fmt.Errorf("%d waiting, %d refused", r.Unserved, r.Counters["unserved_refused"])
		}
		return nil
	})
	c.StartWorker(harness.WorkerOptions{NodeID: "ry", ModelsFile: models("my", "y"), Env: ttl})
	if err := cl.WaitAll(ctx, ids, func(r *protocol.Result) {
		if r.Status != protocol.StatusSucceeded {
			t.Errorf("%s: %s %s: %s", r.ID, r.Status, r.ErrorCode, r.Error)
		}
	}); err != nil {
		t.Fatal(err)
	}
	r, err := d.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := r.Counters["unserved_refused"]; n != 0 {
		t.Fatalf("%d tasks refused a place while the nodes were announcing themselves after a reconnect, want 0", n)
	}
}

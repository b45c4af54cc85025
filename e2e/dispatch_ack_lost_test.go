package e2e

import (
	"bytes"
	"context"
	"errors"
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

// TestDispatchAckLostIsNotRunAgain is issue 45's extra runs on real
// processes. In make chaos-cluster plain tasks ran 4 times with
// max_attempts 3: an ack of a dispatch lost in a cluster fault leaves the
// dispatch in MLSCHED_DISPATCH, delivered to its node again at every ack
// wait until the sweeper deletes it after its deadline, and the node ran
// every delivery. Here the ack is lost for certain: the dispatcher acks a
// directly reported success's dispatch for the worker, and the server
// refuses that ack (the dispatcher's permission to ack MLSCHED_DISPATCH is
// taken out of auth.conf), while the dispatcher answers the worker that it
// did. The task's result is stored once; its dispatch comes back after the
// worker's 1s ack wait, and the worker must ack it without running the
// task again.
func TestDispatchAckLostIsNotRunAgain(t *testing.T) {
	requireBinaries(t, "dispatcher", "worker", "nats-server")
	t.Parallel()
	c := harness.New(t)
	keys := c.EnableAuth("node-1")
	conf := filepath.Join(keys.Dir, authconf.ConfFile)
	b, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	ack := []byte(`"$JS.ACK.` + topology.StreamDispatch + `.>"`)
	if !bytes.Contains(b, ack) {
		t.Fatalf("auth.conf gives no role %s to take away:\n%s", ack, b)
	}
	if err := os.WriteFile(conf, bytes.ReplaceAll(b, ack, []byte(`"mlsched.e2e.no-dispatch-acks"`)), 0o600); err != nil {
		t.Fatal(err)
	}
	c.StartNATS()
	models := filepath.Join(t.TempDir(), "models.yaml")
	if err := os.WriteFile(models, []byte("models:\n  - name: ok\n    types: [classify]\n    executor: sim\n    sim: {latency: {dist: uniform, min: 1ms, max: 2ms}, failure_rate: 0}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c.StartDispatcher(harness.DispatcherOptions{})
	w := c.StartWorker(harness.WorkerOptions{NodeID: "node-1", ModelsFile: models,
		Env: map[string]string{"MLSCHED_ACK_WAIT": "1s", "MLSCHED_LOG_LEVEL": "debug"}})

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl, err := client.Dial(keys.Role(c, authconf.Producer, ""))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	const id = "ack-lost-1"
	if _, err := cl.Submit(ctx, protocol.Task{ID: id, Type: "classify"}); err != nil {
		t.Fatal(err)
	}
	res, err := cl.Wait(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != protocol.StatusSucceeded || res.Attempts != 1 {
		t.Fatalf("result %+v", res)
	}

	_, js := c.Conn()
	dispatches := func() (uint64, error) {
		s, err := js.Stream(ctx, topology.StreamDispatch)
		if err != nil {
			return 0, err
		}
		info, err := s.Info(ctx)
		if err != nil {
			return 0, err
		}
		return info.State.Msgs, nil
	}
	runs := func() int {
		r := newRunCounts()
		r.add(w.Logs())
		return r.byTask[id]
	}
	// The dispatch stays (its ack refused) until the worker acks one of
	// its redeliveries, or the task runs again.
	harness.Eventually(t, 30*time.Second, "the redelivered dispatch acked by the worker, or run again", func() error {
		if runs() > 1 {
			return nil
		}
		n, err := dispatches()
		if err != nil {
			return err
		}
		if n != 0 || !strings.Contains(w.Logs(), "acked, not run again") {
			return errors.New("the dispatch is still stored")
		}
		return nil
	})
	if n := runs(); n != 1 {
		r := newRunCounts()
		r.add(w.Logs())
		t.Fatalf("%s ran %d times for its one attempt: %v", id, n, r.runs(id))
	}
}

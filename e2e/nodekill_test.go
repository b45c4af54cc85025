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

// TestWorkerKillFailsOverWithinTheNodeTTL is issue 39's dead worker, on real
// processes at their defaults (node TTL 10 s, task timeout 30 s): a worker
// running 40 tasks of a model with a 30 s timeout (they take 25 s there) is
// killed with SIGKILL; another node hosts the same model. Every one of the 40
// has its result within the node TTL + 5 s of the kill (not at its 30 s
// deadline), its first attempt recorded node_lost, and the model's timeout
// and error counts do not move: a node's death is the node's fault.
func TestWorkerKillFailsOverWithinTheNodeTTL(t *testing.T) {
	requireBinaries(t, "dispatcher", "worker")
	const inFlight, ttl = 40, 10 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := harness.New(t)
	c.StartNATS()
	c.StartRedis()
	dir := t.TempDir()
	models := func(node, latency string) string {
		p := filepath.Join(dir, node+".yaml")
		spec := fmt.Sprintf("models:\n  - name: m\n    types: [k]\n    executor: sim\n    timeout: 30s\n"+
			"    sim: {latency: {dist: uniform, min: %s, max: %s}, failure_rate: 0}\n", latency, latency)
		if err := os.WriteFile(p, []byte(spec), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	d := c.StartDispatcher(harness.DispatcherOptions{})
	doomed := c.StartWorker(harness.WorkerOptions{NodeID: "doomed", ModelsFile: models("doomed", "25s"), Concurrency: 48})
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
	harness.Eventually(t, harness.ReadyTimeout, "the dispatcher sees the doomed node", sees("doomed"))

	_, js := c.Connect(nats.Name("e2e-nodekill"))
	cl := client.New(js)
	defer cl.Close()
	ids := make([]string, inFlight)
	for i := range ids {
		ids[i] = fmt.Sprintf("k-%d", i)
		if _, err := cl.Submit(ctx, protocol.Task{ID: ids[i], Type: "k", Payload: json.RawMessage(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	model := func() (protocol.ModelReport, error) {
		r, err := d.Stats(ctx)
		if err != nil {
			return protocol.ModelReport{}, err
		}
		for _, m := range r.Models {
			if m.Name == "m" {
				return m, nil
			}
		}
		return protocol.ModelReport{}, fmt.Errorf("model m not in the stats")
	}
	harness.Eventually(t, harness.ReadyTimeout, "40 tasks running on the doomed node", func() error {
		m, err := model()
		if err != nil {
			return err
		}
		if m.InFlight != inFlight {
			return fmt.Errorf("%d in flight", m.InFlight)
		}
		return nil
	})
	c.StartWorker(harness.WorkerOptions{NodeID: "spare", ModelsFile: models("spare", "2ms")})
	harness.Eventually(t, harness.ReadyTimeout, "the dispatcher sees the spare node", sees("spare"))

	killed := time.Now()
	doomed.Kill()
	var last time.Time
	if err := cl.WaitAll(ctx, ids, func(r *protocol.Result) {
		switch {
		case r.Status != protocol.StatusSucceeded:
			t.Errorf("%s: %s %s: %s", r.ID, r.Status, r.ErrorCode, r.Error)
		case len(r.History) != 2 || r.History[0].Status != protocol.OutcomeNodeLost:
			t.Errorf("%s's attempts %+v, want node_lost on the doomed node, then a success", r.ID, r.History)
		}
		if r.FinishedAt.After(last) {
			last = r.FinishedAt
		}
	}); err != nil {
		t.Fatal(err)
	}
	took := last.Sub(killed)
	t.Logf("the %d tasks of the killed worker: last result %.1fs after the kill (node TTL %v)", inFlight, took.Seconds(), ttl)
	if took > ttl+5*time.Second {
		t.Errorf("the last result came %v after the kill, want within the node TTL %v + 5s", took, ttl)
	}
	// The statistics are written in batches: wait for the 40 successes.
	var m protocol.ModelReport
	harness.Eventually(t, harness.ReadyTimeout, "the 40 successes in the statistics", func() (err error) {
		if m, err = model(); err == nil && m.Successes != inFlight {
			err = fmt.Errorf("%d successes", m.Successes)
		}
		return err
	})
	if m.Timeouts != 0 || m.ModelErrors != 0 {
		t.Errorf("model m blamed for its node's death: %d timeouts, %d model errors", m.Timeouts, m.ModelErrors)
	}
}

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/e2e/harness"
	"github.com/mlsched/mlsched/shared/client"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// The burst test's cluster, as measured in issue 9: the most reliable model
// (0.2% failures, 50 ms) on one node with 4 slots; a 1%/15 ms and a 10%/3 ms
// model on two nodes with 16 slots each.
const (
	burstBest = "best"
	burstMid  = "mid"
	burstWeak = "weak"
)

const burstModelsBest = `models:
  - name: best
    types: [classify]
    executor: sim
    sim: {latency: {dist: lognormal, median: 50ms, sigma: 0.2}, failure_rate: 0.002}
`

const burstModelsOthers = `models:
  - name: mid
    types: [classify]
    executor: sim
    sim: {latency: {dist: lognormal, median: 15ms, sigma: 0.2}, failure_rate: 0.01}
  - name: weak
    types: [classify]
    executor: sim
    sim: {latency: {dist: lognormal, median: 3ms, sigma: 0.2}, failure_rate: 0.10}
`

// TestBurstCapacity submits a burst against a cluster whose most reliable
// model has few slots, through two dispatcher replicas sharing Redis
// statistics. Before the load model, the best model got nearly every
// dispatch, queued them past their deadlines and first-attempt success over
// the second half of a 3000-task burst was 5.6%. The test asserts that
// every task has exactly one result and succeeded, that first-attempt
// success over the second half is far above that, and that the small node
// was not oversubscribed by the two replicas: nothing expired in its queue,
// no attempt on it timed out or was lost, its breaker stayed closed. It
// reports the figures.
//
// make test runs 600 tasks; MLSCHED_BURST_TASKS=3000 is the issue's
// measurement (MLSCHED_BURST_REPLICAS sets the dispatcher replicas, 2).
func TestBurstCapacity(t *testing.T) {
	requireBinaries(t, "dispatcher", "worker")
	n := envInt(t, "MLSCHED_BURST_TASKS", 600)
	replicas := envInt(t, "MLSCHED_BURST_REPLICAS", 2)
	c := harness.New(t)
	c.StartNATS()
	c.StartRedis()
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	bestFile, othersFile := write("best.yaml", burstModelsBest), write("others.yaml", burstModelsOthers)
	var ds []*harness.Dispatcher
	for range replicas {
		ds = append(ds, c.StartDispatcher(harness.DispatcherOptions{Env: map[string]string{
			"MLSCHED_TASK_TIMEOUT": "2s",
			"MLSCHED_NODE_TTL":     "10s",
		}}))
	}
	c.StartWorker(harness.WorkerOptions{NodeID: "n1", ModelsFile: bestFile, Concurrency: 4, SimSeed: 11})
	c.StartWorker(harness.WorkerOptions{NodeID: "n2", ModelsFile: othersFile, Concurrency: 16, SimSeed: 12})
	c.StartWorker(harness.WorkerOptions{NodeID: "n3", ModelsFile: othersFile, Concurrency: 16, SimSeed: 13})

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	waitSeesNodes(ctx, t, ds, 3)
	// The registry knowing the nodes is not enough: a replica decides on
	// the table its next snapshot refresh builds. A burst sent before that
	// found no node, filled the room for tasks waiting for one
	// (MLSCHED_UNSERVED_MAX) and had the rest rejected (no_model).
	for _, d := range ds {
		waitTableRefreshed(ctx, t, d)
	}

	_, js := c.Connect(nats.Name("e2e-burst"))
	cl := client.New(js)
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("burst-%05d", i)
	}
	// The burst: 8 producers submitting as fast as they can.
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for p := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := p; i < n; i += 8 {
				if _, err := cl.Submit(ctx, protocol.Task{ID: ids[i], Type: "classify", Payload: json.RawMessage(`{}`)}); err != nil {
					errs <- fmt.Errorf("submit %s: %w", ids[i], err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	submitted := time.Since(start)
	results := make(map[string]*protocol.Result, n)
	if err := cl.WaitAll(ctx, ids, func(r *protocol.Result) { results[r.ID] = r }); err != nil {
		t.Fatalf("waiting for results: %v (have %d of %d)", err, len(results), n)
	}
	took := time.Since(start)

	// Exactly one stored result per task: nothing lost, nothing duplicated.
	rs, err := js.Stream(ctx, topology.StreamResults)
	if err != nil {
		t.Fatal(err)
	}
	info, err := rs.Info(ctx, jetstream.WithSubjectFilter(topology.SubjectResultsAll))
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != uint64(n) || len(info.State.Subjects) != n || info.State.NumDeleted != 0 {
		t.Errorf("results stream: %d messages on %d subjects (%d deleted), want %d on %d",
			info.State.Msgs, len(info.State.Subjects), info.State.NumDeleted, n, n)
	}
	for subj, k := range info.State.Subjects {
		if k != 1 {
			t.Errorf("%s holds %d results", subj, k)
		}
	}

	// First-attempt success over the second half, by submission order.
	var firstOK, secondHalf, failed int
	perModel := map[string]int{}
	var bestExpired, bestTimedOut int
	for i, id := range ids {
		r := results[id]
		if r == nil {
			t.Fatalf("no result for %s", id)
		}
		if r.Status != protocol.StatusSucceeded {
			failed++
			t.Logf("%s %s (%s): %s", id, r.Status, r.ErrorCode, r.Error)
		}
		for _, a := range attempts(r) {
			perModel[a.Model]++
			if a.Node == "n1" {
				switch a.Status {
				case protocol.OutcomeExpired:
					bestExpired++
				case protocol.OutcomeTimeout, protocol.OutcomeLost:
					bestTimedOut++
				}
			}
		}
		if i >= n/2 {
			secondHalf++
			if h := attempts(r); len(h) > 0 && h[0].Status == protocol.OutcomeSuccess {
				firstOK++
			}
		}
	}
	share := float64(firstOK) / float64(secondHalf)
	var saturated, lost int64
	breaker := ""
	for _, d := range ds {
		r, err := d.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		saturated += r.Counters["saturated"]
		lost += r.Counters["lost"]
		for _, m := range r.Models {
			if m.Name == burstBest {
				breaker = m.Breaker
			}
		}
	}
	t.Logf("burst of %d tasks through %d replicas: submitted in %v, all results in %v", n, replicas, submitted.Round(time.Millisecond), took.Round(time.Millisecond))
	t.Logf("first-attempt success over the second half: %.2f%% (%d of %d); failed %d; attempts per model %v; held back (saturated) %d; lost %d; on n1: %d expired, %d timed out; best's breaker %s",
		100*share, firstOK, secondHalf, failed, perModel, saturated, lost, bestExpired, bestTimedOut, breaker)

	if failed > 0 {
		t.Errorf("%d tasks did not succeed", failed)
	}
	// Was 5.6% before the load model; round-robin gets about 92%. The bar
	// is generous: the machine running the test may be slow and shared.
	if share < 0.80 {
		t.Errorf("first-attempt success over the second half %.2f%%, want far above the 5.6%% of before (>= 80%%)", 100*share)
	}
	if bestExpired > 0 || bestTimedOut > 0 || lost > 0 {
		t.Errorf("the small node was oversubscribed: %d attempts expired in its queue, %d timed out or were lost there, %d lost in all",
			bestExpired, bestTimedOut, lost)
	}
	if breaker != "" && breaker != "closed" {
		t.Errorf("best model's breaker is %s, want closed", breaker)
	}
	if perModel[burstBest] == 0 || perModel[burstMid] == 0 {
		t.Errorf("attempts per model %v: want the best model used and the rest spilled to %s", perModel, burstMid)
	}
}

// envInt reads a positive integer from the environment, or def.
func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// waitSeesNodes waits until every replica's registry knows n nodes.
func waitSeesNodes(ctx context.Context, t *testing.T, ds []*harness.Dispatcher, n int) {
	t.Helper()
	for _, d := range ds {
		harness.Eventually(t, harness.ReadyTimeout, fmt.Sprintf("%s sees %d nodes", d.Name, n), func() error {
			r, err := d.Stats(ctx)
			if err != nil {
				return err
			}
			if len(r.Nodes) != n {
				return fmt.Errorf("%s knows %d nodes", d.Name, len(r.Nodes))
			}
			return nil
		})
	}
}

// waitTableRefreshed waits until d's routing table was rebuilt after now:
// a snapshot taken after now, then the next one (the table is stored after
// its snapshot).
func waitTableRefreshed(ctx context.Context, t *testing.T, d *harness.Dispatcher) {
	t.Helper()
	after := time.Now()
	for range 2 {
		harness.Eventually(t, harness.ReadyTimeout, d.Name+" refreshes its routing table", func() error {
			r, err := d.Stats(ctx)
			if err != nil {
				return err
			}
			if !r.SnapshotAt.After(after) {
				return fmt.Errorf("%s: last snapshot at %v", d.Name, r.SnapshotAt)
			}
			after = r.SnapshotAt
			return nil
		})
	}
}

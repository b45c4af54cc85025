package e2e

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/mlsched/mlsched/e2e/bench"
	"github.com/mlsched/mlsched/e2e/harness"
	"github.com/mlsched/mlsched/shared/client"
	"github.com/mlsched/mlsched/shared/protocol"
)

// Watching never holds up dispatching: while dashboard event streams stay
// open (half of them never read, like stalled browsers) and /metrics is
// scraped every 100ms, a load of tasks all finish, the reading streams keep
// getting updates and the listener keeps answering. What watching costs in
// throughput is measured by `mlsched-bench -scenarios mlsched,mlsched-observed`
// (a ratio in the same run, never asserted here).
func TestWatchingDoesNotBlockDispatch(t *testing.T) {
	t.Parallel()
	requireBinaries(t, "dispatcher", "worker")
	c := harness.New(t)
	c.StartNATS()
	c.StartRedis()
	d := c.StartDispatcher(harness.DispatcherOptions{Env: map[string]string{"MLSCHED_DASHBOARD_REFRESH": "200ms"}})
	c.StartWorker(harness.WorkerOptions{NodeID: "watched", ModelsFile: "testdata/node-1.yaml", Concurrency: 32, SimSeed: 5})
	base, err := d.HTTPURL()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	obs, st, err := bench.StartObservers(ctx, base, 6, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	_, js := c.Connect()
	cl := client.New(js)
	const n = 3000
	tasks := make([]protocol.Task, n)
	ids := make([]string, n)
	for i := range tasks {
		tasks[i] = protocol.Task{ID: fmt.Sprintf("watched-%d", i), Type: "classify"}
		ids[i] = tasks[i].ID
	}
	before := obs.Events()
	_, errs := cl.SubmitMany(ctx, tasks, 256)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("submit %s: %v", ids[i], err)
		}
	}
	results := map[protocol.Status]int{}
	if err := cl.WaitAll(ctx, ids, func(r *protocol.Result) { results[r.Status]++ }); err != nil {
		t.Fatalf("waiting for results while watched: %v (have %v)", err, results)
	}
	// The simulated models fail some attempts; failover makes nearly every
	// task succeed, and every task has exactly one final result.
	if total := results[protocol.StatusSucceeded] + results[protocol.StatusFailed]; total != n {
		t.Fatalf("results %v, want %d succeeded or failed", results, n)
	}
	harness.Eventually(t, 30*time.Second, "event streams still updated after the load", func() error {
		if got := obs.Events(); got <= before {
			return fmt.Errorf("reading streams got %d bytes, no more than the %d before the load", got, before)
		}
		return nil
	})
	res, err := http.Get(base + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("/healthz after the load: %d", res.StatusCode)
	}
	obs.Stop(&st)
	if st.Scrapes == 0 || st.Errors != 0 {
		t.Fatalf("scrapers: %d scrapes, %d errors", st.Scrapes, st.Errors)
	}
	t.Logf("while watched: %v; %d scrapes, %d KiB of events read", results, st.Scrapes, st.EventBytes>>10)
}

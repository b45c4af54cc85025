package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/dispatcher/stats/redisstats"
	"github.com/mlsched/mlsched/e2e/harness"
	"github.com/mlsched/mlsched/shared/client"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// restartShape is the issue-14 sequence: a warm-up, a run, redis-server
// killed with -9 and restarted empty, the same run again.
type restartShape struct {
	warmup, run, tries int
	reseed             bool
}

// TestRedisRestartKeepsLearning runs issue 14's sequence on processes: two
// thompson dispatchers, three workers, four models failing 20%, 5%, 1% and
// 0.2%; warm-up, a run, redis-server kill -9 and restart empty, the run
// again. The dispatchers re-seed Redis from their last snapshots, so the
// run after the restart chooses as well as the run before: first-attempt
// success within 0.5 pp, nothing lost, nothing duplicated.
//
// make test runs a short shape (warm-up 400, runs of 600) that checks
// nothing is lost or duplicated and that the learned counts are back right
// after the restart. The full shape (2000, 3000 and 3000) and the
// 0.5 pp target: MLSCHED_RESTART_FULL=1 (make redis-restart), with
// MLSCHED_RESTART_TRIES tries; MLSCHED_RESTART_RESEED=false measures the
// cost of a restart without re-seeding.
func TestRedisRestartKeepsLearning(t *testing.T) {
	requireBinaries(t, "dispatcher", "worker")
	shape := restartShape{warmup: 400, run: 600, tries: 1, reseed: true}
	full := os.Getenv("MLSCHED_RESTART_FULL") == "1"
	if full {
		shape.warmup, shape.run = 2000, 3000
	}
	if n, err := strconv.Atoi(os.Getenv("MLSCHED_RESTART_TRIES")); err == nil && n > 0 {
		shape.tries = n
	}
	if os.Getenv("MLSCHED_RESTART_RESEED") == "false" {
		shape.reseed = false
	}
	var summary []string
	for try := 1; try <= shape.tries; try++ {
		t.Run(fmt.Sprintf("try%d", try), func(t *testing.T) {
			before, after := runRestart(t, shape)
			line := fmt.Sprintf("try %d (re-seed %v): first-attempt success %.2f%% before the restart, %.2f%% after (%+.2f pp)",
				try, shape.reseed, before, after, after-before)
			summary = append(summary, line)
			t.Log(line)
			if full && shape.reseed && after < before-0.5 {
				t.Errorf("first-attempt success after the restart %.2f%% is more than 0.5 pp below %.2f%% before", after, before)
			}
		})
	}
	t.Logf("summary:\n%s", strings.Join(summary, "\n"))
}

func runRestart(t *testing.T, shape restartShape) (before, after float64) {
	c := harness.New(t)
	c.StartNATS()
	redis := c.StartRedis()
	env := map[string]string{"MLSCHED_STATS_RESEED": strconv.FormatBool(shape.reseed)}
	ds := []*harness.Dispatcher{
		c.StartDispatcher(harness.DispatcherOptions{Policy: "thompson", Env: env}),
		c.StartDispatcher(harness.DispatcherOptions{Policy: "thompson", Env: env}),
	}
	for i := range 3 {
		c.StartWorker(harness.WorkerOptions{NodeID: fmt.Sprintf("node-%d", i+1), ModelsFile: "testdata/restart/models.yaml",
			Concurrency: 8, SimSeed: int64(1000*i + 14)})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	waitSeesNodes(ctx, t, ds, 3)
	_, js := c.Connect(nats.Name("e2e-restart-producer"))
	seen := newResultCounter(ctx, t, js)
	cl := client.New(js)
	var all []string
	// phase runs n tasks and returns first-attempt success in percent over
	// all of them and over the first `head` in submission order, where the
	// cost of relearning shows most
	const head = 300
	phase := func(name string, n int) (rate, rateHead float64) {
		t.Helper()
		ids := make([]string, n)
		for i := range ids {
			ids[i] = fmt.Sprintf("%s-%05d", name, i)
			task := protocol.Task{ID: ids[i], Type: "score", Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))}
			if ack, err := cl.Submit(ctx, task); err != nil || ack.Duplicate {
				t.Fatalf("submit %s: %v (duplicate %v)", task.ID, err, ack.Duplicate)
			}
		}
		all = append(all, ids...)
		results := map[string]*protocol.Result{}
		err := cl.WaitAll(ctx, ids, func(r *protocol.Result) { results[r.ID] = r })
		if err != nil {
			t.Fatalf("%s: %v (%d of %d results)", name, err, len(results), n)
		}
		first, firstHead := 0, 0
		for i, id := range ids {
			r := results[id]
			if r == nil {
				t.Fatalf("%s: no result for %s", name, id)
			}
			if h := attempts(r); len(h) > 0 && h[0].Attempt == 1 && h[0].Status == protocol.OutcomeSuccess {
				first++
				if i < head {
					firstHead++
				}
			}
		}
		return 100 * float64(first) / float64(n), 100 * float64(firstHead) / float64(min(head, n))
	}
	learned := func() int64 { // judged outcomes the first dispatcher's snapshot holds
		r, err := ds[0].Stats(ctx)
		if err != nil {
			return -1
		}
		var n int64
		for _, m := range r.Models {
			n += m.Successes + m.ModelErrors + m.Timeouts
		}
		return n
	}

	phase("warmup", shape.warmup)
	before, beforeHead := phase("before", shape.run)
	harness.Eventually(t, 30*time.Second, "statistics of every task recorded", func() error {
		if n := learned(); n < int64(shape.warmup+shape.run) {
			return fmt.Errorf("%d outcomes recorded", n)
		}
		return nil
	})
	had := learned()
	redis.Kill() // SIGKILL
	if err := redis.Start(); err != nil {
		t.Fatal(err)
	}
	if shape.reseed {
		// the replicas re-seed Redis: what they learned is back, as a
		// reader that remembers nothing sees it, before the next task
		fresh := redisstats.New(redis.Client(t), stats.Window{})
		harness.Eventually(t, 30*time.Second, "learned statistics back in Redis", func() error {
			snap, err := fresh.Snapshot(ctx)
			if err != nil {
				return err
			}
			var n int64
			for _, m := range snap.Models {
				n += m.Judged()
			}
			if n < had {
				return fmt.Errorf("%d outcomes in the store, %d before the restart", n, had)
			}
			return nil
		})
	}
	after, afterHead := phase("after", shape.run)
	t.Logf("first %d tasks of each run: first-attempt success %.2f%% before the restart, %.2f%% after", head, beforeHead, afterHead)

	// nothing lost, nothing duplicated: one live result and one stored
	// result per task
	harness.Eventually(t, 30*time.Second, "live results for every task", func() error {
		if n := seen.distinct(); n < len(all) {
			return fmt.Errorf("saw results of %d of %d tasks", n, len(all))
		}
		return nil
	})
	if d := seen.duplicates(); len(d) > 0 {
		t.Errorf("duplicate results: %v", d)
	}
	stream, err := js.Stream(ctx, topology.StreamResults)
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(topology.SubjectResultsAll))
	if err != nil {
		t.Fatal(err)
	}
	if len(info.State.Subjects) != len(all) {
		t.Errorf("results stream holds %d subjects, want %d", len(info.State.Subjects), len(all))
	}
	for _, id := range all {
		if n := info.State.Subjects[topology.ResultSubject(id)]; n != 1 {
			t.Errorf("results stream holds %d messages for %s, want 1", n, id)
		}
	}
	if shape.reseed {
		reseeded := 0
		for _, d := range ds {
			reseeded += strings.Count(d.Logs(), "re-seeded it from this replica's last snapshot")
		}
		if reseeded == 0 {
			t.Error("no dispatcher logged a re-seed")
		}
	}
	t.Logf("%d tasks, 0 lost, %d duplicates; %d outcomes learned before the restart", len(all), len(seen.duplicates()), had)
	return before, after
}

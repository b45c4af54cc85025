package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/dispatcher/authconf"
	"github.com/mlsched/mlsched/e2e/harness"
	"github.com/mlsched/mlsched/shared/client"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
	"github.com/mlsched/mlsched/worker/model"
)

// The pipeline test's shape: four simulated models, named by how often they
// fail, spread over three nodes (testdata/node-*.yaml).
const (
	pipelineTasks = 2000
	// warmup tasks are submitted and finished before the rest, so that the
	// second half is decided on statistics of the first.
	pipelineWarmup = 1000
	model00        = "m-fail00"
	model02        = "m-fail02"
	model10        = "m-fail10"
	model30        = "m-fail30"
)

var pipelineModels = []string{model00, model02, model10, model30}

// TestPipeline runs the whole system as processes: nats-server on file
// storage, redis-server, one dispatcher and three workers, and submits 2000
// tasks of two types through the producer SDK. It checks that every task gets
// exactly one result, that the dispatcher's statistics account for exactly
// the attempts the results report, and that the policy learns to avoid the
// unreliable model.
func TestPipeline(t *testing.T) {
	requireBinaries(t, "dispatcher", "worker")
	for _, tc := range []struct {
		name, policy string
		auth         bool
	}{{"default", "", false}, {"thompson", "thompson", false}, {"role-credentials", "", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			runPipeline(t, tc.policy, false, tc.auth)
		})
	}
	// The same on a 3-node NATS cluster with R3 streams: clients get the
	// three URLs (through the harness's proxies).
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		runPipeline(t, "", true, false)
	})
}

// runPipeline runs the pipeline, on one NATS server or a 3-node cluster; with
// auth every process connects with its role's key under the auth.conf of
// `mlsched auth init`, and the producer submits and waits with the producer
// key, so a missing grant fails it.
func runPipeline(t *testing.T, policy string, cluster, auth bool) {
	c := harness.New(t)
	var keys *harness.Auth
	if auth {
		keys = c.EnableAuth("node-1", "node-2", "node-3")
	}
	if cluster {
		c.StartNATSCluster(harness.NATSClusterOptions{})
	} else {
		c.StartNATS()
	}
	c.StartRedis()
	d := c.StartDispatcher(harness.DispatcherOptions{Policy: policy, Env: map[string]string{
		"MLSCHED_SNAPSHOT_INTERVAL": "100ms",
		"MLSCHED_NODE_TTL":          "10s",
	}})
	for i, node := range []string{"node-1", "node-2", "node-3"} {
		c.StartWorker(harness.WorkerOptions{NodeID: node, ModelsFile: "testdata/" + node + ".yaml",
			Concurrency: 8, SimSeed: int64(100*i + 7)})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	// Route nothing before the dispatcher knows every node.
	harness.Eventually(t, harness.ReadyTimeout, "dispatcher sees 3 nodes", func() error {
		r, err := d.Stats(ctx)
		if err != nil {
			return err
		}
		if len(r.Nodes) != 3 {
			return fmt.Errorf("dispatcher knows %d nodes", len(r.Nodes))
		}
		return nil
	})

	_, js := c.Connect(nats.Name("e2e-producer"))
	seen := newResultCounter(ctx, t, js)

	cl := client.New(js)
	if keys != nil {
		var err error
		if cl, err = client.Dial(keys.Role(c, authconf.Producer, "")); err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
	}
	tasks := make([]protocol.Task, pipelineTasks)
	for i := range tasks {
		typ := "classify"
		if i%2 == 1 {
			typ = "embed"
		}
		tasks[i] = protocol.Task{ID: fmt.Sprintf("e2e-%04d", i), Type: typ, Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))}
	}
	results := map[string]*protocol.Result{}
	for _, phase := range [][]protocol.Task{tasks[:pipelineWarmup], tasks[pipelineWarmup:]} {
		ids := make([]string, len(phase))
		for i, task := range phase {
			ids[i] = task.ID
			ack, err := cl.Submit(ctx, task)
			if err != nil {
				t.Fatalf("submit %s: %v", task.ID, err)
			}
			if ack.Duplicate {
				t.Fatalf("submit %s: acknowledged as a duplicate", task.ID)
			}
		}
		err := cl.WaitAll(ctx, ids, func(r *protocol.Result) {
			if _, dup := results[r.ID]; dup {
				t.Errorf("WaitAll delivered %s twice", r.ID)
			}
			results[r.ID] = r
		})
		if err != nil {
			t.Fatalf("waiting for results: %v (have %d of %d)", err, len(results), len(tasks))
		}
	}

	// Outcomes and statistics.
	want := map[string]*protocol.ModelReport{}
	for _, m := range pipelineModels {
		want[m] = &protocol.ModelReport{Name: m}
	}
	hosts := nodeModels(t)
	late := map[string]int{} // attempts per model after warm-up
	var failed int
	failedIDs := map[string]bool{}
	for i, task := range tasks {
		r := results[task.ID]
		if r == nil {
			t.Fatalf("no result for %s", task.ID)
		}
		if r.ID != task.ID || r.Type != task.Type {
			t.Errorf("result for %s/%s names %s/%s", task.ID, task.Type, r.ID, r.Type)
		}
		switch r.Status {
		case protocol.StatusSucceeded:
		case protocol.StatusFailed:
			failed++
			failedIDs[r.ID] = true
			t.Logf("%s failed: %s; history %+v", r.ID, r.Error, r.History)
			if r.ErrorCode != protocol.CodeAttemptsExhausted {
				t.Errorf("%s failed with %s (%s), want %s", r.ID, r.ErrorCode, r.Error, protocol.CodeAttemptsExhausted)
			}
		default:
			t.Errorf("%s: status %q (%s: %s)", r.ID, r.Status, r.ErrorCode, r.Error)
		}
		for _, a := range attempts(r) {
			if !hosts[a.Node][a.Model] {
				t.Errorf("%s: attempt %d ran %s on %q, which does not host it", r.ID, a.Attempt, a.Model, a.Node)
			}
			mr := want[a.Model]
			if mr == nil {
				t.Errorf("%s: attempt %d on unknown model %q", r.ID, a.Attempt, a.Model)
				continue
			}
			mr.Dispatched++
			switch a.Status {
			case protocol.OutcomeSuccess:
				mr.Successes++
			case protocol.OutcomeModelError:
				mr.ModelErrors++
			case protocol.OutcomeTimeout, protocol.OutcomeLost:
				mr.Timeouts++
			case protocol.OutcomeTaskError:
				mr.TaskErrors++
			case protocol.OutcomeExpired, protocol.OutcomeNodeLost: // neither counts against the model
				mr.Expired++
			}
			if i >= pipelineWarmup {
				late[a.Model]++
			}
		}
	}
	// With max_attempts 3 and a model that never fails, a failed task means
	// the scheduler kept choosing bad models.
	if failed > pipelineTasks/100 {
		t.Errorf("%d of %d tasks failed", failed, pipelineTasks)
	}

	// Exactly one result per task: every result message seen live, and the
	// results stream.
	harness.Eventually(t, 30*time.Second, "live results for every task", func() error {
		if n := seen.distinct(); n < pipelineTasks {
			return fmt.Errorf("saw results of %d tasks", n)
		}
		return nil
	})
	stream, err := js.Stream(ctx, topology.StreamResults)
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(topology.SubjectResultsAll))
	if err != nil {
		t.Fatal(err)
	}
	if len(info.State.Subjects) != pipelineTasks {
		t.Errorf("results stream holds %d subjects, want %d", len(info.State.Subjects), pipelineTasks)
	}
	for _, task := range tasks {
		if n := info.State.Subjects[topology.ResultSubject(task.ID)]; n != 1 {
			t.Errorf("results stream holds %d messages for %s, want 1", n, task.ID)
		}
	}

	// The dispatcher's statistics account for exactly the attempts in the
	// results (they are recorded asynchronously: wait for them to settle).
	var got map[string]protocol.ModelReport
	sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
	defer scancel()
	statsErr := harness.WaitFor(sctx, func() error {
		r, err := d.Stats(ctx)
		if err != nil {
			return err
		}
		got = map[string]protocol.ModelReport{}
		for _, m := range r.Models {
			got[m.Name] = m
		}
		return diffStats(want, got)
	})
	if statsErr != nil {
		t.Errorf("statistics do not match the results: %v", statsErr)
	}
	// Every attempt has finished, so no model has any in flight: a leaked
	// gauge would skew least-loaded routing and capacity for ever.
	ictx, icancel := context.WithTimeout(ctx, 10*time.Second)
	defer icancel()
	if err := harness.WaitFor(ictx, func() error {
		r, err := d.Stats(ctx)
		if err != nil {
			return err
		}
		var leaked []string
		for _, m := range r.Models {
			if m.InFlight != 0 {
				leaked = append(leaked, fmt.Sprintf("%s=%d", m.Name, m.InFlight))
			}
		}
		if len(leaked) > 0 {
			return fmt.Errorf("in_flight %s", strings.Join(leaked, " "))
		}
		return nil
	}); err != nil {
		t.Errorf("in-flight gauges are not back to 0 after every task finished: %v", err)
	}

	if r, err := d.Stats(ctx); err != nil {
		t.Error(err)
	} else if r.Store != "redis" || r.Degraded || r.Dropped != 0 {
		t.Errorf("dispatcher store %q degraded=%v (%s) dropped=%d: want redis, healthy, nothing dropped",
			r.Store, r.Degraded, r.DegradedReason, r.Dropped)
	} else {
		var successes int64
		for _, m := range want {
			successes += m.Successes
		}
		// Successes went straight to the dispatcher (docs/protocol.md,
		// "Direct reports"); only a report unanswered in time would be
		// stored instead, and none was sent back.
		if r.Counters["reports"] == 0 || r.Counters["reports"] > successes || r.Counters["reports_deferred"] != 0 {
			t.Errorf("direct reports %d, sent back %d, for %d successes", r.Counters["reports"], r.Counters["reports_deferred"], successes)
		}
	}
	// Nothing was malformed: the dead letters are exactly the failed tasks.
	checkDeadLetters(ctx, t, js, failedIDs)
	if cluster { // the streams the dispatcher and workers created are R3
		for _, name := range []string{topology.StreamTasks, topology.StreamDispatch, topology.StreamOutcomes, topology.StreamResults} {
			s, err := js.Stream(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			info, err := s.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if info.Config.Replicas != 3 || info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
				t.Errorf("stream %s: %d replicas configured, cluster %+v; want 3 (a leader and 2 replicas)",
					name, info.Config.Replicas, info.Cluster)
			}
		}
	}

	// Only now, after everything settled: no task has a second stored result.
	if dups := seen.duplicates(); len(dups) > 0 {
		t.Errorf("%d tasks have more than one stored result, e.g. %v", len(dups), dups[:min(5, len(dups))])
	}
	if unknown := seen.unknown(tasks); len(unknown) > 0 {
		t.Errorf("results for tasks never submitted: %v", unknown)
	}

	total := 0
	for _, n := range late {
		total += n
	}
	t.Logf("policy %q: attempts after warm-up by model: %v (of %d); failed tasks: %d; stats: %s",
		policy, late, total, failed, statsLine(got))
	// The policy has learnt: the 30% model gets clearly less traffic than the
	// 2% one, and little in absolute terms.
	if late[model30] >= late[model02] && late[model30] > 0 {
		t.Errorf("after warm-up the 30%% model got %d attempts, the 2%% model %d: want clearly less", late[model30], late[model02])
	}
	if share := float64(late[model30]) / float64(total); share > 0.10 {
		t.Errorf("after warm-up the 30%% model got %.1f%% of the attempts, want at most 10%%", 100*share)
	}
	if share := float64(late[model00]+late[model02]) / float64(total); share < 0.75 {
		t.Errorf("after warm-up the two reliable models got %.1f%% of the attempts, want at least 75%%", 100*share)
	}
}

// checkDeadLetters reads the whole DLQ: every entry must be a task that
// exhausted its attempts, and every such task must have exactly one entry.
func checkDeadLetters(ctx context.Context, t *testing.T, js jetstream.JetStream, failed map[string]bool) {
	t.Helper()
	dlq, err := js.Stream(ctx, topology.StreamDLQ)
	if err != nil {
		t.Error(err)
		return
	}
	info, err := dlq.Info(ctx)
	if err != nil {
		t.Error(err)
		return
	}
	seen := map[string]int{}
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := dlq.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Error(err)
			return
		}
		var dl protocol.DeadLetter
		if err := json.Unmarshal(m.Data, &dl); err != nil {
			t.Errorf("dead letter %d is not a DeadLetter: %v", seq, err)
			continue
		}
		if dl.Code != protocol.CodeAttemptsExhausted || !failed[dl.TaskID] {
			t.Errorf("unexpected dead letter %d: task %q code %s: %s", seq, dl.TaskID, dl.Code, dl.Reason)
		}
		seen[dl.TaskID]++
	}
	for id := range failed {
		if seen[id] != 1 {
			t.Errorf("failed task %s has %d dead letters, want 1", id, seen[id])
		}
	}
}

// nodeModels reads which node hosts which model from testdata.
func nodeModels(t *testing.T) map[string]map[string]bool {
	t.Helper()
	out := map[string]map[string]bool{}
	for _, node := range []string{"node-1", "node-2", "node-3"} {
		specs, err := model.LoadFile("testdata/" + node + ".yaml")
		if err != nil {
			t.Fatal(err)
		}
		out[node] = map[string]bool{}
		for _, s := range specs {
			out[node][s.Name] = true
		}
	}
	return out
}

// attempts returns a result's attempts: its history, which ends with the
// final attempt (added from the result's own fields if it is missing).
func attempts(r *protocol.Result) []protocol.Attempt {
	out := append([]protocol.Attempt(nil), r.History...)
	for _, a := range out {
		if a.Attempt == r.Attempts && a.Model == r.Model {
			return out
		}
	}
	if r.Model != "" {
		st := protocol.OutcomeSuccess
		if r.Status != protocol.StatusSucceeded {
			st = protocol.OutcomeModelError
		}
		out = append(out, protocol.Attempt{Attempt: r.Attempts, Model: r.Model, Node: r.Node, Status: st})
	}
	return out
}

func diffStats(want map[string]*protocol.ModelReport, got map[string]protocol.ModelReport) error {
	var diffs []string
	for _, m := range pipelineModels {
		w, g := want[m], got[m]
		for _, f := range []struct {
			name      string
			want, got int64
		}{
			{"dispatched", w.Dispatched, g.Dispatched},
			{"successes", w.Successes, g.Successes},
			{"model_errors", w.ModelErrors, g.ModelErrors},
			{"timeouts", w.Timeouts, g.Timeouts},
			{"task_errors", w.TaskErrors, g.TaskErrors},
			{"expired", w.Expired, g.Expired},
		} {
			if f.want != f.got {
				diffs = append(diffs, fmt.Sprintf("%s %s: results say %d, statistics %d", m, f.name, f.want, f.got))
			}
		}
	}
	for name := range got {
		if want[name] == nil {
			diffs = append(diffs, fmt.Sprintf("statistics report unknown model %q", name))
		}
	}
	if len(diffs) > 0 {
		return fmt.Errorf("%s", strings.Join(diffs, "; "))
	}
	return nil
}

func statsLine(got map[string]protocol.ModelReport) string {
	var b strings.Builder
	for _, m := range pipelineModels {
		g := got[m]
		fmt.Fprintf(&b, "%s[disp=%d ok=%d err=%d rate=%.3f] ", m, g.Dispatched, g.Successes, g.ModelErrors, g.SuccessRate)
	}
	return b.String()
}

// resultCounter counts every stored result per task id, read through
// JetStream (an ordered consumer from the stream's start). A core-NATS
// subscriber would also see a result publish the stream refused (a
// redelivered task's second publish, refused by its expected sequence 0),
// and count as duplicate what no reader of results ever gets.
type resultCounter struct {
	mu     sync.Mutex
	counts map[string]int
}

// newResultCounter starts counting; it stops with the test.
func newResultCounter(ctx context.Context, t *testing.T, js jetstream.JetStream) *resultCounter {
	t.Helper()
	c := &resultCounter{counts: map[string]int{}}
	cons, err := js.OrderedConsumer(ctx, topology.StreamResults, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverAllPolicy})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) { c.observe(m.Subject()) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cc.Stop)
	return c
}

func (c *resultCounter) observe(subject string) {
	id := strings.TrimPrefix(subject, topology.ResultSubject(""))
	c.mu.Lock()
	c.counts[id]++
	c.mu.Unlock()
}

func (c *resultCounter) distinct() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.counts)
}

func (c *resultCounter) duplicates() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for id, n := range c.counts {
		if n > 1 {
			out = append(out, fmt.Sprintf("%s×%d", id, n))
		}
	}
	sort.Strings(out)
	return out
}

func (c *resultCounter) unknown(tasks []protocol.Task) []string {
	known := make(map[string]bool, len(tasks))
	for _, t := range tasks {
		known[t.ID] = true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for id := range c.counts {
		if !known[id] {
			out = append(out, id)
		}
	}
	sort.Strings(out)
	return out
}

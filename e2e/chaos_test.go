package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/e2e/harness"
	"github.com/mlsched/mlsched/shared/client"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// Environment variables of the chaos test (read by the test, not passed to
// the processes).
const (
	// EnvChaosTasks is how many tasks to submit (default 2000; make chaos: 20000).
	EnvChaosTasks = "MLSCHED_CHAOS_TASKS"
	// EnvChaosSeed replays a run's fault schedule and simulated models
	// (default: a random seed, printed).
	EnvChaosSeed = "MLSCHED_CHAOS_SEED"
	// EnvChaosRate is the submission rate in tasks/s (default 100): the run
	// submits for Tasks/Rate seconds and the faults fall in that window.
	EnvChaosRate = "MLSCHED_CHAOS_RATE"
	// EnvChaosRounds is how many times each of the five faults is injected
	// (default Tasks/4000, at least 1).
	EnvChaosRounds = "MLSCHED_CHAOS_ROUNDS"
)

var chaosNodes = []string{"chaos-1", "chaos-2", "chaos-3", "chaos-4"}

const chaosMaxAttempts = 3

// Short timeouts so that lost attempts are found fast.
var (
	chaosDispatcherEnv = map[string]string{
		"MLSCHED_TASK_TIMEOUT":      "1s",
		"MLSCHED_DEADLINE_SLACK":    "2s",
		"MLSCHED_SWEEP_INTERVAL":    "250ms",
		"MLSCHED_NODE_TTL":          "3s",
		"MLSCHED_MAX_ATTEMPTS":      strconv.Itoa(chaosMaxAttempts),
		"MLSCHED_ACK_WAIT":          "5s", // a killed dispatcher's messages come back after 5s
		"MLSCHED_SNAPSHOT_INTERVAL": "100ms",
	}
	chaosWorkerEnv = map[string]string{
		// The worker announces its default timeout for models that set
		// none, and the dispatcher prefers an announced timeout to its own
		// MLSCHED_TASK_TIMEOUT: both must say 1s.
		"MLSCHED_DEFAULT_TIMEOUT": "1s",
		// Each run is logged at debug ("running the task"): the workers
		// count a task's runs, which max_attempts must bound (issue 39).
		"MLSCHED_LOG_LEVEL":          "debug",
		"MLSCHED_NODE_TTL":           "3s",
		"MLSCHED_HEARTBEAT_INTERVAL": "500ms",
		"MLSCHED_ACK_WAIT":           "4s",
		"MLSCHED_SHUTDOWN_GRACE":     "2s",
	}
)

type chaosParams struct {
	Tasks  int
	Seed   int64
	Rate   float64
	Rounds int
}

// chaosParamsFromEnv reads the run's parameters; roundTasks is how many
// tasks make one round of faults when EnvChaosRounds is unset.
func chaosParamsFromEnv(t *testing.T, cv chaosVariant) chaosParams {
	t.Helper()
	p := chaosParams{Tasks: 2000, Seed: int64(rand.Uint32()), Rate: 100}
	if cv.tasks > 0 {
		p.Tasks = cv.tasks
	}
	if cv.rate > 0 {
		p.Rate = cv.rate
	}
	num := func(name string, set func(string) error) {
		if v := os.Getenv(name); v != "" {
			if err := set(v); err != nil {
				t.Fatalf("%s=%q: %v", name, v, err)
			}
		}
	}
	num(EnvChaosTasks, func(v string) (err error) { p.Tasks, err = strconv.Atoi(v); return })
	num(EnvChaosSeed, func(v string) (err error) { p.Seed, err = strconv.ParseInt(v, 10, 64); return })
	num(EnvChaosRate, func(v string) (err error) { p.Rate, err = strconv.ParseFloat(v, 64); return })
	num(EnvChaosRounds, func(v string) (err error) { p.Rounds, err = strconv.Atoi(v); return })
	if p.Tasks < 100 || p.Rate <= 0 || p.Rounds < 0 {
		t.Fatalf("chaos parameters out of range: %+v", p)
	}
	if p.Rounds == 0 {
		p.Rounds = max(1, p.Tasks/cv.roundTasks)
	}
	return p
}

// TestChaos runs the whole system as processes (nats-server on file storage,
// redis-server, 2 dispatchers, 4 workers hosting 5 simulated models of 0-30%
// failure) under a seeded schedule of faults: kill -9 of a worker and of a
// dispatcher (each restarted), restarts of nats-server and of redis-server,
// kill -9 of nats-server (losing the in-memory dispatch and outcome streams),
// while a producer submits tasks through the SDK, re-submitting with the
// same id whatever failed. It then checks that every task has exactly one
// final result that never changed, that no task failed while a healthy model
// and attempts remained, and that bad input was rejected or dead-lettered.
//
// The short run (2000 tasks) is part of `make test`; `make chaos` runs
// 20000. MLSCHED_CHAOS_SEED replays a schedule.
//
// Not parallel: each attempt has 3s (timeout and slack, kept short so that
// lost attempts are found fast), and sharing the machine's two cores with
// another e2e test (the model servers' training, Chromium, a pipeline)
// pushed the queueing past that under a busy machine: attempts expired,
// were retried, added load, and 352 of 1976 tasks exhausted their attempts.
// Run alone it is a test of faults, not of the machine's spare CPU.
func TestChaos(t *testing.T) {
	requireBinaries(t, "dispatcher", "worker", "nats-server")
	runChaos(t, chaosVariant{kinds: faultKinds, roundTasks: 4000})
}

// chaosVariant is what differs between the chaos runs.
type chaosVariant struct {
	// natsNodes > 0 runs a NATS cluster of that many servers (R3 streams)
	// instead of one server.
	natsNodes int
	kinds     []faultKind
	// roundTasks is how many tasks make one round of faults by default.
	roundTasks int
	// dispatcherEnv overrides chaosDispatcherEnv, workerEnv chaosWorkerEnv.
	dispatcherEnv, workerEnv map[string]string
	// tasks and rate replace the defaults (2000 tasks at 100/s) unless
	// the environment sets them.
	tasks int
	rate  float64
	// watchOutage reads every dispatcher's /readyz and /metrics during the
	// run and logs how long a node outage showed there.
	watchOutage bool
}

func runChaos(t *testing.T, cv chaosVariant) *outageSeen {
	p := chaosParamsFromEnv(t, cv)
	window := time.Duration(float64(p.Tasks) / p.Rate * float64(time.Second))
	schedule := chaosScheduleOf(cv.kinds, p.Seed, p.Rounds, window, len(chaosNodes), 2, max(1, cv.natsNodes))
	t.Logf("chaos: seed %d (replay with %s=%d), %d tasks at %.0f/s over %v, %d faults",
		p.Seed, EnvChaosSeed, p.Seed, p.Tasks, p.Rate, window, len(schedule))
	for _, f := range schedule {
		t.Logf("chaos: scheduled %v", f)
	}
	models, err := loadChaosModels("testdata/chaos", chaosNodes)
	if err != nil {
		t.Fatal(err)
	}

	c := harness.New(t)
	if cv.natsNodes > 0 {
		c.StartNATSCluster(harness.NATSClusterOptions{Nodes: cv.natsNodes})
	} else {
		c.StartNATS()
	}
	c.StartRedis()
	var disps []*harness.Dispatcher
	for range 2 {
		disps = append(disps, c.StartDispatcher(harness.DispatcherOptions{Env: mergeEnv(chaosDispatcherEnv, cv.dispatcherEnv)}))
	}
	var workers []*harness.Worker
	for i, node := range chaosNodes {
		workers = append(workers, c.StartWorker(harness.WorkerOptions{NodeID: node,
			ModelsFile: "testdata/chaos/" + node + ".yaml", Concurrency: 8,
			SimSeed: p.Seed*10 + int64(i) + 1, Env: mergeEnv(chaosWorkerEnv, cv.workerEnv)}))
	}
	// Budget: submission window, the faults' down times, then the tail.
	budget := window + 3*time.Minute
	for _, f := range schedule {
		budget += f.Down
		if cv.natsNodes > 0 { // every cluster fault waits until the cluster is healthy again
			budget += time.Minute
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	waitSeesNodes(ctx, t, disps, len(chaosNodes))

	nc, js := c.Connect(nats.Name("chaos-producer"))
	if slices.Contains(cv.kinds, faultKillNATS) {
		// The fault is meant for attempt streams not on disk.
		for _, name := range []string{topology.StreamDispatch, topology.StreamOutcomes} {
			s, err := js.Stream(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			if st := s.CachedInfo().Config.Storage; st != jetstream.MemoryStorage {
				t.Fatalf("%s is on %v storage: the %s fault wants it in memory (MLSCHED_ATTEMPT_STORAGE=memory)", name, st, faultKillNATS)
			}
		}
	}
	// The producer group-commits as the dispatchers do: tasks and results
	// published while their stream is busy go in atomic batches.
	cl := client.New(js, client.WithGroupCommit(true))
	tasks := chaosTasks(p.Tasks)
	var ids []string
	for _, task := range tasks {
		if task.ID != "" {
			ids = append(ids, task.ID)
		}
	}

	// Observers, started before the first task: every stored result in
	// order (JetStream), every result publish on the wire (core NATS, which
	// also sees publishes the stream refused), the dispatchers' counters.
	audit := newResultAudit()
	auditCons, err := js.OrderedConsumer(ctx, topology.StreamResults, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverAllPolicy})
	if err != nil {
		t.Fatal(err)
	}
	var batched atomic.Int64 // results stored in an atomic batch (group commit)
	auditCC, err := auditCons.Consume(func(m jetstream.Msg) {
		if m.Headers().Get("Nats-Batch-Id") != "" {
			batched.Add(1)
		}
		audit.observe(m.Subject(), m.Data())
	})
	if err != nil {
		t.Fatal(err)
	}
	defer auditCC.Stop()
	var wire atomic.Int64
	wireSub, err := nc.Subscribe(topology.SubjectResultsAll, func(*nats.Msg) { wire.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	if err := wireSub.SetPendingLimits(-1, -1); err != nil {
		t.Fatal(err)
	}
	counters := newCounterTotals()
	pollCtx, stopPoll := context.WithCancel(ctx)
	var pollDone sync.WaitGroup
	pollDone.Go(func() { counters.poll(pollCtx, c, len(disps)) })
	seen := &outageSeen{}
	if cv.watchOutage {
		pollDone.Go(func() { seen.watch(pollCtx, disps) })
	}

	// Run: producer, faults and the SDK's WaitAll at once.
	start := time.Now()
	prod := &chaosProducer{cl: cl}
	chaos := &chaosRunner{c: c, js: js, workers: workers, disps: disps, counters: counters, start: start}
	var wg sync.WaitGroup
	var submitErr error
	wg.Go(func() { submitErr = prod.run(ctx, tasks, p.Rate, start) })
	wg.Go(func() { chaos.run(ctx, schedule) })
	results, waitErrs := waitAllResults(ctx, cl, ids)
	resultsAt := time.Since(start)
	wg.Wait()
	if submitErr != nil {
		t.Fatalf("producer: %v", submitErr)
	}
	for _, e := range chaos.errs {
		t.Errorf("fault injection: %v", e)
	}
	if len(results) != len(ids) {
		var missing []string
		for _, id := range ids {
			if results[id] == nil {
				missing = append(missing, id)
			}
		}
		rctx, rcancel := context.WithTimeout(context.Background(), 30*time.Second)
		for _, l := range inFlightReport(rctx, js) {
			t.Log("chaos: in flight: " + l)
		}
		rcancel()
		t.Fatalf("only %d of %d tasks have a result after %v (ctx %v); missing e.g. %v",
			len(results), len(ids), time.Since(start), ctx.Err(), missing[:min(10, len(missing))])
	}
	if len(chaos.done) != len(schedule) {
		t.Errorf("%d of %d faults were injected", len(chaos.done), len(schedule))
	}

	// Quiescence: nothing left in flight anywhere (the work-queue streams
	// are empty), so any late or duplicate result would have been written.
	dctx, dcancel := context.WithTimeout(ctx, 2*time.Minute)
	var orphans []string
	drainErr := harness.WaitFor(dctx, func() (err error) { orphans, err = drained(ctx, js); return err })
	dcancel()
	for _, o := range orphans {
		t.Logf("chaos: nats-server left an acknowledged message behind (not in flight, never delivered again): %s", o)
	}
	if drainErr != nil {
		t.Errorf("work-queue streams not drained: %v", drainErr)
		for _, l := range inFlightReport(ctx, js) {
			t.Log("chaos: left over: " + l)
		}
		t.FailNow()
	}
	elapsed := time.Since(start)

	// Exactly one final result per id, never changed: the stream holds one
	// message per id and never deleted one (MaxMsgsPerSubject=1 would have
	// deleted the first result had a second been stored), the ordered
	// consumer saw each id once, and what the SDK delivered is what is stored.
	rs, err := js.Stream(ctx, topology.StreamResults)
	if err != nil {
		t.Fatal(err)
	}
	var rinfo *jetstream.StreamInfo
	harness.Eventually(t, time.Minute, "the audit consumer read the results stream", func() error {
		if rinfo, err = rs.Info(ctx); err != nil {
			return err
		}
		if n := audit.messages(); uint64(n) < rinfo.State.Msgs {
			return fmt.Errorf("audit saw %d of %d results", n, rinfo.State.Msgs)
		}
		return nil
	})
	if rinfo.State.Msgs != uint64(len(ids)) || rinfo.State.NumDeleted != 0 {
		t.Errorf("results stream: %d messages, %d deleted; want %d and 0", rinfo.State.Msgs, rinfo.State.NumDeleted, len(ids))
	}
	for _, problem := range audit.check(ids, results) {
		t.Error(problem)
	}

	v := verifyResults(tasks, results, models, chaos.outages, chaosMaxAttempts)
	for i, problem := range v.Problems {
		if i == 50 {
			t.Errorf("… and %d more problems", len(v.Problems)-50)
			break
		}
		t.Error(problem)
	}
	good := v.Succeeded + v.Failed
	// With three attempts, failover and a model that never fails, only a few
	// tasks may fail (those whose attempts all met failures or faults).
	if v.Failed > good/50 {
		t.Errorf("%d of %d valid tasks failed: more than 2%%", v.Failed, good)
	}
	// A pipeline runs four such steps.
	if v.PipeFailed > 4*v.Pipelines/50 {
		t.Errorf("%d of %d pipelines failed: more than 8%%", v.PipeFailed, v.Pipelines)
	}

	// Bad input is never dropped: every task without id is in the DLQ with
	// its bytes, and every exhausted task has its dead letter.
	dlq := readDLQ(ctx, t, js)
	noID := 0
	for _, task := range tasks {
		if task.Kind != kindNoID {
			continue
		}
		noID++
		if !dlq.hasOriginal("invalid", task.Raw) {
			t.Errorf("task without id %s is not in %s: %s", task.MsgID, topology.StreamDLQ, task.Raw)
		}
	}
	for id, r := range results {
		if r.ErrorCode == protocol.CodeAttemptsExhausted && !dlq.tasks[id] {
			t.Errorf("%s exhausted its attempts but has no dead letter", id)
		}
	}

	stopPoll()
	pollDone.Wait()
	tot := counters.totals()
	logSuppressed, logLate := 0, 0
	for _, d := range disps {
		logs := d.Logs()
		logSuppressed += strings.Count(logs, "task already has a final result: suppressed a second one")
		logLate += strings.Count(logs, "late outcome of a superseded attempt")
	}
	runs := countRuns(workers)
	// A pipeline's steps share its id: each step may run max_attempts times
	// (an ensemble member beside a failed sibling too).
	for id, n := range runs.overBy(func(id string) int {
		if r := results[id]; r != nil && len(r.Steps) > 0 {
			return len(chaosRoute("x")) * chaosMaxAttempts
		}
		return chaosMaxAttempts
	}) {
		t.Errorf("%s ran %d times on the workers, more than max_attempts %d per step: %v", id, n, chaosMaxAttempts, runs.runs(id))
	}
	// Deliveries of a dispatch its node had, running or settled: left to
	// the run, or acked without one (worker/redelivered.go).
	leftToRun, ackedNoRun := 0, 0
	for _, w := range workers {
		logs := w.Logs()
		leftToRun += strings.Count(logs, "left to the delivery that runs it")
		ackedNoRun += strings.Count(logs, "acked, not run again")
	}
	plainRepeats := runs.repeated(func(id string) bool { r := results[id]; return r == nil || len(r.Steps) == 0 })
	if dups := audit.duplicates(); len(dups) > 0 {
		t.Errorf("stored results seen more than once: %v", dups[:min(10, len(dups))])
	}

	// The figures of the run.
	lines := []string{
		fmt.Sprintf("seed %d, %d tasks at %.0f/s, %d faults, all results after %.1fs, drained after %.1fs",
			p.Seed, p.Tasks, p.Rate, len(chaos.done), resultsAt.Seconds(), elapsed.Seconds()),
		fmt.Sprintf("submitted %d (%d with id: %d valid, %d bad; %d without id); submit retries %d, acknowledged as duplicates %d; WaitAll restarts %d",
			len(tasks), len(ids), good, v.Rejected, noID, prod.retries.Load(), prod.dupAcks.Load(), waitErrs),
		fmt.Sprintf("results: succeeded %d, failed %d (attempts exhausted %d, task error %d), rejected %d",
			v.Succeeded, v.Failed, v.FailedExhausted, v.FailedTaskError, v.Rejected),
		fmt.Sprintf("pipelines %d (4 steps each, the last two an ensemble's members in parallel; %d steps ran): succeeded %d, failed %d (each naming its step: at a step exhausted on its models' own failures %d, at a task error %d)",
			v.Pipelines, v.PipeSteps, v.PipeSucceeded, v.PipeFailed, v.PipeOwnModels, v.PipeTaskError),
		fmt.Sprintf("valid tasks and pipelines failed or rejected because of a fault: %d (must be 0); tasks exhausted on their own models' failures alone: %d",
			v.ByFault, v.OwnModels),
		fmt.Sprintf("dead-lettered %d (%s %d messages: invalid %d, exhausted %d, other %d)",
			dlq.total, topology.StreamDLQ, dlq.total, dlq.bySubject["invalid"], dlq.bySubject["exhausted"],
			dlq.total-dlq.bySubject["invalid"]-dlq.bySubject["exhausted"]),
		fmt.Sprintf("attempts by outcome: %v", v.Attempts),
		fmt.Sprintf("runs counted by the workers: %d for %d tasks, at most %d for one task (max_attempts %d); %d in batches of 2 or more; %d runs of a plain task's attempt that had run already",
			runs.total(), len(runs.byTask), runs.most(), chaosMaxAttempts, runs.batched, plainRepeats),
		fmt.Sprintf("dispatches delivered again to a node that had them: %d acked without a run (outcome settled), %d left to the delivery running them",
			ackedNoRun, leftToRun),
		fmt.Sprintf("dispatchers (admin stats, summed over runs; a run's last ~250ms before kill -9 is not seen): %v", tot),
		fmt.Sprintf("dispatcher logs: duplicates suppressed %d, late outcomes %d; result publishes on the wire %d for %d ids; %d results stored in atomic batches (group commit)",
			logSuppressed, logLate, wire.Load(), len(ids), batched.Load()),
		fmt.Sprintf("longest time a dispatcher saw no live node: %.1fs", counters.longestNoNode().Seconds()),
	}
	if cv.watchOutage {
		lines = append(lines, seen.String())
	}
	lines = append(lines, latencyLines(results)...)
	for _, o := range chaos.done {
		lines = append(lines, "fault "+o)
	}
	for _, l := range lines {
		t.Log("chaos: " + l)
	}
	return seen
}

var workQueues = []string{topology.StreamTasks, topology.StreamDispatch, topology.StreamOutcomes}

// drained reports whether nothing is left in flight: the work-queue streams
// keep a message until it is acknowledged, after its effects are stored.
//
// A message the stream's consumer has acknowledged (at or below its ack
// floor) is not in flight: nothing will ever deliver it again. nats-server
// is supposed to remove it, yet one acked during a graceful restart can stay
// behind (seen once: a task published and acked in the 50ms between SIGTERM
// and the server's shutdown stayed in MLSCHED_TASKS below an ack floor of
// 2000, its task long finished; the class of nats-server#5148 and #6159).
// Such messages do not count; drained returns them in orphans, to be logged.
func drained(ctx context.Context, js jetstream.JetStream) (orphans []string, err error) {
	for _, name := range workQueues {
		s, err := js.Stream(ctx, name)
		if err != nil {
			return nil, err
		}
		info, err := s.Info(ctx)
		if err != nil {
			return nil, err
		}
		st := info.State
		if st.Msgs == 0 {
			continue
		}
		if st.Msgs > 20 { // plainly in flight: not worth looking at each
			return nil, fmt.Errorf("%s holds %d messages", name, st.Msgs)
		}
		var consumers []*jetstream.ConsumerInfo
		for cl := s.ListConsumers(ctx); ; {
			ci, ok := <-cl.Info()
			if !ok {
				if err := cl.Err(); err != nil {
					return nil, err
				}
				break
			}
			consumers = append(consumers, ci)
		}
		for seq := st.FirstSeq; seq <= st.LastSeq; seq++ {
			m, err := s.GetMsg(ctx, seq)
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				continue // removed meanwhile, or a gap
			}
			if err != nil {
				return nil, err
			}
			var by *jetstream.ConsumerInfo
			for _, ci := range consumers {
				if consumerFilters(ci, m.Subject) {
					by = ci
					break
				}
			}
			if by == nil || seq > by.AckFloor.Stream {
				return nil, fmt.Errorf("%s holds %d messages", name, st.Msgs)
			}
			orphans = append(orphans, fmt.Sprintf("%s seq %d on %s (consumer %s acked up to %d): %.200s",
				name, seq, m.Subject, by.Name, by.AckFloor.Stream, m.Data))
		}
	}
	return orphans, nil
}

// consumerFilters reports whether ci's filter subjects take subject.
func consumerFilters(ci *jetstream.ConsumerInfo, subject string) bool {
	filters := ci.Config.FilterSubjects
	if ci.Config.FilterSubject != "" {
		filters = append(filters, ci.Config.FilterSubject)
	}
	if len(filters) == 0 {
		return true
	}
	for _, f := range filters {
		if subjectMatches(f, subject) {
			return true
		}
	}
	return false
}

// subjectMatches reports whether the NATS subject matches filter (with the
// * and > wildcards).
func subjectMatches(filter, subject string) bool {
	ft, st := strings.Split(filter, "."), strings.Split(subject, ".")
	for i, f := range ft {
		switch {
		case f == ">":
			return len(st) > i
		case i >= len(st):
			return false
		case f != "*" && f != st[i]:
			return false
		}
	}
	return len(ft) == len(st)
}

// inFlightReport describes what is left in the work-queue streams and their
// consumers, as evidence when the system does not settle.
func inFlightReport(ctx context.Context, js jetstream.JetStream) []string {
	var out []string
	for _, name := range workQueues {
		s, err := js.Stream(ctx, name)
		if err != nil {
			out = append(out, fmt.Sprintf("%s: %v", name, err))
			continue
		}
		info, err := s.Info(ctx)
		if err != nil {
			out = append(out, fmt.Sprintf("%s: %v", name, err))
			continue
		}
		st := info.State
		out = append(out, fmt.Sprintf("%s: %d messages, seq %d..%d", name, st.Msgs, st.FirstSeq, st.LastSeq))
		shown := 0
		for seq := st.FirstSeq; st.Msgs > 0 && seq <= st.LastSeq && shown < 5; seq++ {
			m, err := s.GetMsg(ctx, seq)
			if err != nil {
				continue
			}
			shown++
			out = append(out, fmt.Sprintf("  seq %d at %s on %s headers %v: %.300s", m.Sequence,
				m.Time.UTC().Format("15:04:05.000"), m.Subject, m.Header, m.Data))
		}
		for cl := s.ListConsumers(ctx); ; {
			ci, ok := <-cl.Info()
			if !ok {
				break
			}
			out = append(out, fmt.Sprintf("  consumer %s: delivered stream seq %d, ack floor %d, ack pending %d, redelivered %d, pending %d, waiting %d",
				ci.Name, ci.Delivered.Stream, ci.AckFloor.Stream, ci.NumAckPending, ci.NumRedelivered, ci.NumPending, ci.NumWaiting))
		}
	}
	return out
}

// latencyLines summarises submit-to-result latency and shows the slowest
// tasks, whose histories tell where a run spent its tail.
func latencyLines(results map[string]*protocol.Result) []string {
	rs := make([]*protocol.Result, 0, len(results))
	for _, r := range results {
		rs = append(rs, r)
	}
	if len(rs) == 0 {
		return nil
	}
	sort.Slice(rs, func(i, j int) bool { return rs[i].LatencyMs < rs[j].LatencyMs })
	q := func(f float64) float64 { return rs[min(len(rs)-1, int(f*float64(len(rs))))].LatencyMs / 1000 }
	out := []string{fmt.Sprintf("submit-to-result latency: p50 %.3fs, p99 %.2fs, max %.2fs", q(0.5), q(0.99), q(1))}
	for _, r := range rs[max(0, len(rs)-3):] {
		out = append(out, fmt.Sprintf("slow: %s %s after %.2fs, finished %s: %s", r.ID, r.Status, r.LatencyMs/1000,
			r.FinishedAt.Format("15:04:05.000"), historyString(r)))
	}
	return out
}

// chaosTasks builds the submissions: mostly valid tasks of two types, 10%
// of them pipelines of four steps (chaosPipeline), 1% published on the
// wrong type's subject (rejected), 0.2% without id (dead letters).
func chaosTasks(n int) []chaosTask {
	out := make([]chaosTask, n)
	for i := range out {
		typ := "classify"
		if i%2 == 1 {
			typ = "embed"
		}
		id := fmt.Sprintf("chaos-%05d", i)
		switch {
		case i%500 == 251:
			raw := fmt.Sprintf(`{"type":%q,"payload":{"n":%d,"bad":"no id"}}`, typ, i)
			out[i] = chaosTask{Type: typ, Kind: kindNoID, MsgID: "noid-" + id, Raw: []byte(raw)}
		case i%100 == 37:
			raw := fmt.Sprintf(`{"id":%q,"type":%q,"payload":{"n":%d}}`, id, typ, i)
			out[i] = chaosTask{ID: id, Type: typ, Kind: kindRejected, MsgID: id, Raw: []byte(raw)}
		case i%10 == 5: // 10%: a pipeline (chaosPipeline), two of three routed x
			kind := "x"
			if (i/10)%3 == 2 {
				kind = "y"
			}
			out[i] = chaosTask{ID: id, Type: typ, Kind: kindGood, MsgID: id, Pipe: kind}
		default:
			out[i] = chaosTask{ID: id, Type: typ, Kind: kindGood, MsgID: id}
		}
	}
	return out
}

// chaosProducer submits at a fixed rate and retries every failed submit
// with the same id until it is acknowledged: the deduplication by
// Nats-Msg-Id makes a retry of a stored task a no-op.
type chaosProducer struct {
	cl               *client.Client
	retries, dupAcks atomic.Int64
}

func (p *chaosProducer) run(ctx context.Context, tasks []chaosTask, rate float64, start time.Time) error {
	jobs := make(chan int)
	errc := make(chan error, 1)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := range jobs {
				if err := p.submit(ctx, tasks[i]); err != nil {
					select {
					case errc <- fmt.Errorf("task %d (%s): %w", i, tasks[i].MsgID, err):
					default:
					}
				}
			}
		})
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
feed:
	for i := range tasks {
		timer.Reset(time.Until(start.Add(time.Duration(float64(i) / rate * float64(time.Second)))))
		select {
		case <-ctx.Done():
			break feed
		case <-timer.C:
		}
		select {
		case jobs <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(jobs)
	wg.Wait()
	select {
	case err := <-errc:
		return err
	default:
		return ctx.Err()
	}
}

func (p *chaosProducer) submit(ctx context.Context, task chaosTask) error {
	backoff := 50 * time.Millisecond
	for try := 0; ; try++ {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		var ack client.SubmitAck
		var err error
		switch task.Kind {
		case kindGood:
			t := protocol.Task{ID: task.ID, Type: task.Type, Payload: json.RawMessage(fmt.Sprintf(`{"id":%q}`, task.ID))}
			if task.Pipe != "" {
				t.Payload = json.RawMessage(fmt.Sprintf(`{"id":%q,"kind":%q}`, task.ID, task.Pipe))
				t.Pipeline = chaosPipeline(task.Type)
			}
			ack, err = p.cl.Submit(actx, t)
		case kindRejected: // a valid task on the other type's subject
			other := map[string]string{"classify": "embed", "embed": "classify"}[task.Type]
			ack, err = p.cl.SubmitRaw(actx, other, task.Raw, task.MsgID)
		default:
			ack, err = p.cl.SubmitRaw(actx, task.Type, task.Raw, task.MsgID)
		}
		cancel()
		if err == nil {
			if ack.Duplicate {
				if try == 0 {
					return fmt.Errorf("first submit acknowledged as a duplicate: ids collide")
				}
				p.dupAcks.Add(1)
			}
			return nil
		}
		var perr *protocol.Error
		if errors.As(err, &perr) || ctx.Err() != nil {
			return err // invalid in the SDK's eyes: a bug in this test
		}
		p.retries.Add(1)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		backoff = min(2*backoff, time.Second)
	}
}

// waitAllResults waits with the SDK for every id's result, calling WaitAll
// again for the ids still missing when its consumer gives up (a server
// restart longer than its reset attempts).
func waitAllResults(ctx context.Context, cl *client.Client, ids []string) (map[string]*protocol.Result, int) {
	results := make(map[string]*protocol.Result, len(ids))
	restarts := 0
	remaining := ids
	for len(remaining) > 0 && ctx.Err() == nil {
		err := cl.WaitAll(ctx, remaining, func(r *protocol.Result) {
			if _, dup := results[r.ID]; !dup {
				results[r.ID] = r
			}
		})
		if err == nil {
			break
		}
		restarts++
		var left []string
		for _, id := range remaining {
			if results[id] == nil {
				left = append(left, id)
			}
		}
		remaining = left
		t := time.NewTimer(200 * time.Millisecond)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
	return results, restarts
}

// chaosRunner injects the scheduled faults one after the other.
type chaosRunner struct {
	c        *harness.Cluster
	js       jetstream.JetStream // the producer's: reads the registry's leader
	workers  []*harness.Worker
	disps    []*harness.Dispatcher
	counters *counterTotals
	start    time.Time

	// Set by run, read after it returned.
	outages []outage
	done    []string
	errs    []error
}

func (r *chaosRunner) run(ctx context.Context, schedule []fault) {
	for _, f := range schedule {
		if !sleepCtx(ctx, time.Until(r.start.Add(f.At))) {
			r.errs = append(r.errs, fmt.Errorf("%v: not injected: %w", f, ctx.Err()))
			return
		}
		began := time.Now()
		target, err := r.inject(ctx, f)
		if err != nil {
			r.errs = append(r.errs, fmt.Errorf("%v: %w", f, err))
			return // a process that did not come back makes the rest meaningless
		}
		r.done = append(r.done, fmt.Sprintf("t+%.1fs %s %s: down %.1fs, back after %.1fs",
			began.Sub(r.start).Seconds(), f.Kind, target, f.Down.Seconds(), time.Since(began).Seconds()))
	}
}

func (r *chaosRunner) inject(ctx context.Context, f fault) (string, error) {
	switch f.Kind {
	case faultKillWorker:
		w := r.workers[f.Target]
		from := time.Now()
		w.Kill()
		sleepCtx(ctx, f.Down)
		err := w.Start()
		r.outages = append(r.outages, outage{Node: w.NodeID, From: from, To: time.Now()})
		return w.NodeID, err
	case faultKillDispatcher:
		d := r.disps[f.Target]
		d.Kill()
		r.counters.fold(d.Name)
		sleepCtx(ctx, f.Down)
		return d.Name, d.Start()
	case faultRestartNATS:
		if err := r.c.NATS.Stop(); err != nil && !isExit(err) {
			return "nats", err
		}
		sleepCtx(ctx, f.Down)
		return "nats", r.c.NATS.Start()
	case faultKillNATS: // the attempt streams are in memory: gone with it
		r.c.NATS.Kill()
		sleepCtx(ctx, f.Down)
		return "nats", r.c.NATS.Start()
	case faultRestartRedis:
		if err := r.c.Redis.Stop(); err != nil && !isExit(err) {
			return "redis", err
		}
		sleepCtx(ctx, f.Down)
		return "redis", r.c.Redis.Start()
	case faultKillNATSNode, faultPauseNATSNode, faultPartitionNATSNode, faultRollingNATS, faultRegistryOutage:
		return r.injectCluster(ctx, f)
	}
	return "", fmt.Errorf("unknown fault %q", f.Kind)
}

// clusterHealTimeout bounds how long a NATS cluster may take to be healthy
// again (every server up, current and with a meta leader) after a fault.
const clusterHealTimeout = 2 * time.Minute

// registryLeader is the index of the server that leads the node
// registry's stream now.
func (r *chaosRunner) registryLeader(ctx context.Context) (int, error) {
	nc := r.c.NATSCluster
	var leader string
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err := harness.WaitFor(wctx, func() error {
		s, err := r.js.Stream(wctx, "KV_"+topology.BucketNodes)
		if err != nil {
			return err
		}
		info, err := s.Info(wctx)
		if err != nil {
			return err
		}
		if info.Cluster == nil || info.Cluster.Leader == "" {
			return errors.New("no leader")
		}
		leader = info.Cluster.Leader
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("the node registry's leader: %w", err)
	}
	for i, n := range nc.Nodes {
		if n.ServerName == leader {
			return i, nil
		}
	}
	return 0, fmt.Errorf("the node registry's leader %q is none of the servers", leader)
}

// injectCluster injects a fault of one server of the NATS cluster and
// returns once every server is healthy again.
func (r *chaosRunner) injectCluster(ctx context.Context, f fault) (string, error) {
	nc := r.c.NATSCluster
	if nc == nil {
		return "", fmt.Errorf("%s needs a NATS cluster", f.Kind)
	}
	var target string
	var err error
	switch f.Kind {
	case faultKillNATSNode:
		n := nc.Nodes[f.Target]
		target = n.ServerName
		n.Kill()
		sleepCtx(ctx, f.Down)
		err = n.Start()
	case faultPauseNATSNode:
		target = nc.Nodes[f.Target].ServerName
		if err = nc.Pause(f.Target); err == nil {
			sleepCtx(ctx, f.Down)
			err = nc.Resume(f.Target)
		}
	case faultRegistryOutage:
		i, lerr := r.registryLeader(ctx)
		if lerr != nil {
			return "", lerr
		}
		f.Target = i
		target = nc.Nodes[i].ServerName + " (leader of " + topology.BucketNodes + ")"
		fallthrough
	case faultPartitionNATSNode:
		if target == "" {
			target = nc.Nodes[f.Target].ServerName
		}
		if err = nc.Partition(f.Target); err != nil {
			return target, err
		}
		// A partition that leaks is no partition: fail the fault.
		if err = nc.WaitIsolated(f.Target, 30*time.Second); err != nil {
			nc.Heal(f.Target)
			return target, err
		}
		sleepCtx(ctx, f.Down)
		nc.Heal(f.Target)
	case faultRollingNATS:
		target = "every server"
		for _, n := range nc.Nodes {
			if err = n.Restart(); err != nil {
				return target, fmt.Errorf("restart %s: %w", n.ServerName, err)
			}
			if err = nc.WaitHealthy(clusterHealTimeout); err != nil {
				return target, fmt.Errorf("after restarting %s: %w", n.ServerName, err)
			}
		}
	}
	if err != nil {
		return target, err
	}
	if err := nc.WaitHealthy(clusterHealTimeout); err != nil {
		return target, fmt.Errorf("cluster not healthy after the fault: %w", err)
	}
	return target, nil
}

// mergeEnv returns base with over's entries added or replaced.
func mergeEnv(base, over map[string]string) map[string]string {
	out := make(map[string]string, len(base)+len(over))
	for k, v := range base {
		out[k] = v
	}
	for k, v := range over {
		out[k] = v
	}
	return out
}

// isExit: a server stopped by SIGTERM may exit non-zero; that is a stop.
func isExit(err error) bool {
	var ee *exec.ExitError
	return errors.As(err, &ee)
}

// sleepCtx waits d (the fault schedule's clock, not a synchronisation) and
// reports whether ctx is still alive.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// resultAudit records every message of the results stream as an ordered
// consumer delivers it.
type resultAudit struct {
	mu    sync.Mutex
	n     int
	count map[string]int
	first map[string][]byte
}

func newResultAudit() *resultAudit {
	return &resultAudit{count: map[string]int{}, first: map[string][]byte{}}
}

func (a *resultAudit) observe(subject string, data []byte) {
	id := strings.TrimPrefix(subject, topology.ResultSubject(""))
	a.mu.Lock()
	defer a.mu.Unlock()
	a.n++
	a.count[id]++
	if a.first[id] == nil {
		a.first[id] = bytes.Clone(data)
	}
}

func (a *resultAudit) messages() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.n
}

func (a *resultAudit) duplicates() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for id, n := range a.count {
		if n > 1 {
			out = append(out, fmt.Sprintf("%s×%d", id, n))
		}
	}
	sort.Strings(out)
	return out
}

// check compares what the stream delivered with what the SDK delivered:
// one stored result per id, identical content, nothing for unknown ids.
func (a *resultAudit) check(ids []string, sdk map[string]*protocol.Result) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var problems []string
	known := make(map[string]bool, len(ids))
	for _, id := range ids {
		known[id] = true
		if a.count[id] != 1 {
			problems = append(problems, fmt.Sprintf("%s: the results stream delivered %d results, want 1", id, a.count[id]))
			continue
		}
		var stored protocol.Result
		if err := json.Unmarshal(a.first[id], &stored); err != nil {
			problems = append(problems, fmt.Sprintf("%s: stored result is not a Result: %v", id, err))
			continue
		}
		x, _ := json.Marshal(stored)
		y, _ := json.Marshal(sdk[id])
		if !bytes.Equal(x, y) {
			problems = append(problems, fmt.Sprintf("%s: result changed: first stored %s, the SDK got %s", id, x, y))
		}
	}
	for id := range a.count {
		if !known[id] {
			problems = append(problems, fmt.Sprintf("result for a task never submitted: %s", id))
		}
	}
	sort.Strings(problems)
	return problems
}

// counterTotals sums the dispatchers' admin-stats counters over their runs:
// a report replaces the run's last one; a kill folds the run's last report
// into the total.
// It also measures the longest time a dispatcher saw no live node at all.
type counterTotals struct {
	mu   sync.Mutex
	gen  map[string]int
	last map[string]map[string]int64
	sum  map[string]int64

	noNodeSince map[string]time.Time
	noNodeMax   time.Duration
}

func newCounterTotals() *counterTotals {
	return &counterTotals{gen: map[string]int{}, last: map[string]map[string]int64{}, sum: map[string]int64{},
		noNodeSince: map[string]time.Time{}}
}

// longestNoNode is the longest time a dispatcher reported no live node.
func (c *counterTotals) longestNoNode() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.noNodeMax
}

func (c *counterTotals) poll(ctx context.Context, cl *harness.Cluster, want int) {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		c.mu.Lock()
		gens := make(map[string]int, len(c.gen))
		for k, v := range c.gen {
			gens[k] = v
		}
		c.mu.Unlock()
		rctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		reps, _ := cl.AdminStats(rctx, want)
		cancel()
		now := time.Now()
		c.mu.Lock()
		for _, r := range reps {
			if c.gen[r.Dispatcher] == gens[r.Dispatcher] {
				c.last[r.Dispatcher] = r.Counters
			}
			switch since, ok := c.noNodeSince[r.Dispatcher]; {
			case len(r.Nodes) > 0:
				delete(c.noNodeSince, r.Dispatcher)
			case !ok:
				c.noNodeSince[r.Dispatcher] = now
			default:
				c.noNodeMax = max(c.noNodeMax, now.Sub(since))
			}
		}
		c.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (c *counterTotals) fold(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, v := range c.last[name] {
		c.sum[k] += v
	}
	delete(c.last, name)
	c.gen[name]++
}

func (c *counterTotals) totals() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int64{}
	for k, v := range c.sum {
		out[k] = v
	}
	for _, m := range c.last {
		for k, v := range m {
			out[k] += v
		}
	}
	return out
}

// dlqContents is what MLSCHED_DLQ holds.
type dlqContents struct {
	total     int
	bySubject map[string]int // by kind: the subject's last token
	originals map[string][][]byte
	tasks     map[string]bool
}

func (d dlqContents) hasOriginal(kind string, raw []byte) bool {
	for _, o := range d.originals[kind] {
		if bytes.Equal(o, raw) {
			return true
		}
	}
	return false
}

func readDLQ(ctx context.Context, t *testing.T, js jetstream.JetStream) dlqContents {
	t.Helper()
	out := dlqContents{bySubject: map[string]int{}, originals: map[string][][]byte{}, tasks: map[string]bool{}}
	s, err := js.Stream(ctx, topology.StreamDLQ)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs == 0 {
		return out
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy})
	if err != nil {
		t.Fatal(err)
	}
	it, err := cons.Messages()
	if err != nil {
		t.Fatal(err)
	}
	defer it.Stop()
	for uint64(out.total) < info.State.Msgs {
		nctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		m, err := it.Next(jetstream.NextContext(nctx))
		cancel()
		if err != nil {
			t.Fatalf("reading %s: %v (after %d of %d)", topology.StreamDLQ, err, out.total, info.State.Msgs)
		}
		kind := strings.TrimPrefix(m.Subject(), topology.DLQSubject(""))
		out.total++
		out.bySubject[kind]++
		var dl protocol.DeadLetter
		if err := json.Unmarshal(m.Data(), &dl); err != nil {
			t.Errorf("dead letter on %s is not a DeadLetter: %v", m.Subject(), err)
			continue
		}
		out.originals[kind] = append(out.originals[kind], dl.Original)
		if dl.TaskID != "" {
			out.tasks[dl.TaskID] = true
		}
	}
	return out
}

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/dispatcher/autoscale"
	"github.com/mlsched/mlsched/dispatcher/autoscaler"
	"github.com/mlsched/mlsched/e2e/bench"
	"github.com/mlsched/mlsched/e2e/harness"
	"github.com/mlsched/mlsched/shared/client"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// procBackend is the autoscaler's process-level backend for the replay:
// one pool whose replicas are worker processes of the harness, started
// with the pool's models file and stopped with SIGTERM (they drain, as a
// compose scale-in does). It counts worker-seconds, a draining worker
// until it exits.
type procBackend struct {
	c      *harness.Cluster
	models string
	conc   int

	mu      sync.Mutex
	n       int
	live    []*harness.Worker
	started map[*harness.Worker]time.Time
	stopped map[*harness.Worker]time.Time
	scales  []string
	events  []scaleEvent
	t0      time.Time
	// requested is when each worker's scale-up was asked for (the Scale
	// call, right after the decision), by node id.
	requested map[string]time.Time
}

func newProcBackend(c *harness.Cluster, models string, conc int) *procBackend {
	return &procBackend{c: c, models: models, conc: conc, started: map[*harness.Worker]time.Time{},
		stopped: map[*harness.Worker]time.Time{}, t0: time.Now(), requested: map[string]time.Time{}}
}

func (b *procBackend) Name() string { return "process" }

func (b *procBackend) Pools(context.Context) ([]autoscaler.BackendPool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return []autoscaler.BackendPool{{Name: "pool", Replicas: len(b.live),
		Match: func(hb protocol.Heartbeat) bool { return strings.HasPrefix(hb.Node, "pool-") }}}, nil
}

func (b *procBackend) Scale(_ context.Context, _ string, replicas int) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.scales = append(b.scales, fmt.Sprintf("t+%.1fs %d→%d", time.Since(b.t0).Seconds(), len(b.live), replicas))
	b.events = append(b.events, scaleEvent{At: time.Now(), From: len(b.live), To: replicas})
	asked := time.Now()
	for len(b.live) < replicas {
		b.n++
		b.requested[fmt.Sprintf("pool-%d", b.n)] = asked
		w := b.c.StartWorker(harness.WorkerOptions{NodeID: fmt.Sprintf("pool-%d", b.n), ModelsFile: b.models,
			Concurrency: b.conc, NoWait: true})
		b.live = append(b.live, w)
		b.started[w] = time.Now()
	}
	for len(b.live) > replicas {
		w := b.live[len(b.live)-1]
		b.live = b.live[:len(b.live)-1]
		go func() {
			_ = w.Stop() // SIGTERM: the worker drains
			b.mu.Lock()
			b.stopped[w] = time.Now()
			b.mu.Unlock()
		}()
	}
	return nil
}

// workerSeconds integrates the running workers over [from, to].
func (b *procBackend) workerSeconds(from, to time.Time) float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	var s float64
	for w, st := range b.started {
		end, ok := b.stopped[w]
		if !ok {
			end = to
		}
		if end.After(to) {
			end = to
		}
		if st.Before(from) {
			st = from
		}
		s += max(0, end.Sub(st).Seconds())
	}
	return s
}

func (b *procBackend) peak() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.n
}

// replayOutcome is one policy's replay.
type replayOutcome struct {
	Policy                  string
	Tasks, Lost, Duplicates int
	PastDeadline            int
	WaitP50, WaitP99        float64 // ms, real time
	WorkerSeconds           float64
	Scalings                int
	WorkersStarted          int
	Start                   time.Time
	LoadEnd                 time.Duration
	Events                  []scaleEvent
	Life                    lifeStats
}

// scaleEvent is one scaling of the process backend.
type scaleEvent struct {
	At       time.Time
	From, To int
}

// replayParams describe a replay.
type replayParams struct {
	arrivals []bench.Arrival // trace time
	speed    float64         // trace seconds per real second
	deadline time.Duration   // real time, from submission to result
	conc     int
	min, max int
	// tail is how long after the last arrival the window goes on
	// (default 20 s); untilMin extends it until the pool is back at its
	// minimum (at most tail).
	tail     time.Duration
	untilMin bool
}

// runReplay replays arrivals against a fresh cluster whose one worker pool
// the policy scales through a procBackend, and measures it.
func runReplay(t *testing.T, name string, p replayParams, policy autoscale.Policy, interval time.Duration) replayOutcome {
	c := harness.New(t)
	c.StartNATS()
	c.StartDispatcher(harness.DispatcherOptions{})
	dir := t.TempDir()
	models := filepath.Join(dir, "models.yaml")
	// About 100 ms plus 50 µs a token: ~200 ms for the trace's mean 2048.
	if err := os.WriteFile(models, []byte(`models:
  - name: coder
    types: [code]
    executor: sim
    sim:
      latency: {dist: lognormal, median: 100ms, sigma: 0.2}
      latency_per_unit: 50us
      failure_rate: 0
`), 0o644); err != nil {
		t.Fatal(err)
	}
	// Each worker's first heartbeat and first dispatch, by node id: how long
	// a scale-up takes to serve (lifecycle, below).
	var lcMu sync.Mutex
	firstHB, firstTask := map[string]time.Time{}, map[string]time.Time{}
	{
		nc, _ := c.Conn()
		hbSub, err := nc.Subscribe("$KV."+topology.BucketNodes+".>", func(m *nats.Msg) {
			var hb protocol.Heartbeat
			if json.Unmarshal(m.Data, &hb) != nil || hb.Node == "" {
				return
			}
			lcMu.Lock()
			if _, ok := firstHB[hb.Node]; !ok {
				firstHB[hb.Node] = time.Now()
			}
			lcMu.Unlock()
		})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = hbSub.Unsubscribe() }()
		taskSub, err := nc.Subscribe(topology.DispatchSubject("*"), func(m *nats.Msg) {
			node := strings.TrimSuffix(strings.TrimPrefix(m.Subject, "mlsched.node."), ".tasks")
			lcMu.Lock()
			if _, ok := firstTask[node]; !ok {
				firstTask[node] = time.Now()
			}
			lcMu.Unlock()
		})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = taskSub.Unsubscribe() }()
	}
	be := newProcBackend(c, models, p.conc)
	if err := be.Scale(context.Background(), "pool", p.min); err != nil {
		t.Fatal(err)
	}
	nc, js := c.Conn()
	as, err := autoscaler.New(autoscaler.Params{NC: nc, JS: js, Backend: be, Policy: policy, Log: zerolog.Nop(),
		Lag: name == "keda", Wait: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Warm the statistics: a few tasks so that the model's service time is
	// known, as in a cluster that has been running (both policies alike).
	cl := client.New(js)
	for i := range 20 {
		task := protocol.Task{ID: fmt.Sprintf("warm-%d", i), Type: "code", Size: 2000, Payload: json.RawMessage(`{}`)}
		if _, err := cl.Submit(ctx, task); err != nil {
			t.Fatal(err)
		}
		wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
		if _, err := cl.Wait(wctx, task.ID); err != nil {
			wcancel()
			t.Fatalf("warm-up task: %v", err)
		}
		wcancel()
	}

	n := len(p.arrivals)
	sent := make([]time.Time, n)
	type res struct {
		at      time.Time
		latency float64
		count   int
		node    string
	}
	var mu sync.Mutex
	results := map[string]*res{}
	cons, err := js.OrderedConsumer(ctx, topology.StreamResults, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverNewPolicy})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		id := strings.TrimPrefix(m.Subject(), topology.ResultSubject(""))
		if !strings.HasPrefix(id, "r-") {
			return // a warm-up task
		}
		var r protocol.Result
		_ = json.Unmarshal(m.Data(), &r)
		mu.Lock()
		if x := results[id]; x != nil {
			x.count++
		} else {
			// The service time is the last attempt's; the result's own
			// latency_ms runs from the task's arrival.
			svc, node := 0.0, r.Node
			if len(r.History) > 0 {
				svc, node = r.History[len(r.History)-1].LatencyMs, r.History[len(r.History)-1].Node
			}
			results[id] = &res{at: time.Now(), latency: svc, count: 1, node: node}
		}
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()

	go func() { _ = as.Run(ctx, interval) }()
	start := time.Now()
	sem := make(chan struct{}, 256)
	var wg sync.WaitGroup
	for i, a := range p.arrivals {
		at := start.Add(time.Duration(float64(a.At) / p.speed))
		time.Sleep(time.Until(at)) // the trace's own pacing, not synchronisation
		sem <- struct{}{}
		wg.Add(1)
		sent[i] = time.Now()
		go func() {
			defer func() { <-sem; wg.Done() }()
			task := protocol.Task{ID: fmt.Sprintf("r-%05d", i), Type: "code", Size: a.Size, Payload: json.RawMessage(`{}`)}
			for try := 0; try < 5; try++ {
				sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
				_, err := cl.Submit(sctx, task)
				scancel()
				if err == nil {
					return
				}
			}
		}()
	}
	wg.Wait()
	lastArrival := time.Now()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		mu.Lock()
		got := len(results)
		mu.Unlock()
		if got >= n || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond) // poll interval
	}
	tail := p.tail
	if tail <= 0 {
		tail = 20 * time.Second
	}
	end := lastArrival.Add(tail) // the same window for every policy
	for time.Now().Before(end) {
		if p.untilMin {
			if r, _ := be.Pools(ctx); r[0].Replicas <= p.min {
				end = time.Now()
				break
			}
		}
		time.Sleep(100 * time.Millisecond) // poll interval (or the window's tail: replicas keep counting)
	}
	var out replayOutcome
	out.LoadEnd = lastArrival.Sub(start)
	cancel()
	out.Start = start
	out.Policy, out.Tasks, out.WorkerSeconds, out.WorkersStarted = name, n, be.workerSeconds(start, end), be.peak()
	be.mu.Lock()
	out.Scalings = len(be.scales)
	scales := slices.Clone(be.scales)
	out.Events = slices.Clone(be.events)
	be.mu.Unlock()
	var waits []float64
	mu.Lock()
	for i := range n {
		r := results[fmt.Sprintf("r-%05d", i)]
		if r == nil {
			out.Lost++
			continue
		}
		if r.count > 1 {
			out.Duplicates += r.count - 1
		}
		e2e := r.at.Sub(sent[i])
		if e2e > p.deadline {
			out.PastDeadline++
		}
		waits = append(waits, max(0, float64(e2e.Microseconds())/1000-r.latency))
	}
	busy := map[string][][2]time.Time{}
	for _, r := range results {
		if r.node != "" {
			busy[r.node] = append(busy[r.node], [2]time.Time{r.at.Add(-time.Duration(r.latency * float64(time.Millisecond))), r.at})
		}
	}
	mu.Unlock()
	lcMu.Lock()
	out.Life = lifecycle(be, firstHB, firstTask, busy, start, end, p.conc)
	out.Life.Held, out.Life.HeldWork = held(out.Events, busy, start, end, p.conc)
	lcMu.Unlock()
	slices.Sort(waits)
	q := func(f float64) float64 {
		if len(waits) == 0 {
			return math.NaN()
		}
		return waits[min(len(waits)-1, int(f*float64(len(waits))))]
	}
	out.WaitP50, out.WaitP99 = q(0.5), q(0.99)
	t.Logf("%s: scalings %v", name, scales)
	t.Logf("%s: %s", name, out.Life)
	return out
}

// lifeStats is where a replay's worker-seconds went, and how long a
// scale-up took to serve.
type lifeStats struct {
	// From the Scale call to the new worker's first heartbeat and first
	// dispatch, for the workers started after the replay began.
	ToHeartbeat, ToTask []time.Duration
	// Worker-seconds within the window: starting (the Scale call to the
	// first heartbeat), waiting for a first task, occupied (at least one
	// task running), idle between tasks, and the tail (after its last
	// task until stopped or the window's end: what a cooldown holds).
	Boot, PreFirst, Occupied, Gaps, Tail float64
	// Work is the slot-seconds of service over the slots per worker: the
	// worker-seconds at full use.
	Work float64
	// Tail of the workers that were stopped (a scale-in) and of those that
	// ran to the window's end.
	TailStopped, TailLive float64
	// Held is the worker-seconds from each scale-up that the next change
	// undid (a scale-in) to that scale-in: the hold after a burst, the
	// burst's own end included; HeldWork the work at full use within.
	Held, HeldWork float64
}

func (l lifeStats) String() string {
	q := func(ds []time.Duration, f float64) time.Duration {
		if len(ds) == 0 {
			return 0
		}
		s := slices.Clone(ds)
		slices.Sort(s)
		return s[min(len(s)-1, int(f*float64(len(s))))].Round(time.Millisecond)
	}
	return fmt.Sprintf("scale-up to first heartbeat p50 %v p90 %v, to first task p50 %v p90 %v (%d workers started); worker-seconds: starting %.0f, before a first task %.0f, occupied %.0f, idle between tasks %.0f, after the last task %.0f (stopped %.0f, to the end %.0f); work at full use %.0f; from a scale-up to the scale-in that followed it %.0f worker-seconds, %.0f of them work at full use",
		q(l.ToHeartbeat, 0.5), q(l.ToHeartbeat, 0.9), q(l.ToTask, 0.5), q(l.ToTask, 0.9), len(l.ToTask),
		l.Boot, l.PreFirst, l.Occupied, l.Gaps, l.Tail, l.TailStopped, l.TailLive, l.Work, l.Held, l.HeldWork)
}

// held integrates the replicas over each span from a scale-up to a
// scale-in that directly follows it, and the work (slot-seconds over the
// slots per worker) within those spans.
func held(es []scaleEvent, busy map[string][][2]time.Time, from, to time.Time, conc int) (ws, work float64) {
	var spans [][2]time.Time
	for i := 0; i+1 < len(es); i++ {
		if es[i].To > es[i].From && es[i+1].To < es[i+1].From {
			a, z := maxTime(es[i].At, from), minTime(es[i+1].At, to)
			if z.After(a) {
				ws += z.Sub(a).Seconds() * float64(es[i].To)
				spans = append(spans, [2]time.Time{a, z})
			}
		}
	}
	for _, ivs := range busy {
		for _, iv := range ivs {
			for _, sp := range spans {
				a, z := maxTime(iv[0], sp[0]), minTime(iv[1], sp[1])
				if z.After(a) {
					work += z.Sub(a).Seconds() / float64(conc)
				}
			}
		}
	}
	return ws, work
}

func lifecycle(b *procBackend, firstHB, firstTask map[string]time.Time, busy map[string][][2]time.Time, from, to time.Time, conc int) lifeStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	clip := func(a, z time.Time) float64 {
		a, z = maxTime(a, from), minTime(z, to)
		return max(0, z.Sub(a).Seconds())
	}
	var l lifeStats
	for w, st := range b.started {
		node := w.NodeID
		asked := b.requested[node]
		if asked.IsZero() {
			asked = st
		}
		hb, task := firstHB[node], firstTask[node]
		if asked.After(from) {
			if !hb.IsZero() {
				l.ToHeartbeat = append(l.ToHeartbeat, hb.Sub(asked))
			}
			if !task.IsZero() {
				l.ToTask = append(l.ToTask, task.Sub(asked))
			}
		}
		end, stopped := b.stopped[w]
		if !stopped || end.After(to) {
			end, stopped = to, false
		}
		if hb.IsZero() || hb.After(end) {
			hb = end
		}
		l.Boot += clip(st, hb)
		ivs := slices.Clone(busy[node])
		slices.SortFunc(ivs, func(x, y [2]time.Time) int { return x[0].Compare(y[0]) })
		if len(ivs) == 0 {
			l.PreFirst += clip(hb, end)
			continue
		}
		l.PreFirst += clip(hb, maxTime(hb, ivs[0][0]))
		// The union of the tasks' intervals, and the gaps between them.
		cs, ce := ivs[0][0], ivs[0][1]
		var occ, gaps float64
		for _, iv := range ivs[1:] {
			if iv[0].After(ce) {
				occ += clip(cs, ce)
				gaps += clip(ce, iv[0])
				cs, ce = iv[0], iv[1]
			} else {
				ce = maxTime(ce, iv[1])
			}
		}
		occ += clip(cs, ce)
		for _, iv := range ivs {
			l.Work += clip(iv[0], iv[1]) / float64(conc)
		}
		l.Occupied += occ
		l.Gaps += gaps
		tail := clip(ce, end)
		l.Tail += tail
		if stopped {
			l.TailStopped += tail
		} else {
			l.TailLive += tail
		}
	}
	return l
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// TestAutoscaleReplay replays the Azure code trace (its first
// MLSCHED_REPLAY_MINUTES, default 20, at MLSCHED_REPLAY_SPEED, default
// 10×) once with mlsched's scaler and once with KEDA's formula (time
// scaled alike), on the same pool limits, against real processes: a
// nats-server, a dispatcher, and worker processes started and stopped
// (SIGTERM) by a process backend. Long: make autoscale-replay.
func TestAutoscaleReplay(t *testing.T) {
	if os.Getenv("MLSCHED_AUTOSCALE_REPLAY") != "1" {
		t.Skip("the autoscaler trace replay: make autoscale-replay (MLSCHED_AUTOSCALE_REPLAY=1)")
	}
	minutes, speed := 20.0, 10.0
	if v, err := strconv.ParseFloat(os.Getenv("MLSCHED_REPLAY_MINUTES"), 64); err == nil && v > 0 {
		minutes = v
	}
	if v, err := strconv.ParseFloat(os.Getenv("MLSCHED_REPLAY_SPEED"), 64); err == nil && v > 0 {
		speed = v
	}
	maxW := 20
	if v, err := strconv.Atoi(os.Getenv("MLSCHED_REPLAY_MAX")); err == nil && v > 0 {
		maxW = v
	}
	all, err := bench.LoadTrace(repoPath(t, "dispatcher/internal/simulate/traces/azure-llm-2023-code.csv"), "TIMESTAMP", "ContextTokens", 0)
	if err != nil {
		t.Fatal(err)
	}
	var arrivals []bench.Arrival
	for _, a := range all {
		if a.At <= time.Duration(minutes*float64(time.Minute)) {
			arrivals = append(arrivals, a)
		}
	}
	p := replayParams{arrivals: arrivals, speed: speed, deadline: time.Duration(20 / speed * float64(time.Second)), conc: 4, min: 1, max: maxW}
	scaled := func(d time.Duration) time.Duration { return time.Duration(float64(d) / speed) }
	limits := func(string) autoscale.Limits {
		return autoscale.Limits{Min: p.min, Max: p.max, Cooldown: scaled(2 * time.Minute), DrainWithin: p.deadline / 2}
	}
	t.Logf("trace: %d tasks over %.0f trace minutes at %gx; deadline %s real (%s trace); pool 1..%d workers of %d slots",
		len(arrivals), minutes, speed, p.deadline, time.Duration(float64(p.deadline)*speed), p.max, p.conc)
	var outs []replayOutcome
	t.Run("mlsched", func(t *testing.T) {
		pol := autoscale.NewScaler(autoscale.ScalerParams{Limits: limits, RateHalfLife: scaled(10 * time.Second)})
		outs = append(outs, runReplay(t, "mlsched", p, pol, scaled(5*time.Second)))
	})
	t.Run("keda", func(t *testing.T) {
		pol := autoscale.NewKEDA(autoscale.KEDAParams{TimeScale: speed, Limits: limits})
		outs = append(outs, runReplay(t, "keda", p, pol, scaled(5*time.Second)))
	})
	var b strings.Builder
	fmt.Fprintf(&b, "%-8s %6s %12s %12s %13s %14s %9s %8s %5s\n", "policy", "tasks", "wait p50 ms", "wait p99 ms", "past deadline",
		"worker-seconds", "scalings", "started", "lost")
	for _, o := range outs {
		fmt.Fprintf(&b, "%-8s %6d %12.1f %12.1f %13d %14.1f %9d %8d %5d (duplicates %d)\n", o.Policy, o.Tasks, o.WaitP50, o.WaitP99,
			o.PastDeadline, o.WorkerSeconds, o.Scalings, o.WorkersStarted, o.Lost, o.Duplicates)
	}
	t.Logf("autoscale replay:\n%s", b.String())
	if path := os.Getenv("MLSCHED_REPLAY_OUT"); path != "" {
		_ = os.WriteFile(path, []byte(b.String()), 0o644)
	}
	for _, o := range outs {
		if o.Lost > 0 || o.Duplicates > 0 {
			t.Errorf("%s: %d tasks lost, %d duplicate results through the scalings", o.Policy, o.Lost, o.Duplicates)
		}
	}
}

// TestAutoscaleStep: idle, then 5× the pool's capacity at its minimum (one
// worker of 4 slots, ~200 ms a task: 20 tasks/s, so 100 tasks/s) for
// MLSCHED_STEP_SECONDS (default 120), then idle; mlsched's scaler at its
// defaults (5 s interval, 2 min cooldown). Enough replicas (5 or more)
// within 30 s, back to the minimum after the cooldown, at most one
// down-swing per cooldown, every task one result. Long: make
// autoscale-step.
func TestAutoscaleStep(t *testing.T) {
	if os.Getenv("MLSCHED_AUTOSCALE_STEP") != "1" {
		t.Skip("the autoscaler step load: make autoscale-step (MLSCHED_AUTOSCALE_STEP=1)")
	}
	secs := 120.0
	if v, err := strconv.ParseFloat(os.Getenv("MLSCHED_STEP_SECONDS"), 64); err == nil && v > 0 {
		secs = v
	}
	idle := 10 * time.Second
	var arrivals []bench.Arrival
	for i := range int(secs * 100) {
		arrivals = append(arrivals, bench.Arrival{At: idle + time.Duration(i)*10*time.Millisecond, Size: 2000})
	}
	cooldown := 2 * time.Minute
	p := replayParams{arrivals: arrivals, speed: 1, deadline: 30 * time.Second, conc: 4, min: 1, max: 10,
		tail: cooldown + 90*time.Second, untilMin: true}
	pol := autoscale.NewScaler(autoscale.ScalerParams{Limits: func(string) autoscale.Limits {
		return autoscale.Limits{Min: p.min, Max: p.max, Cooldown: cooldown}
	}})
	o := runReplay(t, "mlsched", p, pol, 5*time.Second)
	stepAt := o.Start.Add(idle)
	var enough time.Duration = -1
	var downs []time.Time
	cur := p.min
	for _, e := range o.Events {
		if enough < 0 && e.To >= 5 && e.At.After(stepAt) {
			enough = e.At.Sub(stepAt)
		}
		if e.To < e.From && e.From > p.min && (len(downs) == 0 || e.At.Sub(downs[len(downs)-1]) > cooldown) {
			downs = append(downs, e.At) // the first scale-in of a down-swing
		}
		cur = e.To
	}
	loadEnd := o.Start.Add(o.LoadEnd)
	t.Logf("step: %d tasks, enough replicas (>=5) %v after the step; back to %d replicas (%d now) %v after the load ended (cooldown %s); down-swings at %v; wait p50 %.1fms p99 %.1fms; %d past 30 s; lost %d, duplicates %d; %.0f worker-seconds",
		o.Tasks, enough.Round(100*time.Millisecond), p.min, cur, lastEventAfter(o.Events, loadEnd), cooldown, relTimes(downs, stepAt),
		o.WaitP50, o.WaitP99, o.PastDeadline, o.Lost, o.Duplicates, o.WorkerSeconds)
	if enough < 0 || enough > 30*time.Second {
		t.Errorf("enough replicas %v after the step, want within 30 s", enough)
	}
	if cur != p.min {
		t.Errorf("%d replicas at the end, want the minimum %d", cur, p.min)
	}
	if o.Lost > 0 || o.Duplicates > 0 {
		t.Errorf("%d lost, %d duplicates", o.Lost, o.Duplicates)
	}
	for i := 1; i < len(downs); i++ {
		if downs[i].Sub(downs[i-1]) < cooldown {
			t.Errorf("down-swings %v apart, within the cooldown", downs[i].Sub(downs[i-1]))
		}
	}
	for _, e := range o.Events {
		if e.To < e.From && e.At.Before(loadEnd) {
			t.Errorf("scaled in %d→%d at %v, under the step's load", e.From, e.To, e.At.Sub(stepAt))
		}
	}
}

func lastEventAfter(es []scaleEvent, t0 time.Time) time.Duration {
	var d time.Duration
	for _, e := range es {
		if e.At.After(t0) {
			d = e.At.Sub(t0)
		}
	}
	return d.Round(100 * time.Millisecond)
}

func relTimes(ts []time.Time, t0 time.Time) []string {
	var out []string
	for _, x := range ts {
		out = append(out, fmt.Sprintf("t+%.0fs", x.Sub(t0).Seconds()))
	}
	return out
}

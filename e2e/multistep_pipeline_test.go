package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mlsched/mlsched/e2e/harness"
	"github.com/mlsched/mlsched/shared/client"
	"github.com/mlsched/mlsched/shared/protocol"
)

// multiStepPipeline is TestMultiStepPipelines' pipeline: extract, a switch
// on the extracted kind to classx or classy, then summarize; each step
// type served by 2-3 simulated models failing 3% and timing out 1%
// (testdata/pipeline-steps.yaml).
func multiStepPipeline() *protocol.Pipeline {
	step := func(name, typ, input, next string) protocol.PipelineStep {
		return protocol.PipelineStep{Name: name, Type: typ, Input: input, Next: next, TimeoutMs: 200, MaxAttempts: 3}
	}
	return &protocol.Pipeline{Steps: []protocol.PipelineStep{
		step("extract", "extract", "", ""),
		{Name: "route", Switch: &protocol.Switch{On: "$.echo.kind", Cases: []protocol.SwitchCase{
			{Equals: json.RawMessage(`"x"`), Next: "cx"}, {Equals: json.RawMessage(`"y"`), Next: "cy"}}}},
		step("cx", "classx", "echo", "summarize"),
		step("cy", "classy", "echo", ""),
		step("summarize", "summarize", "echo", ""),
	}}
}

// TestMultiStepPipelines runs pipelines on real processes (nats-server,
// redis-server, one dispatcher, three workers): a 3-step pipeline with a
// switch at step 2, paced, with plain tasks of every step type beside
// them. Every pipeline must get exactly one result, at least 99% succeed
// (99.5% at MLSCHED_E2E_PIPELINES >= 10000, the target run); it
// logs the success rate and each step's p50 against the same type's plain
// tasks of the same run.
func TestMultiStepPipelines(t *testing.T) {
	requireBinaries(t, "dispatcher", "worker")
	n := 300
	if v := os.Getenv("MLSCHED_E2E_PIPELINES"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			t.Fatalf("MLSCHED_E2E_PIPELINES=%q", v)
		}
	}
	runMultiStep(t, n, false)
}

// TestMultiStepPipelinesThroughAKill: two dispatcher replicas, one killed
// (SIGKILL) half-way and started again: the steps it held are redelivered
// and go on, every pipeline still gets exactly one result.
func TestMultiStepPipelinesThroughAKill(t *testing.T) {
	requireBinaries(t, "dispatcher", "worker")
	runMultiStep(t, 300, true)
}

func runMultiStep(t *testing.T, n int, kill bool) {
	c := harness.New(t)
	// MLSCHED_E2E_NATS_SYNC=2m measures the bench's fast mode (the
	// server's default sync interval) instead of durable mode.
	c.StartNATSSync(os.Getenv("MLSCHED_E2E_NATS_SYNC"))
	c.StartRedis()
	env := map[string]string{"MLSCHED_SNAPSHOT_INTERVAL": "100ms"}
	if kill {
		env["MLSCHED_ACK_WAIT"] = "3s"
	}
	d := c.StartDispatcher(harness.DispatcherOptions{Env: env})
	var victim *harness.Dispatcher
	if kill {
		victim = c.StartDispatcher(harness.DispatcherOptions{Env: env})
	}
	for i, node := range []string{"node-1", "node-2", "node-3"} {
		c.StartWorker(harness.WorkerOptions{NodeID: node, ModelsFile: "testdata/pipeline-steps.yaml", Concurrency: 16, SimSeed: int64(31*i + 5)})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute+time.Duration(n)*15*time.Millisecond)
	defer cancel()
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
	_, js := c.Connect(nats.Name("e2e-pipelines"))
	seen := newResultCounter(ctx, t, js)
	cl := client.New(js)

	// Paced: every 10 ms two pipelines and, every other tick, one plain task
	// of each step type (the baseline, same run, same load).
	pl := multiStepPipeline()
	var all []protocol.Task
	var ids []string
	plainType := map[string]string{}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for i := 0; i < n; {
		var batch []protocol.Task
		for k := 0; k < 2 && i < n; k, i = k+1, i+1 {
			kind := "x"
			if i%3 == 2 {
				kind = "y"
			}
			batch = append(batch, protocol.Task{ID: fmt.Sprintf("pl-%05d", i), Type: "extract",
				Payload: json.RawMessage(fmt.Sprintf(`{"kind":%q,"n":%d}`, kind, i)), Pipeline: pl})
		}
		if i%4 == 0 {
			for _, typ := range []string{"extract", "classx", "classy", "summarize"} {
				id := fmt.Sprintf("plain-%s-%05d", typ, i)
				plainType[id] = typ
				batch = append(batch, protocol.Task{ID: id, Type: typ, Payload: json.RawMessage(`{"kind":"x"}`),
					TimeoutMs: 200, MaxAttempts: 3})
			}
		}
		_, errs := cl.SubmitMany(ctx, batch, 0)
		for j, err := range errs {
			if err != nil {
				t.Fatalf("submit %s: %v", batch[j].ID, err)
			}
		}
		for _, task := range batch {
			ids = append(ids, task.ID)
		}
		all = append(all, batch...)
		if victim != nil && i == n/2 {
			victim.Kill()
			t.Logf("killed a dispatcher replica after %d pipelines", i)
			if err := victim.Start(); err != nil {
				t.Fatalf("restarting the replica: %v", err)
			}
		}
		<-tick.C
	}
	results := map[string]*protocol.Result{}
	if err := cl.WaitAll(ctx, ids, func(r *protocol.Result) { results[r.ID] = r }); err != nil {
		t.Fatalf("waiting: %v (have %d of %d)", err, len(results), len(ids))
	}
	harness.Eventually(t, 30*time.Second, "every result seen once", func() error {
		if got := seen.distinct(); got < len(ids) {
			return fmt.Errorf("%d of %d results seen", got, len(ids))
		}
		return nil
	})
	if dups := seen.duplicates(); len(dups) > 0 {
		t.Fatalf("results published twice: %v", dups)
	}
	if u := seen.unknown(all); len(u) > 0 {
		t.Fatalf("results of unknown ids: %v", u)
	}

	var ok, failed int
	stepLat := map[string][]float64{} // type: latency of first-attempt steps
	plainLat := map[string][]float64{}
	var endToEnd, handoff []float64
	for id, r := range results {
		if typ, plain := plainType[id]; plain {
			if r.Status == protocol.StatusSucceeded && r.Attempts == 1 {
				plainLat[typ] = append(plainLat[typ], r.LatencyMs)
			}
			if len(r.Steps) != 0 {
				t.Errorf("plain task %s has steps %+v", id, r.Steps)
			}
			continue
		}
		if r.Status != protocol.StatusSucceeded {
			failed++
			t.Logf("%s: %s %s at %s: %s", id, r.Status, r.ErrorCode, r.FailedStep, r.Error)
			if r.ErrorCode != protocol.CodePipelineError || r.FailedStep == "" {
				t.Errorf("%s failed without naming its step: %+v", id, r)
			}
			continue
		}
		ok++
		if len(r.Steps) != 3 || r.Steps[0].Name != "extract" || r.Steps[2].Name != "summarize" {
			t.Errorf("%s: steps %+v", id, r.Steps)
			continue
		}
		var in struct {
			Kind string `json:"kind"`
		}
		_ = json.Unmarshal(mustLookup(t, r.Output, "echo"), &in)
		if want := map[string]string{"x": "cx", "y": "cy"}[in.Kind]; r.Steps[1].Name != want {
			t.Errorf("%s: kind %q went to %s", id, in.Kind, r.Steps[1].Name)
		}
		first := true
		for _, s := range r.Steps {
			if s.Model == "" || s.Node == "" || s.Attempts < 1 {
				t.Errorf("%s: step %+v", id, s)
			}
			if s.Attempts == 1 {
				stepLat[s.Type] = append(stepLat[s.Type], s.LatencyMs)
			} else {
				first = false
			}
		}
		if first {
			endToEnd = append(endToEnd, r.LatencyMs)
			// What is not in any step's latency: from a step's end to
			// its successor's message stored, and to the result.
			gap := r.LatencyMs
			for _, s := range r.Steps {
				gap -= s.LatencyMs
			}
			handoff = append(handoff, gap/float64(len(r.Steps)))
		}
	}
	rate := float64(ok) / float64(n)
	t.Logf("pipelines: %d, succeeded %d (%.2f%%), failed %d", n, ok, 100*rate, failed)
	sumPlain := 0.0
	for _, typ := range []string{"extract", "classx", "classy", "summarize"} {
		sp, pp := p50(stepLat[typ]), p50(plainLat[typ])
		t.Logf("step type %-9s p50 %.2f ms as a step (%d), %.2f ms as a plain task (%d): %+.2f ms", typ, sp, len(stepLat[typ]), pp, len(plainLat[typ]), sp-pp)
	}
	for _, typ := range []string{"extract", "classx", "summarize"} {
		sumPlain += p50(plainLat[typ])
	}
	e2e := p50(endToEnd)
	t.Logf("pipeline p50 %.2f ms end to end (%d, no retries) vs %.2f ms for its 3 steps as plain tasks: %+.2f ms per step",
		e2e, len(endToEnd), sumPlain, (e2e-sumPlain)/3)
	t.Logf("hand-off p50 %.2f ms per step (the pipeline's latency less its steps', over its steps: storing the next step's message and the result)", p50(handoff))
	want := 0.99
	if n >= 10000 {
		want = 0.995
	}
	if rate < want {
		t.Errorf("success %.4f, want >= %.3f", rate, want)
	}
}

func mustLookup(t *testing.T, doc json.RawMessage, path string) json.RawMessage {
	v, ok := protocol.Lookup(doc, path)
	if !ok {
		t.Errorf("no %s in %s", path, doc)
	}
	return v
}

func p50(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

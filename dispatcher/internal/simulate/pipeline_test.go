package simulate

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/mlsched/mlsched/dispatcher/internal/policy"
)

// The pipelines scenario's tasks: the share that are pipelines, each of
// 2-3 steps of different types, the first of the arrival's type, the same
// in every policy's run (drawn from a stream of their own).
func TestPipelineSteps(t *testing.T) {
	t.Parallel()
	sc, err := Load("pipelines")
	if err != nil {
		t.Fatal(err)
	}
	n := 4000
	var first []string
	for _, name := range []string{policy.Reliability, policy.Latency} {
		s, err := newSim(sc, Options{Seed: 5}.withDefaults(sc), name)
		if err != nil {
			t.Fatal(err)
		}
		var drawn []string
		pipes, lens := 0, map[int]int{}
		for i := range n {
			tk := &task{idx: i, typ: s.pickType()}
			arrival := tk.typ
			s.pickSteps(tk)
			if tk.steps == nil {
				drawn = append(drawn, "-")
				continue
			}
			pipes++
			lens[len(tk.steps)]++
			drawn = append(drawn, strings.Join(tk.steps, ","))
			if tk.steps[0] != arrival {
				t.Fatalf("pipeline %v does not start with the arrival's type %s", tk.steps, arrival)
			}
			if u := slices.Compact(slices.Sorted(slices.Values(tk.steps))); len(u) != len(tk.steps) {
				t.Fatalf("pipeline %v repeats a type", tk.steps)
			}
		}
		if share := float64(pipes) / float64(n); math.Abs(share-0.4) > 0.03 {
			t.Errorf("%s: %.3f of the tasks are pipelines, want 0.4", name, share)
		}
		if len(lens) != 2 || lens[2] == 0 || lens[3] == 0 {
			t.Errorf("%s: pipeline lengths %v, want 2 and 3", name, lens)
		}
		if first == nil {
			first = drawn
		} else if !slices.Equal(first, drawn) {
			t.Errorf("the pipelines differ between policies' runs")
		}
	}
}

// Policies compared on pipelines: the reliability policy's pipelines
// succeed more often than latency-first's and retry far less, the oracle's
// at least as often as any; every pipeline counts its steps.
func TestPipelinesComparePolicies(t *testing.T) {
	t.Parallel()
	rep := run(t, "pipelines", Options{Tasks: tasksFor(t, 8000), Seed: 11, Policies: []string{policy.Reliability, policy.Latency}})
	rel, lat, or := rep.Get(policy.Reliability).Pipelines, rep.Get(policy.Latency).Pipelines, rep.Get(Oracle).Pipelines
	if rel == nil || lat == nil || or == nil {
		t.Fatalf("no pipeline figures: %+v", rep.Results)
	}
	if rel.Pipelines < 0.35*float64(rep.Tasks) || rel.Steps < 2.3 || rel.Steps > 2.7 || rel.StepsRun > rel.Steps {
		t.Errorf("reliability: %.0f pipelines of %d tasks, %.2f steps, %.2f run", rel.Pipelines, rep.Tasks, rel.Steps, rel.StepsRun)
	}
	if rel.Success < lat.Success+0.005 {
		t.Errorf("pipeline success: reliability %.4f, latency %.4f: want a half-point lead", rel.Success, lat.Success)
	}
	if rel.Clean < lat.Clean+0.2 {
		t.Errorf("pipelines without a retry: reliability %.4f, latency %.4f: want a 20-point lead", rel.Clean, lat.Clean)
	}
	if rel.Success > or.Success+0.005 || or.VsOracle != 0 {
		t.Errorf("reliability %.4f beats the oracle %.4f (oracle vs itself %v)", rel.Success, or.Success, or.VsOracle)
	}
	var table strings.Builder
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), "pipelines (a pipeline succeeds when every step does") {
		t.Errorf("the table has no pipelines section:\n%s", table.String())
	}
}

// A step that fails ends its pipeline there: with one type whose only
// model always fails, every pipeline (each has both types) fails, at its
// first step or its second, and the plain tasks of the good type succeed.
func TestPipelineStepFailureEndsIt(t *testing.T) {
	t.Parallel()
	sc, err := ParseScenario([]byte(`{
  "tasks": 400,
  "arrival": {"rate": 50, "types": {"good": 1, "bad": 1}},
  "pipelines": {"share": 0.5, "max_steps": 2},
  "max_attempts": 2,
  "timeout": "1s",
  "models": [
    {"name": "g", "types": ["good"], "profile": [{"at": "0s", "failure_prob": 0, "latency": {"dist": "fixed", "value": "10ms"}}]},
    {"name": "b", "types": ["bad"], "profile": [{"at": "0s", "failure_prob": 1, "latency": {"dist": "fixed", "value": "10ms"}}]}],
  "nodes": [{"name": "n", "models": ["g", "b"]}]
}`))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Run(context.Background(), sc, Options{Seed: 3, Policies: []string{policy.Reliability}})
	if err != nil {
		t.Fatal(err)
	}
	p := rep.Get(policy.Reliability).Pipelines
	if p.Pipelines < 150 || p.Success != 0 || p.Steps != 2 || !(p.StepsRun > 1 && p.StepsRun < 2) {
		t.Errorf("pipelines %+v: want every one failed, some at their first step, some at their second", p)
	}
	if p.PlainSuccess < 0.4 || p.PlainSuccess > 0.6 {
		t.Errorf("plain success %.3f: want the good type's half", p.PlainSuccess)
	}
	// Attempts: 2 per failed step, 1 per good one before it.
	if p.MeanAttempts < 2 || p.MeanAttempts > 3 {
		t.Errorf("mean attempts %.2f per pipeline, want between 2 and 3", p.MeanAttempts)
	}
}

func TestPipelineMixValidation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ mix, field string }{
		{`{"share": 0}`, "pipelines.share"},
		{`{"share": 1.5}`, "pipelines.share"},
		{`{"share": 0.5, "min_steps": 1}`, "pipelines"},
		{`{"share": 0.5, "min_steps": 3, "max_steps": 2}`, "pipelines"},
		{`{"share": 0.5}`, "pipelines.max_steps"}, // 3 steps of different types, 1 type
	} {
		_, err := ParseScenario([]byte(strings.Replace(minimal, `"nodes"`, `"pipelines": `+tc.mix+`, "nodes"`, 1)))
		var se *ScenarioError
		if !errors.As(err, &se) || se.Field != tc.field {
			t.Errorf("pipelines %s: error %v, want one naming %s", tc.mix, err, tc.field)
		}
	}
	sc, err := ParseScenario([]byte(minimal))
	if err != nil {
		t.Fatal(err)
	}
	if err := sc.SetPipelines(0.3); err == nil {
		t.Error("SetPipelines on a scenario of one type: no error")
	}
}

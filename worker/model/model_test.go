package model

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestParseFullExample(t *testing.T) {
	t.Parallel()
	specs, err := LoadFile(repoFile("deployments/models/example.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(specs) != 5 {
		t.Fatalf("%d models", len(specs))
	}
	if o := specs[4].HTTP; o.Mode != HTTPOIP || o.Model != "digits-logreg" || o.Version != "1" || len(o.Inputs) != 1 ||
		o.Inputs[0].Name != "pixels" || o.Inputs[0].Datatype != "FP32" || o.Inputs[0].Shape[1] != -1 {
		t.Errorf("oip model %+v", o)
	}
	f := specs[0]
	if f.Name != "fraud-fast" || f.Timeout.D() != 2*time.Second || f.Sim.Latency.Median.D() != 5*time.Millisecond ||
		f.Sim.Latency.Sigma != 0.4 || f.Sim.FailureRate != 0.3 || len(f.Sim.Schedule) != 1 ||
		f.Sim.Schedule[0].After.D() != time.Minute || *f.Sim.Schedule[0].FailureRate != 0.05 {
		t.Errorf("sim model %+v", f)
	}
	if specs[1].Go.Handler != "echo" || specs[2].Exec.Command[0] != "python3" || specs[3].HTTP.Mode != HTTPPassthrough {
		t.Errorf("specs %+v", specs)
	}
	if info := specs[1].Info(30 * time.Second); info.TimeoutMs != 30000 || info.Types[0] != "echo" {
		t.Errorf("info %+v", info)
	}
}

// The compose deployment's models file must stay valid.
func TestDeploymentModelsFilesParse(t *testing.T) {
	t.Parallel()
	files, _ := filepath.Glob(repoFile("deployments/models/*.yaml"))
	if len(files) == 0 {
		t.Fatal("no models files")
	}
	for _, f := range files {
		if _, err := LoadFile(f); err != nil {
			t.Error(err)
		}
	}
}

func TestValidationErrorsNameModelAndField(t *testing.T) {
	t.Parallel()
	cases := []struct{ name, yaml, want string }{
		{"empty", ``, "empty"},
		{"no models", `models: []`, "no models"},
		{"unknown top field", "modles: []", "field modles not found"},
		{"unknown model field", "models: [{name: a, types: [t], executor: sim, latncy: 1}]", "field latncy not found"},
		{"missing name", "models: [{types: [t], executor: sim}]", "models[0]: name: missing"},
		{"bad name", "models: [{name: a.b, types: [t], executor: sim}]", `model "a.b": name:`},
		{"missing types", "models: [{name: a, executor: sim}]", `model "a": types: missing`},
		{"bad type", "models: [{name: a, types: [x y], executor: sim}]", `model "a": types: "x y"`},
		{"no executor", "models: [{name: a, types: [t]}]", `model "a": executor: missing`},
		{"unknown executor", "models: [{name: a, types: [t], executor: gpu}]", `model "a": executor: unknown "gpu"`},
		{"duplicate", "models: [{name: a, types: [t], executor: sim}, {name: a, types: [u], executor: sim}]", `model "a": name: duplicate`},
		{"bad duration", "models: [{name: a, types: [t], executor: sim, timeout: 5}]", `want a duration`},
		{"bad duration unit", "models: [{name: a, types: [t], executor: sim, timeout: 5parsecs}]", `"5parsecs"`},
		{"negative duration", "models: [{name: a, types: [t], executor: sim, timeout: -1s}]", `negative`},
		{"negative latency per unit", "models: [{name: a, types: [t], executor: sim, sim: {latency_per_unit: -1ms}}]", `duration "-1ms" is negative`},
		{"go without handler", "models: [{name: a, types: [t], executor: go}]", `model "a": go.handler: missing`},
		{"exec without command", "models: [{name: a, types: [t], executor: exec, exec: {command: []}}]", `model "a": exec.command: missing`},
		{"http without url", "models: [{name: a, types: [t], executor: http, http: {}}]", `model "a": http.url: missing`},
		{"http bad mode", "models: [{name: a, types: [t], executor: http, http: {url: \"http://h\", mode: grpc}}]", `model "a": http.mode: "grpc"`},
		{"http no section", "models: [{name: a, types: [t], executor: http}]", `model "a": http: missing`},
		{"http bad url", "models: [{name: a, types: [t], executor: http, http: {url: \"ftp://h\"}}]", `model "a": http.url: "ftp://h"`},
		{"http url no host", "models: [{name: a, types: [t], executor: http, http: {url: \"http://\"}}]", `model "a": http.url: "http://": no host`},
		{"http inputs in passthrough", "models: [{name: a, types: [t], executor: http, http: {url: \"http://h\", inputs: [{name: x, datatype: FP32, shape: [1]}]}}]", `model "a": http.inputs: only for mode oip`},
		{"http version in passthrough", "models: [{name: a, types: [t], executor: http, http: {url: \"http://h\", version: \"2\"}}]", `model "a": http.version: only for mode oip`},
		{"oip input no tensor", "models: [{name: a, types: [t], executor: http, http: {url: \"http://h\", mode: oip, inputs: [{datatype: FP32, shape: [1]}]}}]", `model "a": http.inputs[0].name: missing`},
		{"oip input bad datatype", "models: [{name: a, types: [t], executor: http, http: {url: \"http://h\", mode: oip, inputs: [{name: x, datatype: FLOAT, shape: [1]}]}}]", `model "a": http.inputs[0].datatype: unknown "FLOAT"`},
		{"oip input no shape", "models: [{name: a, types: [t], executor: http, http: {url: \"http://h\", mode: oip, inputs: [{name: x, datatype: FP32}]}}]", `http.inputs[0].shape: missing`},
		{"oip input two free dims", "models: [{name: a, types: [t], executor: http, http: {url: \"http://h\", mode: oip, inputs: [{name: x, datatype: FP32, shape: [-1, -1]}]}}]", `http.inputs[0].shape: at most one`},
		{"oip input zero dim", "models: [{name: a, types: [t], executor: http, http: {url: \"http://h\", mode: oip, inputs: [{name: x, datatype: FP32, shape: [0]}]}}]", `http.inputs[0].shape: dimension 0`},
		{"oip duplicate input", "models: [{name: a, types: [t], executor: http, http: {url: \"http://h\", mode: oip, inputs: [{name: x, datatype: FP32, shape: [1]}, {name: x, datatype: FP32, shape: [1]}]}}]", `http.inputs[1].name: duplicate`},
		{"oip bad version", "models: [{name: a, types: [t], executor: http, http: {url: \"http://h\", mode: oip, version: \"1/2\"}}]", `http.version: "1/2"`},
		{"oip ready url", "models: [{name: a, types: [t], executor: http, http: {url: \"http://h\", mode: oip, ready_url: \"http://h/r\"}}]", `http.ready_url: not for mode oip`},
		{"exec negative line", "models: [{name: a, types: [t], executor: exec, exec: {command: [x], max_line_bytes: -1}}]", `exec.max_line_bytes`},
		{"two sections", "models: [{name: a, types: [t], executor: sim, sim: {}, go: {handler: echo}}]", `only the section`},
		{"bad dist", "models: [{name: a, types: [t], executor: sim, sim: {latency: {dist: pareto}}}]", `sim.latency.dist: unknown "pareto"`},
		{"bad rate", "models: [{name: a, types: [t], executor: sim, sim: {failure_rate: 1.5}}]", `sim.failure_rate: 1.5`},
		{"uniform inverted", "models: [{name: a, types: [t], executor: sim, sim: {latency: {dist: uniform, min: 2s, max: 1s}}}]", `sim.latency.max`},
		{"lognormal no median", "models: [{name: a, types: [t], executor: sim, sim: {latency: {dist: lognormal, sigma: 1}}}]", `sim.latency.median`},
		{"schedule order", "models: [{name: a, types: [t], executor: sim, sim: {schedule: [{after: 2s}, {after: 1s}]}}]", `sim.schedule[1].after`},
		{"zero max_concurrency", "models: [{name: a, types: [t], executor: sim}, {name: big, types: [t], executor: sim, max_concurrency: 0}]", `model "big": max_concurrency: 0 must be a positive`},
		{"negative batch size", "models: [{name: b, types: [t], executor: sim, batch: {max_size: -1}}]", `model "b": batch.max_size: -1 must be 1..4096`},
		{"batch too big", "models: [{name: b, types: [t], executor: sim, batch: {max_size: 5000}}]", `model "b": batch.max_size: 5000 must be 1..4096`},
		{"batch delay too long", "models: [{name: b, types: [t], executor: sim, batch: {max_delay: 11s}}]", `model "b": batch.max_delay: 11s is over 10s`},
		{"negative batch delay", "models: [{name: b, types: [t], executor: sim, batch: {max_delay: -1ms}}]", `is negative`},
		{"batch unknown field", "models: [{name: b, types: [t], executor: sim, batch: {size: 4}}]", `field size not found`},
		{"negative max_concurrency", "models: [{name: big, types: [t], executor: sim, max_concurrency: -2}]", `model "big": max_concurrency: -2`},
		{"negative cost", "models: [{name: a, types: [t], executor: sim}, {name: cheap, types: [t], executor: sim, cost: {per_task: -1}}]", `model "cheap": cost.per_task: -1 must be a number in 0..`},
		{"huge unit cost", "models: [{name: big, types: [t], executor: sim, cost: {per_unit: 2e9}}]", `model "big": cost.per_unit: 2e+09`},
		{"nan cost", "models: [{name: big, types: [t], executor: sim, cost: {per_task: .nan}}]", `model "big": cost.per_task: NaN`},
		{"cost not a number", "models: [{name: big, types: [t], executor: sim, cost: {per_task: cheap}}]", `cheap`},
		{"cost unknown field", "models: [{name: big, types: [t], executor: sim, cost: {per_token: 1}}]", `field per_token not found`},
		{"schedule rate", "models: [{name: a, types: [t], executor: sim, sim: {schedule: [{after: 1s, timeout_rate: -1}]}}]", `sim.schedule[0].timeout_rate`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse([]byte(c.yaml))
			if err == nil {
				t.Fatalf("accepted:\n%s", c.yaml)
			}
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q does not contain %q (or wrap ErrInvalid)", err, c.want)
			}
		})
	}
}

func TestLoadFileErrors(t *testing.T) {
	t.Parallel()
	if _, err := LoadFile(filepath.Join(t.TempDir(), "absent.yaml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	p := filepath.Join(t.TempDir(), "m.yaml")
	os.WriteFile(p, []byte("models: [{name: a, types: [t], executor: nope}]"), 0o600)
	if _, err := LoadFile(p); err == nil || !strings.Contains(err.Error(), p) {
		t.Errorf("invalid file: %v, want the path in the error", err)
	}
}

func repoFile(rel string) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", filepath.FromSlash(rel))
}

func TestMaxConcurrencyAnnounced(t *testing.T) {
	t.Parallel()
	specs, err := Parse([]byte("models: [{name: a, types: [t], executor: sim, max_concurrency: 3}, {name: b, types: [t], executor: sim}]"))
	if err != nil {
		t.Fatal(err)
	}
	if got := specs[0].Info(0).MaxConcurrency; got != 3 {
		t.Errorf("a announces max_concurrency %d, want 3", got)
	}
	if got := specs[1].Info(0).MaxConcurrency; got != 0 {
		t.Errorf("b announces max_concurrency %d, want 0 (no limit)", got)
	}
}

func TestVersionedModels(t *testing.T) {
	t.Parallel()
	specs, err := Parse([]byte(`models:
  - {name: fraud, version: v7, types: [fraud], executor: sim}
  - {name: fraud, version: v8, replaces: v7, types: [fraud], executor: sim}
  - {name: plain, types: [fraud], executor: sim}
`))
	if err != nil {
		t.Fatal(err)
	}
	if specs[0].Name != "fraud@v7" || specs[1].Name != "fraud@v8" || specs[2].Name != "plain" {
		t.Fatalf("names %q %q %q", specs[0].Name, specs[1].Name, specs[2].Name)
	}
	if i := specs[1].Info(time.Second); i.Name != "fraud@v8" || i.Version != "v8" || i.Replaces != "v7" {
		t.Fatalf("info %+v", i)
	}
	if q := Qualify(specs); q[1].Name != "fraud@v8" {
		t.Fatalf("qualifying twice: %q", q[1].Name)
	}
	for yaml, want := range map[string]string{
		`{name: f, version: v1, types: [t], executor: sim}, {name: f, version: v1, types: [t], executor: sim}`: `model "f@v1": name: duplicate`,
		`{name: f, replaces: v1, types: [t], executor: sim}`:                                                   "version: missing",
		`{name: f, version: "a@b", types: [t], executor: sim}`:                                                 "version:",
		`{name: f, version: v1, replaces: v1, types: [t], executor: sim}`:                                      "own version",
		`{name: "f@v1", version: v2, types: [t], executor: sim}`:                                               "separates the family",
	} {
		_, err := Parse([]byte("models: [" + yaml + "]"))
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err %v, want %q", yaml, err, want)
		}
	}
}

// A model's cost is parsed, validated and announced as it is declared; a
// model without one announces none (0 and 0).
func TestCostAnnounced(t *testing.T) {
	t.Parallel()
	specs, err := Parse([]byte(`models:
  - {name: small, version: "2", types: [t], executor: sim, cost: {per_task: 0.5, per_unit: 0.002}}
  - {name: flat, types: [t], executor: sim, cost: {per_task: 3}}
  - {name: free, types: [t], executor: sim}
`))
	if err != nil {
		t.Fatal(err)
	}
	small, flat, free := specs[0].Info(time.Second), specs[1].Info(time.Second), specs[2].Info(time.Second)
	if small.Name != "small@2" || small.CostPerTask != 0.5 || small.CostPerUnit != 0.002 {
		t.Errorf("small announces %+v", small)
	}
	if got := small.Cost(1000); got != 2.5 {
		t.Errorf("small costs %g for size 1000, want 0.5 + 0.002 x 1000 = 2.5", got)
	}
	if flat.CostPerTask != 3 || flat.CostPerUnit != 0 {
		t.Errorf("flat announces %+v", flat)
	}
	if free.CostPerTask != 0 || free.CostPerUnit != 0 {
		t.Errorf("free announces %+v", free)
	}
}

func TestExampleDeclaresCost(t *testing.T) {
	t.Parallel()
	specs, err := LoadFile(repoFile("deployments/models/example.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if c := specs[3].Cost; c == nil || c.PerTask != 0.2 || c.PerUnit != 0.001 {
		t.Errorf("remote's cost %+v, want 0.2 per task, 0.001 per unit", c)
	}
}

// A batch section takes its defaults for what it omits; a model without
// one does not batch; the size is announced.
func TestBatchDefaultsAndAnnounced(t *testing.T) {
	specs, err := Parse([]byte("models: [{name: a, types: [t], executor: sim, batch: {}}, {name: b, types: [t], executor: sim, batch: {max_size: 8, max_delay: 0s}}, {name: c, types: [t], executor: sim}]"))
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []struct {
		size  int
		delay time.Duration
	}{{DefaultBatchMaxSize, DefaultBatchMaxDelay}, {8, 0}, {0, DefaultBatchMaxDelay}} {
		if specs[i].BatchSize() != want.size || specs[i].BatchDelay() != want.delay {
			t.Errorf("%s: batch %d, %v; want %d, %v", specs[i].Name, specs[i].BatchSize(), specs[i].BatchDelay(), want.size, want.delay)
		}
		if got := specs[i].Info(time.Second).BatchMaxSize; got != want.size {
			t.Errorf("%s announces batch_max_size %d, want %d", specs[i].Name, got, want.size)
		}
	}
}

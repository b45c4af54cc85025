package simulate

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const traceScenario = `{
  "arrival": {"trace": "TRACE", "size_column": "ContextTokens", "types": {"t": 1}EXTRA},
  "timeout": "1s",
  "models": [{"name": "m", "types": ["t"], "profile": [{"at": "0s", "failure_prob": 0, "latency": {"dist": "fixed", "value": "10ms"}}]}],
  "nodes": [{"name": "n", "models": ["m"]}]
}`

// writeTraceScenario writes a trace and a scenario naming it relatively
// into a directory of its own, and returns the scenario's path.
func writeTraceScenario(t *testing.T, trace, extra string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "traces"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "traces", "a.csv"), []byte(trace), 0o644); err != nil {
		t.Fatal(err)
	}
	src := strings.NewReplacer("TRACE", "traces/a.csv", "EXTRA", extra).Replace(traceScenario)
	p := filepath.Join(dir, "sc.json")
	if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func runTrace(t *testing.T, sc *Scenario, n int) *sim {
	t.Helper()
	s, err := newSim(sc, Options{Seed: 1}.withDefaults(sc), Oracle)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.run(context.Background(), n); err != nil {
		t.Fatal(err)
	}
	return s
}

const azureLike = `TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:17:03.9799600,4808,10
2023-11-16 18:17:04.0319600,3180,8
2023-11-16 18:17:04.0319600,110,27
2023-11-16 18:17:06.4999600,7433,14
`

// A trace's rows arrive at their own times, relative to the scenario's
// directory, with their sizes; the task count defaults to the rows, and a
// longer run replays the trace again after one mean gap.
func TestTraceArrivalsAtTheirTimes(t *testing.T) {
	t.Parallel()
	sc, err := Load(writeTraceScenario(t, azureLike, ""))
	if err != nil {
		t.Fatal(err)
	}
	if sc.Tasks != 4 {
		t.Fatalf("tasks %d, want the trace's 4 rows", sc.Tasks)
	}
	want := []time.Duration{0, 52 * time.Millisecond, 52 * time.Millisecond, 2520 * time.Millisecond}
	s := runTrace(t, sc, 6)
	gap := 2520 * time.Millisecond / 3
	want = append(want, 2520*time.Millisecond+gap, 2520*time.Millisecond+gap+52*time.Millisecond)
	for i, w := range want {
		if got := s.tasks[i].submit; got != w {
			t.Errorf("task %d arrived at %v, want %v", i, got, w)
		}
	}
	if got := sc.trace.size; len(got) != 4 || got[0] != 4808 || got[3] != 7433 {
		t.Errorf("sizes %v, want the ContextTokens column", got)
	}
}

// time_scale compresses the times; rate_multiplier thins or repeats rows,
// the same for every seed; times in seconds work as timestamps do, and
// rows out of order are replayed in time order.
func TestTraceScaleAndMultiplier(t *testing.T) {
	t.Parallel()
	secs := "t,ContextTokens\n0,1\n2,2\n1,3\n3,4\n"
	sc, err := Load(writeTraceScenario(t, secs, `, "time_column": "t", "time_scale": 0.5, "rate_multiplier": 0.5`))
	if err != nil {
		t.Fatal(err)
	}
	if got := sc.trace.at; len(got) != 2 || got[0] != 500*time.Millisecond || got[1] != 1500*time.Millisecond {
		t.Errorf("halved and thinned: arrivals %v, want [500ms 1.5s] (rows at 1s and 3s, every other kept)", got)
	}
	if got := sc.trace.size; got[0] != 3 || got[1] != 4 {
		t.Errorf("sizes %v, want the kept rows' [3 4]", got)
	}
	sc, err = Load(writeTraceScenario(t, secs, `, "time_column": "t", "rate_multiplier": 2`))
	if err != nil {
		t.Fatal(err)
	}
	want := []time.Duration{0, 500 * time.Millisecond, time.Second, 1500 * time.Millisecond, 2 * time.Second, 2500 * time.Millisecond, 3 * time.Second, 3 * time.Second}
	if got := sc.trace.at; len(got) != len(want) {
		t.Fatalf("doubled: arrivals %v, want %v", got, want)
	}
	for i, w := range want {
		if sc.trace.at[i] != w {
			t.Errorf("doubled: arrival %d at %v, want %v", i, sc.trace.at[i], w)
		}
	}
}

// Type and tenant columns set each task's type and flow.
func TestTraceTypeAndTenantColumns(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	trace := "time,type,tenant\n0,a,x\n0.5,b,y\n1,a,y\n"
	if err := os.WriteFile(filepath.Join(dir, "tr.csv"), []byte(trace), 0o644); err != nil {
		t.Fatal(err)
	}
	src := `{"arrival": {"trace": "tr.csv", "type_column": "type", "tenant_column": "tenant", "types": {"a": 1, "b": 1},
	  "flows": [{"share": 1, "tenant": "x"}, {"share": 1, "tenant": "y", "priority": 2}]},
	  "models": [{"name": "m", "types": ["a", "b"], "profile": [{"at": "0s", "failure_prob": 0, "latency": {"dist": "fixed", "value": "10ms"}}]}],
	  "nodes": [{"name": "n", "models": ["m"]}]}`
	p := filepath.Join(dir, "s.json")
	if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	sc, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	s, err := newSim(sc, Options{Seed: 1}.withDefaults(sc), Oracle)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for i := 0; i < 3; i++ {
		tk := &task{idx: i, flow: -1}
		s.traceTask(tk)
		got = append(got, tk.typ+"/"+tk.tenant+"/"+string(rune('0'+tk.priority)))
	}
	if strings.Join(got, " ") != "a/x/0 b/y/2 a/y/2" {
		t.Errorf("tasks %v, want a/x/0 b/y/2 a/y/2", got)
	}
	if _, err := Run(context.Background(), sc, Options{Policies: []string{"reliability"}}); err != nil {
		t.Fatal(err)
	}
}

// Bad trace fields and files get a specific error naming the field.
func TestTraceErrors(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, trace, extra, field, reason string
	}{
		{"rate with a trace", azureLike, `, "rate": 5`, "arrival.rate", "rate_multiplier"},
		{"missing size column", "TIMESTAMP\n1\n", "", "arrival.size_column", `column "ContextTokens"`},
		{"bad time", "TIMESTAMP,ContextTokens\nyesterday,1\n", "", "arrival.trace", "row 2"},
		{"negative size", "TIMESTAMP,ContextTokens\n1,-3\n", "", "arrival.trace", "size"},
		{"no rows", "TIMESTAMP,ContextTokens\n", "", "arrival.trace", "no rows"},
		{"bad scale", azureLike, `, "time_scale": -1`, "arrival.time_scale", "outside"},
		{"bad multiplier", azureLike, `, "rate_multiplier": 1e9`, "arrival.rate_multiplier", "outside"},
		{"tenant without flows", azureLike, `, "tenant_column": "GeneratedTokens"`, "arrival.tenant_column", "flows"},
		{"type not listed", azureLike, `, "type_column": "GeneratedTokens"`, "arrival.trace", "not in arrival.types"},
	} {
		_, err := Load(writeTraceScenario(t, c.trace, c.extra))
		var se *ScenarioError
		if !errors.As(err, &se) || se.Field != c.field || !strings.Contains(se.Reason, c.reason) {
			t.Errorf("%s: error %v, want field %s saying %q", c.name, err, c.field, c.reason)
		}
	}
	_, err := ParseScenario([]byte(`{"arrival": {"rate": 1, "time_scale": 2, "types": {"t": 1}}}`))
	if err == nil || !strings.Contains(err.Error(), "arrival.time_scale: applies only with arrival.trace") {
		t.Errorf("trace field without a trace: %v", err)
	}
	p := writeTraceScenario(t, azureLike, "")
	if err := os.Remove(filepath.Join(filepath.Dir(p), "traces", "a.csv")); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(p); err == nil || !strings.Contains(err.Error(), "arrival.trace") || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("missing trace file: %v", err)
	}
}

// A model's latency grows with the task's size by latency_per_unit (on top
// of the drawn part, times the node's slowdown), and later profile steps
// inherit it; an attempt whose size alone passes the timeout times out,
// and the oracle knows it will.
func TestLatencyPerUnit(t *testing.T) {
	t.Parallel()
	trace := "t,ContextTokens\n0,0\n1,100\n2,300\n3,2000\n"
	p := writeTraceScenario(t, trace, `, "time_column": "t"`)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	src := strings.Replace(string(b), `"value": "10ms"}}]`, `"value": "10ms"}, "latency_per_unit": "2ms"}, {"at": "1h", "failure_prob": 0}]`, 1)
	src = strings.Replace(src, `"models": ["m"]}`, `"models": ["m"], "slowdown": 2}`, 1)
	src = strings.Replace(src, `"timeout": "1s"`, `"timeout": "2s", "max_attempts": 1`, 1)
	if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	sc, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if got := sc.Models[0].Profile[1].LatencyPerUnit; got == nil || got.D() != 2*time.Millisecond {
		t.Fatalf("later step's latency_per_unit %v, want it inherited (2ms)", got)
	}
	s := runTrace(t, sc, 4)
	for i, want := range []time.Duration{20 * time.Millisecond, 420 * time.Millisecond, 1220 * time.Millisecond} {
		if r := s.tasks[i]; r.latency != want || !r.firstOK || r.pFirst != 0 {
			t.Errorf("task %d: latency %v ok %v pFirst %g, want (10ms + size x 2ms) x 2 = %v, a success the oracle foresaw", i, r.latency, r.firstOK, r.pFirst, want)
		}
	}
	if r := s.tasks[3]; r.firstOK || r.pFirst != 1 {
		t.Errorf("size 2000 (8s of work against a 2s timeout): ok %v pFirst %g, want a timeout the oracle foresaw", r.firstOK, r.pFirst)
	}
	if _, err := ParseScenario([]byte(strings.Replace(minimal, `"value": "10ms"}`, `"value": "10ms"}, "latency_per_unit": "-1ms"`, 1))); err == nil ||
		!strings.Contains(err.Error(), "latency_per_unit") {
		t.Errorf("negative latency_per_unit: %v", err)
	}
}

// The Azure built-ins replay their embedded traces: every row once, at its
// own time, sized by its tokens.
func TestAzureBuiltins(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		rows    int
		meanMin float64
	}{{"azure-code", 8819, 2000}, {"azure-conv", 19366, 200}} {
		sc, err := Load(c.name)
		if err != nil {
			t.Fatal(err)
		}
		var sum float64
		for _, v := range sc.trace.size {
			sum += v
		}
		if sc.Tasks != c.rows || len(sc.trace.at) != c.rows || sum/float64(c.rows) < c.meanMin || sc.trace.span < 55*time.Minute {
			t.Errorf("%s: %d tasks, %d arrivals over %v, mean size %.0f; want the trace's %d rows over its hour, mean size above %g",
				c.name, sc.Tasks, len(sc.trace.at), sc.trace.span, sum/float64(c.rows), c.rows, c.meanMin)
		}
	}
}

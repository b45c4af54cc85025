package bench

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func sampleReport() *Report {
	o := Options{Scenarios: []string{ScenarioRelay, ScenarioMlsched}}.withDefaults()
	return &Report{Machine: Machine{NProc: 2, CPU: "test cpu"}, Options: o, Storage: "file",
		Scenarios: []Scenario{
			{Name: ScenarioRelay, PublishesPerTask: 2,
				Throughput: Phase{Tasks: 100, Seconds: 1, Throughput: 1000, CPU: map[string]float64{"nats-server": 0.5, "relay": 0.1}},
				Latency:    Phase{Tasks: 100, Seconds: 1, Throughput: 5000, Latency: Latency{P99: 2}, CPU: map[string]float64{"nats-server": 0.5, "relay": 0.1}}},
			{Name: ScenarioMlsched, PublishesPerTask: 4,
				Throughput: Phase{Tasks: 100, Seconds: 2, Throughput: 400, CPU: map[string]float64{"nats-server": 1, "dispatcher": 0.2, "workers (4)": 0.3}},
				Latency:    Phase{Tasks: 100, Seconds: 1, Throughput: 4000, Latency: Latency{P99: 6}, CPU: map[string]float64{"nats-server": 1}},
				Dispatched: map[string]int64{"m1": 60, "m2": 40}},
		},
		ThroughputRatio: 0.4, P99Ratio: 3}
}

// TestWriteTable checks the verdicts and the CPU accounting of the table.
func TestWriteTable(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	if err := sampleReport().WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"0.40x (target >= 0.6x: MISSED)",
		"3.00x",       // durable mode has no latency target
		"0.50 (5000)", // nats-server in the relay's throughput phase: 0.5 s over 100 tasks
		"30%",         // relay: 0.6 CPU s over 1 s on 2 CPUs
		"note: mlsched is overloaded at 5000/s",
		"m1 60 m2 40",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "note: relay is overloaded") {
		t.Errorf("relay reported overloaded:\n%s", out)
	}
}

func TestWriteJSON(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "r.json")
	if err := sampleReport().WriteJSON(path); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var got Report
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if s := got.Scenario(ScenarioMlsched); s == nil || s.Throughput.Throughput != 400 || got.ThroughputRatio != 0.4 {
		t.Errorf("round trip lost data: %+v", got)
	}
	if got.Scenario("nope") != nil {
		t.Error("Scenario of an unknown name is not nil")
	}
}

func TestRunRejectsBadOptions(t *testing.T) {
	t.Parallel()
	if _, err := Run(t.Context(), Options{Scenarios: []string{"nope"}}); !errors.Is(err, ErrUnknownScenario) {
		t.Errorf("unknown scenario: err = %v", err)
	}
	if _, err := Run(t.Context(), Options{Scenarios: []string{ScenarioRelay}}); err == nil {
		t.Error("relay scenario without a relay command accepted")
	}
}

// TestAuthCostTable: the authorization scenarios are compared with their
// open counterparts of the same report, as ratios auth over open.
func TestAuthCostTable(t *testing.T) {
	t.Parallel()
	r := sampleReport()
	auth := r.Scenarios[1]
	auth.Name = ScenarioMlschedAuth
	auth.Throughput.Throughput = 360
	auth.Throughput.CPU = map[string]float64{"nats-server": 1.2, "dispatcher": 0.2, "workers (4)": 0.35}
	auth.Latency.Latency.P99 = 7.5
	r.Scenarios = append(r.Scenarios, auth)
	r.AuthCost = r.authCosts()
	if len(r.AuthCost) != 1 {
		t.Fatalf("auth costs %+v, want mlsched only (relay-auth did not run)", r.AuthCost)
	}
	c := r.AuthCost[0]
	near := func(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }
	if c.System != ScenarioMlsched || !near(c.ThroughputRatio, 0.9) || !near(c.P99Ratio, 1.25) ||
		!near(c.OpenCPU, 5000) || !near(c.AuthCPU, 5500) || !near(c.NATSCPURatio, 1.2) {
		t.Errorf("auth cost %+v", c)
	}
	var b bytes.Buffer
	s := &Suite{Reports: []*Report{r}}
	if err := s.WriteSummary(&b); err != nil {
		t.Fatal(err)
	}
	norm := func(s string) string { return strings.Join(strings.Fields(s), " ") }
	for _, want := range []string{"authorization cost", "mlsched 400 360 0.90x", "5000 / 5500 1.10x", "10000 / 12000 1.20x"} {
		if !strings.Contains(norm(b.String()), want) {
			t.Errorf("summary lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	if err := (&Suite{Reports: []*Report{sampleReport()}}).WriteSummary(&b); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "authorization cost") {
		t.Errorf("summary without auth scenarios prints an auth cost table:\n%s", b.String())
	}
}

// Several rounds: the median row takes each ratio within its round, then
// the median, and is the one the targets are judged by.
func TestMediansOfRounds(t *testing.T) {
	t.Parallel()
	var reps []*Report
	for i, mls := range []float64{400, 500, 200} { // relay 1000: ratios 0.4, 0.5, 0.2
		r := sampleReport()
		r.Options.Round = i + 1
		r.Options.SyncInterval = ModeFast.SyncInterval
		r.Scenarios[1].Throughput.Throughput = mls
		reps = append(reps, r)
	}
	s := &Suite{Reports: reps}
	m := s.Medians()
	if len(m) != 1 || m[0].Rounds != 3 || m[0].TputRatio != 0.4 || m[0].MlsTput != 400 {
		t.Fatalf("medians %+v", m)
	}
	var b bytes.Buffer
	if err := s.WriteSummary(&b); err != nil {
		t.Fatal(err)
	}
	norm := strings.Join(strings.Fields(b.String()), " ")
	if !strings.Contains(norm, "median of 3 1000 400 0.40x (>=0.45 MISSED)") {
		t.Errorf("summary lacks the median row:\n%s", b.String())
	}
	if (&Suite{Reports: reps[:1]}).Medians() != nil {
		t.Error("one round has a median row")
	}
}

// The river scenario's throughput and mlsched's ratio to it reach the
// summary and its medians, with issue 24's target (>= 1) in durable mode.
func TestRiverInSummary(t *testing.T) {
	t.Parallel()
	s := &Suite{}
	for i, river := range []float64{800, 1000, 2000} {
		r := sampleReport()
		r.Options.Round = i + 1
		r.Scenarios = append(r.Scenarios, Scenario{Name: ScenarioRiver, PublishesPerTask: 1,
			Throughput: Phase{Tasks: 100, Seconds: 1, Throughput: river}})
		s.Reports = append(s.Reports, r)
	}
	rows := s.Summary()
	if len(rows) != 3 || rows[0].RiverTput != 800 || rows[0].RiverRatio != 0.5 || rows[2].RiverRatio != 0.2 {
		t.Fatalf("summary rows %+v", rows)
	}
	med := s.Medians()
	if len(med) != 1 || med[0].RiverTput != 1000 || med[0].RiverRatio != 0.4 {
		t.Fatalf("medians %+v", med)
	}
	var b bytes.Buffer
	if err := s.WriteSummary(&b); err != nil {
		t.Fatal(err)
	}
	if out := b.String(); !strings.Contains(out, "mlsched/river") || !strings.Contains(out, "0.40x (>=1 MISSED)") {
		t.Errorf("summary without the river verdict:\n%s", out)
	}
}

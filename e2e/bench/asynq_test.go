package bench

import (
	"bytes"
	"strings"
	"testing"
)

// The asynq scenario runs for real: a redis-server of its own, an asynq
// server and client, every task of every phase completed and none failed.
func TestAsynqScenario(t *testing.T) {
	t.Parallel()
	rep, err := Run(t.Context(), Options{Scenarios: []string{ScenarioAsynq}, Warmup: 200, Tasks: 1000, LatencyTasks: 300, Rate: 300,
		Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	s := rep.Scenario(ScenarioAsynq)
	if s == nil {
		t.Fatal("no asynq scenario in the report")
	}
	for _, p := range []struct {
		name string
		ph   Phase
		n    int
	}{{"warmup", s.Warmup, 200}, {"throughput", s.Throughput, 1000}, {"latency", s.Latency, 300}} {
		if p.ph.Tasks != p.n || p.ph.Failed != 0 || p.ph.Throughput <= 0 {
			t.Errorf("%s phase: %d tasks, %d failed, %.0f/s; want %d, 0 failed, a throughput", p.name, p.ph.Tasks, p.ph.Failed, p.ph.Throughput, p.n)
		}
	}
}

// asynq's throughput and mlsched's ratio to it reach the summary and its
// medians, with issue 46's target (>= 2) in fast mode.
func TestAsynqInSummary(t *testing.T) {
	t.Parallel()
	s := &Suite{}
	for i, aq := range []float64{250, 400, 1000} { // mlsched 500: ratios 2, 1.25, 0.5
		r := sampleReport()
		r.Options.Round = i + 1
		r.Options.SyncInterval = ModeFast.SyncInterval
		r.Scenarios[1].Throughput.Throughput = 500
		r.Scenarios = append(r.Scenarios, Scenario{Name: ScenarioAsynq, PublishesPerTask: 1,
			Throughput: Phase{Tasks: 100, Seconds: 1, Throughput: aq}})
		s.Reports = append(s.Reports, r)
	}
	rows := s.Summary()
	if len(rows) != 3 || rows[0].AsynqTput != 250 || rows[0].AsynqRatio != 2 || rows[2].AsynqRatio != 0.5 {
		t.Fatalf("summary rows %+v", rows)
	}
	med := s.Medians()
	if len(med) != 1 || med[0].AsynqTput != 400 || med[0].AsynqRatio != 1.25 {
		t.Fatalf("medians %+v", med)
	}
	var b bytes.Buffer
	if err := s.WriteSummary(&b); err != nil {
		t.Fatal(err)
	}
	if out := b.String(); !strings.Contains(out, "mlsched/asynq") || !strings.Contains(out, "1.25x (>=2 MISSED)") {
		t.Errorf("summary without the asynq verdict:\n%s", out)
	}
}

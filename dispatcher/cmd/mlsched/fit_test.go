package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The round trip from the command line: a run writes its request log
// (-log), -fit turns it into a scenario and a trace beside it, and the
// fitted scenario runs.
func TestSimulateLogFitRoundTrip(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	log := filepath.Join(dir, "run.csv")
	_, stderr, err := simulateCLI(t, "-scenario", "stationary", "-policy", "round-robin", "-tasks", "3000", "-seed", "2", "-log", log)
	if err != nil || !strings.Contains(stderr, "attempts of policy round-robin, seed 2, to "+log) {
		t.Fatalf("-log: %v\n%s", err, stderr)
	}
	b, err := os.ReadFile(log)
	if err != nil || !strings.HasPrefix(string(b), "time,type,tenant,model,node,attempt,status,latency_ms,size\n") || strings.Count(string(b), "\n") < 3001 {
		t.Fatalf("log: %v\n%.300s", err, b)
	}
	out, stderr, err := simulateCLI(t, "-fit", log, "-slots", "8", "-time-scale", "0.5")
	if err != nil {
		t.Fatalf("-fit: %v\n%s", err, stderr)
	}
	scen := filepath.Join(dir, "run.scenario.json")
	if !strings.Contains(out, "fitted ") || !strings.Contains(out, "KS D") || !strings.Contains(out, "wrote "+scen+" and "+filepath.Join(dir, "run.trace.csv")) {
		t.Fatalf("-fit output:\n%s", out)
	}
	sb, err := os.ReadFile(scen)
	if err != nil || !strings.Contains(string(sb), `"trace": "run.trace.csv"`) || !strings.Contains(string(sb), `"time_scale": 0.5`) || !strings.Contains(string(sb), `"capacity": 8`) {
		t.Fatalf("scenario: %v\n%s", err, sb)
	}
	tab, stderr, err := simulateCLI(t, "-scenario", scen, "-tasks", "1000")
	if err != nil || !strings.Contains(tab, "scenario run, 1000 tasks") || !strings.Contains(tab, "oracle") {
		t.Fatalf("fitted run: %v\n%s\n%s", err, tab, stderr)
	}
}

// -fit's bad input gets a specific message.
func TestSimulateFitErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	log := filepath.Join(dir, "l.csv")
	if err := os.WriteFile(log, []byte("when,model\n1,m\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-fit", filepath.Join(dir, "none.csv")}, "no such file"},
		{[]string{"-fit", log, "-col-latency", "lat"}, `no column "lat" for the latency`},
		{[]string{"-fit", log, "-slots", "0"}, "-slots 0"},
		{[]string{"-fit", log, "-latency-unit", "0s"}, "-latency-unit"},
	} {
		_, stderr, err := simulateCLI(t, c.args...)
		if !errors.Is(err, errUsage) || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: %v, stderr %q; want usage error saying %q", c.args, err, stderr, c.want)
		}
	}
	out, _, err := simulateCLI(t, "-fit", log, "-col-time", "when")
	if err != nil || !strings.Contains(out, "no timeouts in the log") {
		t.Errorf("minimal log: %v\n%s", err, out)
	}
}

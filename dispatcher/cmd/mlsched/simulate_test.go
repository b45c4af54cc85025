package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func simulateCLI(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errb bytes.Buffer
	err = simulateTo(context.Background(), args, &out, &errb)
	return out.String(), errb.String(), err
}

func TestSimulateCommand(t *testing.T) {
	t.Parallel()
	svg := filepath.Join(t.TempDir(), "drift.svg")
	out, _, err := simulateCLI(t, "-scenario", "drift", "-policy", "reliability,latency", "-tasks", "3000", "-seed", "9", "-format", "csv", "-svg", svg)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil || len(rows) != 4 || rows[1][3] != "reliability" || rows[2][3] != "latency" || rows[3][3] != "oracle" || rows[1][1] != "9" {
		t.Fatalf("csv: %v\n%s", err, out)
	}
	b, err := os.ReadFile(svg)
	if err != nil || !bytes.HasPrefix(b, []byte("<svg")) || bytes.Count(b, []byte("<polyline")) != 3 {
		t.Fatalf("svg: %v, %d bytes", err, len(b))
	}

	// Same seed, same output; the table and JSON formats work too.
	again, _, _ := simulateCLI(t, "-scenario", "drift", "-policy", "reliability,latency", "-tasks", "3000", "-seed", "9", "-format", "csv")
	if again != out {
		t.Error("same seed gave different output")
	}
	js, _, err := simulateCLI(t, "-scenario", "stationary", "-policy", "random", "-tasks", "2000", "-format", "json")
	var rep struct {
		Results []struct{ Policy string } `json:"results"`
	}
	if err != nil || json.Unmarshal([]byte(js), &rep) != nil || len(rep.Results) != 2 {
		t.Fatalf("json: %v\n%s", err, js)
	}
	tab, _, err := simulateCLI(t, "-policy", "all", "-tasks", "2000")
	if err != nil || !strings.Contains(tab, "scenario stationary, 2000 tasks, seed 1") || strings.Count(tab, "\n") != 9 {
		t.Fatalf("table: %v\n%s", err, tab)
	}
	tab, _, err = simulateCLI(t, "-scenario", "drift", "-policy", "thompson", "-tasks", "2000", "-runs", "2", "-seed", "5")
	if err != nil || !strings.Contains(tab, "mean of 2 runs (seeds 5..6)") || !strings.Contains(tab, "median of the runs") {
		t.Fatalf("runs: %v\n%s", err, tab)
	}
}

func TestSimulateScenarioFileAndListing(t *testing.T) {
	t.Parallel()
	shown, _, err := simulateCLI(t, "-scenario", "cold-start", "-show")
	if err != nil || !strings.Contains(shown, `"model_join"`) {
		t.Fatalf("show: %v\n%s", err, shown)
	}
	file := filepath.Join(t.TempDir(), "mine.json")
	if err := os.WriteFile(file, []byte(shown), 0o600); err != nil {
		t.Fatal(err)
	}
	out, _, err := simulateCLI(t, "-scenario", file, "-policy", "thompson", "-tasks", "1500", "-window", "20s")
	if err != nil || !strings.Contains(out, "thompson") || !strings.Contains(out, "recovery") {
		t.Fatalf("file scenario: %v\n%s", err, out)
	}
	list, _, err := simulateCLI(t, "-list")
	if err != nil || strings.Count(list, "\n") != 19 || !strings.Contains(list, "pipelines") || !strings.Contains(list, "azure-code") || !strings.Contains(list, "flapping") || !strings.Contains(list, "cost-tradeoff") || !strings.Contains(list, "priority-overload") || !strings.Contains(list, "rollout-bad") || !strings.Contains(list, "node-crash") || !strings.Contains(list, "overload") {
		t.Fatalf("list: %v\n%s", err, list)
	}
}

// The cost policies run by name on any scenario, and -min-success sets
// the cost policy's bar.
func TestSimulateCostPolicies(t *testing.T) {
	t.Parallel()
	out, _, err := simulateCLI(t, "-scenario", "cost-tradeoff", "-policy", "cost,cheapest-fallback", "-tasks", "3000", "-min-success", "0.95")
	if err != nil || !strings.Contains(out, "cheapest-fallback") || !strings.Contains(out, "cost/success") {
		t.Fatalf("cost-tradeoff: %v\n%s", err, out)
	}
	out, _, err = simulateCLI(t, "-scenario", "stationary", "-policy", "cost", "-tasks", "1000")
	if err != nil || !strings.Contains(out, " cost ") || strings.Contains(out, "cost/success") {
		t.Fatalf("stationary (no costs): %v\n%s", err, out)
	}
}

func TestSimulateBadInput(t *testing.T) {
	t.Parallel()
	broken := filepath.Join(t.TempDir(), "broken.json")
	if err := os.WriteFile(broken, []byte(`{"arrival": {"rate": -1}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-policy", "fastest"}, `unknown policy "fastest"`},
		{[]string{"-format", "xml"}, `unknown -format "xml"`},
		{[]string{"-scenario", "nowhere"}, `unknown scenario "nowhere"`},
		{[]string{"-scenario", broken}, "arrival.rate"},
		{[]string{"-tasks", "-5"}, "negative"},
		{[]string{"-explore-share", "2"}, "invalid policy config"},
		{[]string{"-min-success", "1.5"}, `min success 1.5`},
		{[]string{"-window", "1ms"}, "at least 10ms"},
		{[]string{"-runs", "0"}, "outside 1..1000"},
		{[]string{"-tasks", "20000000"}, "at most 10000000"},
		{[]string{"extra"}, `unexpected argument "extra"`},
		{[]string{"-seed", "x"}, "invalid value"},
		{[]string{"-pipelines", "0.3"}, "pipelines.max_steps"}, // stationary has one type
		{[]string{"-scenario", "pipelines", "-pipelines", "2"}, "pipelines.share"},
	} {
		_, errs, err := simulateCLI(t, c.args...)
		if !errors.Is(err, errUsage) || !strings.Contains(errs, c.want) {
			t.Errorf("%v: err %v, stderr %q: want a usage error mentioning %q", c.args, err, errs, c.want)
		}
	}
	// Through the CLI entry point: usage errors exit 2, -h exits 0.
	if code, _, _ := cli(t, "nats://127.0.0.1:1", "", "simulate", "-format", "xml"); code != exitUsage {
		t.Errorf("bad format: exit %d, want %d", code, exitUsage)
	}
	if code, _, _ := cli(t, "nats://127.0.0.1:1", "", "simulate", "-h"); code != exitOK {
		t.Errorf("-h: exit %d, want 0", code)
	}
}

// The pipelines scenario: a second table with each policy's pipeline
// success, and the CSV's pipeline columns.
func TestSimulatePipelines(t *testing.T) {
	t.Parallel()
	tab, _, err := simulateCLI(t, "-scenario", "pipelines", "-policy", "reliability,latency", "-tasks", "2000", "-pipelines", "0.5")
	if err != nil || !strings.Contains(tab, "succeeded %") || strings.Count(tab, "\n") != 10 {
		t.Fatalf("table: %v\n%s", err, tab)
	}
	out, _, err := simulateCLI(t, "-scenario", "pipelines", "-policy", "reliability", "-tasks", "2000", "-format", "csv")
	rows, rerr := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil || rerr != nil || len(rows) != 3 || !slices.Contains(rows[0], "pipeline_success_pct") {
		t.Fatalf("csv: %v %v\n%s", err, rerr, out)
	}
}

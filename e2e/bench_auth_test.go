package e2e

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mlsched/mlsched/e2e/bench"
)

// TestBenchAuthScenariosRunClean runs a tiny `mlsched-bench -auth` with the
// real binaries: every task completes and succeeds, the cost is reported,
// and no process and no server logs a permission violation (a missing grant
// would make the figures those of a broken run). This test binary is the
// relay process (TestMain). Not parallel: it loads the machine like the
// chaos test does, so the two never overlap.
func TestBenchAuthScenariosRunClean(t *testing.T) {
	requireBinaries(t, "dispatcher", "worker")
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server is not installed (make redis-server): the mlsched scenarios need it")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	o := bench.Options{Tasks: 200, LatencyTasks: 100, Warmup: -1, Rate: 200, Nodes: 2, Models: 1, Concurrency: 8,
		SyncInterval: "2m", Scenarios: []string{bench.ScenarioRelay, bench.ScenarioRelayAuth, bench.ScenarioMlsched, bench.ScenarioMlschedAuth},
		RelayCommand: []string{self, "relay"}, Dir: dir}
	rep, err := bench.Run(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range rep.Scenarios {
		if f := s.Throughput.Failed + s.Latency.Failed; f > 0 {
			t.Errorf("%s: %d tasks failed", s.Name, f)
		}
	}
	if len(rep.AuthCost) != 2 {
		t.Fatalf("auth cost of %d systems, want relay and mlsched: %+v", len(rep.AuthCost), rep.AuthCost)
	}
	for _, c := range rep.AuthCost {
		if c.ThroughputRatio <= 0 || c.P99Ratio <= 0 {
			t.Errorf("%s: ratios not computed: %+v", c.System, c)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, bench.ScenarioMlschedAuth, "auth", "auth.conf")); err != nil {
		t.Errorf("the mlsched-auth scenario ran without auth.conf: %v", err)
	}
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".log") {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(strings.ToLower(line), "violation") || strings.Contains(line, "Authorization Error") {
				t.Errorf("%s: %s", strings.TrimPrefix(path, dir), line)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/mlsched/mlsched/dispatcher/authconf"
	"github.com/mlsched/mlsched/e2e/harness"
	"github.com/mlsched/mlsched/worker/model"
)

func repoPath(t *testing.T, rel string) string {
	t.Helper()
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, rel)
}

// The shipped NATS configuration, and the harness's, fsync every write and
// let tasks above the 1 MiB limit through to be rejected properly.
func TestNATSConfigDurable(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	harnessConf := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(harnessConf, []byte(harness.NATSConfig(14222, 18222, dir)), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{composeNATSConf(t, "deployments/nats/nats.conf"), harnessConf} {
		opts, err := server.ProcessConfigFile(path)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if !opts.JetStream {
			t.Errorf("%s: JetStream is off", path)
		}
		if !opts.SyncAlways {
			t.Errorf("%s: sync_interval is not always", path)
		}
		if opts.StoreDir == "" {
			t.Errorf("%s: no store_dir", path)
		}
		if opts.MaxPayload <= 1<<20 {
			t.Errorf("%s: max_payload %d does not exceed the 1 MiB task limit", path, opts.MaxPayload)
		}
		if opts.HTTPPort == 0 {
			t.Errorf("%s: no monitoring port", path)
		}
	}
}

// Every models file we ship or test with is valid for the worker.
func TestModelsFilesValid(t *testing.T) {
	t.Parallel()
	files, _ := filepath.Glob(repoPath(t, "deployments/models/*.yaml"))
	testdata, _ := filepath.Glob("testdata/*.yaml")
	files = append(files, testdata...)
	for _, want := range []string{repoPath(t, "deployments/models/compose.yaml"), repoPath(t, "deployments/models/digits.yaml"),
		"testdata/node-1.yaml", "testdata/node-2.yaml", "testdata/node-3.yaml"} {
		if !slices.Contains(files, want) {
			t.Fatalf("models file %s missing: %v", want, files)
		}
	}
	for _, f := range files {
		if _, err := model.LoadFile(f); err != nil {
			t.Errorf("%v", err)
		}
	}
}

// The pipeline test's models behave the same on every node, each node serves
// both task types, and together the nodes host all four models.
func TestPipelineModelsConsistent(t *testing.T) {
	t.Parallel()
	rates := map[string]float64{}
	for _, node := range []string{"node-1", "node-2", "node-3"} {
		specs, err := model.LoadFile("testdata/" + node + ".yaml")
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range specs {
			if s.Sim == nil {
				t.Fatalf("%s: %s is not simulated", node, s.Name)
			}
			if r, ok := rates[s.Name]; ok && r != s.Sim.FailureRate {
				t.Errorf("%s fails %g on %s but %g elsewhere", s.Name, s.Sim.FailureRate, node, r)
			}
			rates[s.Name] = s.Sim.FailureRate
			if !slices.Equal(s.Types, []string{"classify", "embed"}) {
				t.Errorf("%s on %s serves %v", s.Name, node, s.Types)
			}
		}
	}
	want := map[string]float64{model00: 0, model02: 0.02, model10: 0.10, model30: 0.30}
	for m, r := range want {
		if got, ok := rates[m]; !ok || got != r {
			t.Errorf("model %s: failure rate %g (present %v), want %g", m, got, ok, r)
		}
	}
	if len(rates) != len(want) {
		t.Errorf("models %v, want exactly %v", rates, want)
	}
}

// The dispatcher and worker containers are health-checked through their
// /readyz: in compose (healthcheck) and in the image (HEALTHCHECK), with the
// binaries' own `healthcheck` command since the images have no shell or curl.
func TestHealthChecksUseReadyz(t *testing.T) {
	t.Parallel()
	df, err := os.ReadFile(repoPath(t, "deployments/Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	stages := strings.Split(string(df), "\nFROM ")
	for _, target := range []string{"dispatcher", "worker"} {
		found := false
		for _, st := range stages {
			if !strings.Contains(strings.SplitN(st, "\n", 2)[0], "AS "+target) {
				continue
			}
			found = true
			if !strings.Contains(st, `CMD ["/usr/local/bin/`+target+`", "healthcheck"]`) || !strings.Contains(st, "HEALTHCHECK ") {
				t.Errorf("Dockerfile stage %s has no HEALTHCHECK running `%s healthcheck`", target, target)
			}
		}
		if !found {
			t.Errorf("Dockerfile has no stage %s", target)
		}
	}
}

// deployments/prometheus: the configuration and the alert rules are valid
// for promtool, and the rules' unit tests (alerts_test.yml) pass: each alert
// fires on what it is about and not on a healthy cluster.
func TestPrometheusConfigAndRules(t *testing.T) {
	t.Parallel()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not installed (Debian package prometheus; make test installs it when run as root)")
	}
	dir := repoPath(t, "deployments/prometheus")
	for _, args := range [][]string{
		{"check", "config", "prometheus.yml"},
		{"check", "rules", "alerts.yml"},
		{"test", "rules", "alerts_test.yml"},
	} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	rules, err := os.ReadFile(filepath.Join(dir, "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, alert := range []string{"MlschedModelSuccessRatioLow", "MlschedModelSuccessRatioDropping",
		"MlschedBacklogGrowing", "MlschedBreakerOpen", "MlschedStatsDegraded", "MlschedStreamNearBound", "MlschedResultsExpireEarly",
		"MlschedRolloutRolledBack", "MlschedRolloutStalled", "MlschedBudgetNearlySpent"} {
		if !strings.Contains(string(rules), "alert: "+alert+"\n") {
			t.Errorf("alerts.yml has no %s", alert)
		}
	}
}

// makeSecrets writes into dir what `make secrets` writes into ./secrets.
func makeSecrets(t *testing.T, dir string) {
	t.Helper()
	if _, err := authconf.Write(dir, authconf.Options{JWT: true, Redis: true, SecretMode: 0o644}); err != nil {
		t.Fatal(err)
	}
}

// composeNATSConf copies a shipped nats-server configuration into a
// temporary directory next to the auth.conf `make secrets` writes, as
// compose mounts them (/etc/nats/nats.conf, /etc/nats/auth.conf), and
// returns its path.
func composeNATSConf(t *testing.T, rel string) string {
	t.Helper()
	dir := t.TempDir()
	makeSecrets(t, filepath.Join(dir, "secrets"))
	conf, err := os.ReadFile(repoPath(t, rel))
	if err != nil {
		t.Fatal(err)
	}
	auth, err := os.ReadFile(filepath.Join(dir, "secrets", authconf.ConfFile))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(path, conf, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, authconf.ConfFile), auth, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

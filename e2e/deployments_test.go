package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"go.yaml.in/yaml/v3"

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

// docker-compose.yml: every worker is its own node, and every service points
// at the right servers.
func TestComposeFile(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(repoPath(t, "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Services map[string]struct {
			Image         string            `yaml:"image"`
			Command       []string          `yaml:"command"`
			ContainerName string            `yaml:"container_name"`
			Environment   map[string]string `yaml:"environment"`
			Volumes       []string          `yaml:"volumes"`
		} `yaml:"services"`
		Volumes map[string]any `yaml:"volumes"`
	}
	if err := yaml.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"nats", "redis", "dispatcher", "worker-1", "worker-2", "worker-3"} {
		if _, ok := f.Services[s]; !ok {
			t.Fatalf("no %s service", s)
		}
	}
	ids := map[string]string{}
	for _, name := range []string{"worker-1", "worker-2", "worker-3"} {
		w := f.Services[name]
		if w.ContainerName != "" {
			t.Errorf("%s has container_name %q", name, w.ContainerName)
		}
		// Each node's key is made for its id in advance (make secrets).
		id := w.Environment["MLSCHED_NODE_ID"]
		if id == "" || ids[id] != "" {
			t.Errorf("%s: MLSCHED_NODE_ID %q empty or also %s's", name, id, ids[id])
		}
		ids[id] = name
		if mf := w.Environment["MLSCHED_MODELS_FILE"]; !strings.HasPrefix(mf, "/models/") {
			t.Errorf("%s models file %q is not in the mounted /models", name, mf)
		} else if _, err := os.Stat(repoPath(t, "deployments/models/"+strings.TrimPrefix(mf, "/models/"))); err != nil {
			t.Errorf("%s models file: %v", name, err)
		}
		if w.Environment["MLSCHED_NATS_URL"] != "nats://nats:4222" {
			t.Errorf("%s MLSCHED_NATS_URL = %q", name, w.Environment["MLSCHED_NATS_URL"])
		}
	}
	d := f.Services["dispatcher"]
	for k, v := range map[string]string{"MLSCHED_NATS_URL": "nats://nats:4222", "MLSCHED_REDIS_URL": "redis://mlsched@redis:6379/0"} {
		if d.Environment[k] != v {
			t.Errorf("dispatcher %s = %q, want %q", k, d.Environment[k], v)
		}
	}
	n := f.Services["nats"]
	if !slices.Equal(n.Command, []string{"-c", "/etc/nats/nats.conf"}) ||
		!slices.Contains(n.Volumes, "./deployments/nats/nats.conf:/etc/nats/nats.conf:ro") ||
		!slices.Contains(n.Volumes, "nats-data:/data") {
		t.Errorf("nats service does not run deployments/nats/nats.conf with a /data volume: %+v", n)
	}
	if _, ok := f.Volumes["nats-data"]; !ok {
		t.Error("volume nats-data is not declared")
	}
	// Redis persists (docs/operations.md: what a restart costs)
	r := f.Services["redis"]
	cmd := strings.Join(r.Command, " ")
	if !strings.Contains(cmd, "--appendonly yes") || !strings.Contains(cmd, "--appendfsync everysec") ||
		!slices.Contains(r.Volumes, "redis-data:/data") {
		t.Errorf("redis service does not keep an append-only file (fsync every second) on a volume: %+v", r)
	}
	if _, ok := f.Volumes["redis-data"]; !ok {
		t.Error("volume redis-data is not declared")
	}
}

// deployments/nats/cluster.conf, as each server of the compose "cluster"
// profile reads it: fsync always, JetStream, one cluster with routes to all
// three servers, replicas spread over zones.
func TestNATSClusterConfig(t *testing.T) {
	data, err := os.ReadFile(repoPath(t, "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Services map[string]struct {
			Hostname    string            `yaml:"hostname"`
			Environment map[string]string `yaml:"environment"`
			Volumes     []string          `yaml:"volumes"`
			Profiles    []string          `yaml:"profiles"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	zones, stores := map[string]bool{}, map[string]bool{}
	var urls []string
	for _, name := range []string{"nats-1", "nats-2", "nats-3"} {
		s, ok := f.Services[name]
		if !ok {
			t.Fatalf("no %s service", name)
		}
		if !slices.Contains(s.Profiles, "cluster") {
			t.Errorf("%s is not in the cluster profile: %v", name, s.Profiles)
		}
		if s.Hostname != name || s.Environment["NATS_SERVER_NAME"] != name {
			t.Errorf("%s: hostname %q, NATS_SERVER_NAME %q: both must be the service name (the routes use it)",
				name, s.Hostname, s.Environment["NATS_SERVER_NAME"])
		}
		if !slices.Contains(s.Volumes, "./deployments/nats/cluster.conf:/etc/nats/nats.conf:ro") {
			t.Errorf("%s does not mount deployments/nats/cluster.conf: %v", name, s.Volumes)
		}
		for _, v := range s.Volumes {
			if strings.HasSuffix(v, ":/data") {
				stores[v] = true
			}
		}
		zones[s.Environment["NATS_ZONE"]] = true
		urls = append(urls, "nats://"+name+":4222")

		t.Setenv("NATS_SERVER_NAME", name)
		t.Setenv("NATS_ZONE", s.Environment["NATS_ZONE"])
		opts, err := server.ProcessConfigFile(composeNATSConf(t, "deployments/nats/cluster.conf"))
		if err != nil {
			t.Fatalf("cluster.conf as %s: %v", name, err)
		}
		if opts.ServerName != name || !opts.JetStream || !opts.SyncAlways || opts.StoreDir != "/data" {
			t.Errorf("cluster.conf as %s: server %q, JetStream %v, sync always %v, store %q", name, opts.ServerName,
				opts.JetStream, opts.SyncAlways, opts.StoreDir)
		}
		if opts.Cluster.Name != "mlsched" || opts.Cluster.Port != 6222 || len(opts.Routes) != 3 {
			t.Errorf("cluster.conf as %s: cluster %q port %d, %d routes; want mlsched, 6222, 3",
				name, opts.Cluster.Name, opts.Cluster.Port, len(opts.Routes))
		}
		for i, r := range opts.Routes {
			if want := fmt.Sprintf("nats-%d:6222", i+1); r.Host != want {
				t.Errorf("cluster.conf route %d is %s, want %s", i, r.Host, want)
			}
		}
		if opts.JetStreamUniqueTag != "az:" || len(opts.Tags) != 1 || opts.Tags[0] != s.Environment["NATS_ZONE"] {
			t.Errorf("cluster.conf as %s: unique_tag %q, tags %v; want az: and the server's NATS_ZONE", name, opts.JetStreamUniqueTag, opts.Tags)
		}
	}
	if len(zones) != 3 || zones[""] {
		t.Errorf("the three servers must be in three zones (NATS_ZONE az:...): %v", zones)
	}
	if len(stores) != 3 {
		t.Errorf("the three servers must have their own store volume: %v", stores)
	}
	for _, name := range []string{"dispatcher-r3", "worker-r3-1", "worker-r3-2", "worker-r3-3"} {
		s, ok := f.Services[name]
		if !ok {
			t.Fatalf("no %s service", name)
		}
		if got, want := s.Environment["MLSCHED_NATS_URL"], strings.Join(urls, ","); got != want {
			t.Errorf("%s MLSCHED_NATS_URL = %q, want %q", name, got, want)
		}
		if s.Environment["MLSCHED_STREAM_REPLICAS"] != "3" {
			t.Errorf("%s MLSCHED_STREAM_REPLICAS = %q, want 3", name, s.Environment["MLSCHED_STREAM_REPLICAS"])
		}
		if !slices.Contains(s.Profiles, "cluster") {
			t.Errorf("%s is not in the cluster profile", name)
		}
	}
}

// The dispatcher and worker containers are health-checked through their
// /readyz: in compose (healthcheck) and in the image (HEALTHCHECK), with the
// binaries' own `healthcheck` command since the images have no shell or curl.
func TestHealthChecksUseReadyz(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(repoPath(t, "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Services map[string]struct {
			Healthcheck struct {
				Test []string `yaml:"test"`
			} `yaml:"healthcheck"`
			Volumes  []string `yaml:"volumes"`
			Profiles []string `yaml:"profiles"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	for svc, bin := range map[string]string{"dispatcher": "dispatcher", "worker-1": "worker", "worker-2": "worker", "worker-3": "worker",
		"dispatcher-r3": "dispatcher", "worker-r3-1": "worker", "worker-digits-1": "worker"} {
		want := []string{"CMD", "/usr/local/bin/" + bin, "healthcheck"}
		if got := f.Services[svc].Healthcheck.Test; !slices.Equal(got, want) {
			t.Errorf("%s healthcheck = %v, want %v", svc, got, want)
		}
	}
	p := f.Services["prometheus"]
	if !slices.Contains(p.Volumes, "./deployments/prometheus:/etc/prometheus:ro") || !slices.Contains(p.Profiles, "monitoring") {
		t.Errorf("prometheus service does not mount deployments/prometheus: %+v", p)
	}
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
		"MlschedBacklogGrowing", "MlschedBreakerOpen", "MlschedStatsDegraded", "MlschedStreamNearBound", "MlschedResultsExpireEarly"} {
		if !strings.Contains(string(rules), "alert: "+alert+"\n") {
			t.Errorf("alerts.yml has no %s", alert)
		}
	}
}

// The compose profile "models" runs the Python model server next to workers
// whose models file points at it, all in the profile.
func TestComposeModelsProfile(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(repoPath(t, "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Services map[string]struct {
			Build struct {
				Target string `yaml:"target"`
			} `yaml:"build"`
			Environment map[string]string `yaml:"environment"`
			Profiles    []string          `yaml:"profiles"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	for svc, target := range map[string]string{"digits": "digits", "digits-flaky": "digits", "worker-digits-1": "sklearn-worker", "worker-digits-2": "sklearn-worker"} {
		s, ok := f.Services[svc]
		if !ok || s.Build.Target != target || !slices.Contains(s.Profiles, "models") {
			t.Errorf("service %s: %+v, want target %s in profile models", svc, s, target)
		}
	}
	mf := f.Services["worker-digits-1"].Environment["MLSCHED_MODELS_FILE"]
	specs, err := model.LoadFile(repoPath(t, "deployments/models/"+strings.TrimPrefix(mf, "/models/")))
	if err != nil {
		t.Fatal(err)
	}
	urls := map[string]bool{}
	for _, s := range specs {
		if s.HTTP != nil {
			urls[s.HTTP.URL] = true
		}
	}
	if !urls["http://digits:8000"] || !urls["http://digits-flaky:8000"] {
		t.Errorf("%s does not use both model servers: %v", mf, urls)
	}
	df, err := os.ReadFile(repoPath(t, "deployments/Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(df), "AS digits\n") || !strings.Contains(string(df), "COPY deployments/models/digits_server.py") {
		t.Error("Dockerfile has no digits stage running digits_server.py")
	}
}

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/mlsched/mlsched/dispatcher/authconf"
	"github.com/mlsched/mlsched/shared/redisconn"
)

// The compose files as Compose itself reads them (`docker compose config`:
// anchors, merges, -f files and variables resolved). The containers run in
// compose_docker_test.go; these checks are the fast ones, in every `make
// test` where Compose v2 is installed.

type composeModel struct {
	Services map[string]struct {
		Command     []string          `json:"command"`
		Environment map[string]string `json:"environment"`
		Build       struct {
			Target string `json:"target"`
		} `json:"build"`
		Volumes []struct {
			Type, Source, Target string
			ReadOnly             bool `json:"read_only"`
		} `json:"volumes"`
		Ports []struct {
			HostIP    string `json:"host_ip"`
			Target    int    `json:"target"`
			Published string `json:"published"`
		} `json:"ports"`
		Secrets []struct {
			Source, Target string
		} `json:"secrets"`
		Deploy *struct {
			Replicas *int `json:"replicas"`
		} `json:"deploy"`
		Healthcheck *struct {
			Test []string `json:"test"`
		} `json:"healthcheck"`
		Profiles []string `json:"profiles"`
		Hostname string   `json:"hostname"`
	} `json:"services"`
}

// composeConfig is `docker compose config` of the files (after
// docker-compose.yml) with every profile.
func composeConfig(t *testing.T, files ...string) composeModel {
	t.Helper()
	if err := exec.Command("docker", "compose", "version").Run(); err != nil {
		t.Skip("docker compose (v2) is not installed (make compose-plugin builds it): the compose files were not checked")
	}
	args := []string{"compose", "-f", "docker-compose.yml"}
	for _, f := range files {
		args = append(args, "-f", f)
	}
	args = append(args, "--profile", "*", "config", "--format", "json")
	cmd := exec.Command("docker", args...)
	cmd.Dir = repoPath(t, ".")
	// no .env of make images: the public defaults
	cmd.Env = append(os.Environ(), "MLSCHED_SECRETS=./secrets")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("docker %s: %v", strings.Join(args, " "), err)
	}
	var m composeModel
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func secretNames(ss []struct{ Source, Target string }) []string {
	var out []string
	for _, s := range ss {
		out = append(out, s.Source)
	}
	slices.Sort(out)
	return out
}

// docker-compose.yml: the default services, a scalable worker whose
// replicas make their own identity, only its own secrets for each service,
// unauthenticated ports on loopback, persistent stores, one short file.
func TestComposeConfig(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(repoPath(t, "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(data), "\n"); n > 240 {
		t.Errorf("docker-compose.yml has %d lines: keep it under 240", n)
	}
	m := composeConfig(t)
	for name, want := range map[string][]string{
		"nats": nil, "redis": {authconf.RedisACLFile}, "dispatcher": {"dispatcher.creds", authconf.RedisPasswordFile},
		"worker": {authconf.PoolKeyFile}, "mlsched": {"admin.creds"}, "prometheus": nil,
		"digits": nil, "digits-flaky": nil, "worker-digits": {authconf.PoolKeyFile}, "dashboard": nil,
	} {
		s, ok := m.Services[name]
		if !ok {
			t.Errorf("no service %s", name)
			continue
		}
		if got := secretNames(s.Secrets); !slices.Equal(got, want) {
			t.Errorf("%s has secrets %v, want %v", name, got, want)
		}
		for _, p := range s.Ports {
			if p.Target != 4222 && p.HostIP != "127.0.0.1" {
				t.Errorf("%s publishes unauthenticated port %d on %q, want 127.0.0.1", name, p.Target, p.HostIP)
			}
		}
	}
	for _, name := range []string{"worker", "worker-digits"} {
		w := m.Services[name]
		if _, set := w.Environment["MLSCHED_NODE_ID"]; set {
			t.Errorf("%s sets MLSCHED_NODE_ID: every replica must be its own node", name)
		}
		if w.Environment["MLSCHED_NATS_POOL_KEY"] != "/run/secrets/"+authconf.PoolKeyFile {
			t.Errorf("%s MLSCHED_NATS_POOL_KEY = %q", name, w.Environment["MLSCHED_NATS_POOL_KEY"])
		}
		if mf := w.Environment["MLSCHED_MODELS_FILE"]; !strings.HasPrefix(mf, "/models/") {
			t.Errorf("%s models file %q is not in the image's /models", name, mf)
		} else if _, err := os.Stat(repoPath(t, "deployments/models/"+strings.TrimPrefix(mf, "/models/"))); err != nil {
			t.Errorf("%s models file: %v", name, err)
		}
	}
	if w := m.Services["worker"]; w.Deploy == nil || w.Deploy.Replicas == nil || *w.Deploy.Replicas != 3 {
		t.Error("worker: want deploy.replicas 3")
	}
	d := m.Services["dispatcher"]
	for k, v := range map[string]string{"MLSCHED_NATS_URL": "nats://nats:4222", "MLSCHED_REDIS_URL": "redis://mlsched@redis:6379/0",
		"MLSCHED_NATS_CREDS": "/run/secrets/dispatcher.creds"} {
		if d.Environment[k] != v {
			t.Errorf("dispatcher %s = %q, want %q", k, d.Environment[k], v)
		}
	}
	if len(d.Ports) != 1 || d.Ports[0].Published != "" || d.Ports[0].HostIP != "127.0.0.1" {
		t.Errorf("dispatcher ports %+v: want an ephemeral port on 127.0.0.1 per replica, so that --scale dispatcher=N does not collide", d.Ports)
	}
	// The documented dashboard address belongs to a service never scaled
	// (issue 40: a re-created dispatcher took the next port of a range).
	db := m.Services["dashboard"]
	if len(db.Ports) != 1 || db.Ports[0].Published != "9090" || db.Ports[0].HostIP != "127.0.0.1" || db.Ports[0].Target != 9090 ||
		strings.Join(db.Command, " ") != "proxy :9090 dispatcher:9090" || db.Build.Target != "dispatcher" {
		t.Errorf("dashboard: ports %+v command %q target %q; want 127.0.0.1:9090 forwarded to dispatcher:9090 by the dispatcher image's proxy",
			db.Ports, db.Command, db.Build.Target)
	}
	// The models files are mounted from the host: changing them needs no rebuild.
	for _, name := range []string{"worker", "worker-digits"} {
		if !slices.ContainsFunc(m.Services[name].Volumes, func(v struct {
			Type, Source, Target string
			ReadOnly             bool `json:"read_only"`
		}) bool {
			return v.Target == "/models" && v.ReadOnly && strings.HasSuffix(v.Source, "deployments/models")
		}) {
			t.Errorf("%s does not mount deployments/models on /models read-only: %+v", name, m.Services[name].Volumes)
		}
	}
	n := m.Services["nats"]
	mounts := map[string]string{}
	for _, v := range n.Volumes {
		mounts[v.Target] = v.Source
	}
	if !strings.HasSuffix(mounts["/etc/nats/nats.conf"], "deployments/nats/nats.conf") || mounts["/data"] != "nats-data" ||
		!strings.HasSuffix(mounts["/etc/nats/auth.conf"], "secrets/auth.conf") {
		t.Errorf("nats does not run deployments/nats/nats.conf with auth.conf and a /data volume: %v", mounts)
	}
	r := m.Services["redis"]
	cmd := strings.Join(r.Command, " ")
	if !strings.Contains(cmd, "--appendonly yes") || !strings.Contains(cmd, "--appendfsync everysec") {
		t.Errorf("redis does not keep an append-only file (fsync every second): %q", cmd)
	}
	for svc, target := range map[string]string{"digits": "digits", "digits-flaky": "digits", "worker-digits": "sklearn-worker",
		"worker": "worker", "dispatcher": "dispatcher", "nats": "nats", "redis": "redis", "prometheus": "prometheus", "mlsched": "mlsched"} {
		if got := m.Services[svc].Build.Target; got != target {
			t.Errorf("%s builds target %q, want %q", svc, got, target)
		}
	}
	df, err := os.ReadFile(repoPath(t, "deployments/Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	if regexp.MustCompile(`(?m)^(# syntax=|RUN --mount)`).Match(df) {
		t.Error("deployments/Dockerfile needs BuildKit extras (# syntax=, RUN --mount): the builtin frontend must build it")
	}
}

// deployments/compose/cluster.yml on top: the nats service and two peers,
// each its own zone and store, and every client gets the three URLs.
func TestComposeClusterFile(t *testing.T) { // not parallel: t.Setenv
	m := composeConfig(t, "deployments/compose/cluster.yml")
	zones, stores := map[string]bool{}, map[string]bool{}
	for i, name := range []string{"nats", "nats-2", "nats-3"} {
		s, ok := m.Services[name]
		if !ok {
			t.Fatalf("no %s service", name)
		}
		srv := fmt.Sprintf("nats-%d", i+1)
		if s.Hostname != srv || s.Environment["NATS_SERVER_NAME"] != srv {
			t.Errorf("%s: hostname %q, NATS_SERVER_NAME %q, want %s", name, s.Hostname, s.Environment["NATS_SERVER_NAME"], srv)
		}
		mounts := map[string]string{}
		for _, v := range s.Volumes {
			mounts[v.Target] = v.Source
		}
		if !strings.HasSuffix(mounts["/etc/nats/nats.conf"], "deployments/nats/cluster.conf") {
			t.Errorf("%s does not run cluster.conf: %v", name, mounts)
		}
		stores[mounts["/data"]] = true
		zones[s.Environment["NATS_ZONE"]] = true
		t.Setenv("NATS_SERVER_NAME", srv)
		t.Setenv("NATS_ZONE", s.Environment["NATS_ZONE"])
		opts, err := server.ProcessConfigFile(composeNATSConf(t, "deployments/nats/cluster.conf"))
		if err != nil {
			t.Fatalf("cluster.conf as %s: %v", srv, err)
		}
		if opts.ServerName != srv || !opts.JetStream || !opts.SyncAlways || opts.StoreDir != "/data" ||
			opts.Cluster.Name != "mlsched" || len(opts.Routes) != 3 || opts.JetStreamUniqueTag != "az:" {
			t.Errorf("cluster.conf as %s: server %q JetStream %v sync %v store %q cluster %q routes %d unique tag %q", srv,
				opts.ServerName, opts.JetStream, opts.SyncAlways, opts.StoreDir, opts.Cluster.Name, len(opts.Routes), opts.JetStreamUniqueTag)
		}
		for j, r := range opts.Routes {
			if want := fmt.Sprintf("nats-%d:6222", j+1); r.Host != want {
				t.Errorf("cluster.conf route %d is %s, want %s", j, r.Host, want)
			}
		}
	}
	if len(zones) != 3 || zones[""] || len(stores) != 3 || stores[""] {
		t.Errorf("three zones and three stores wanted: %v %v", zones, stores)
	}
	for _, name := range []string{"dispatcher", "worker", "mlsched"} {
		e := m.Services[name].Environment
		if e["MLSCHED_NATS_URL"] != "nats://nats-1:4222,nats://nats-2:4222,nats://nats-3:4222" || e["MLSCHED_STREAM_REPLICAS"] != "3" {
			t.Errorf("%s: MLSCHED_NATS_URL %q MLSCHED_STREAM_REPLICAS %q", name, e["MLSCHED_NATS_URL"], e["MLSCHED_STREAM_REPLICAS"])
		}
	}
}

// deployments/compose/sentinel.yml on top: redis becomes the first data
// node, a replica and three sentinels, and the dispatcher follows them.
func TestComposeSentinelFile(t *testing.T) {
	t.Parallel()
	m := composeConfig(t, "deployments/compose/sentinel.yml")
	for name, want := range map[string]string{"redis": "redis-start data redis-1.conf", "redis-2": "redis-start data redis-2.conf",
		"sentinel-1": "redis-start sentinel", "sentinel-2": "redis-start sentinel", "sentinel-3": "redis-start sentinel"} {
		s, ok := m.Services[name]
		if !ok {
			t.Fatalf("no %s service", name)
		}
		if got := strings.Join(s.Command, " "); got != want {
			t.Errorf("%s command %q, want %q", name, got, want)
		}
		if s.Healthcheck == nil && name != "redis" {
			t.Errorf("%s has no health check", name)
		}
	}
	d := m.Services["dispatcher"]
	o, err := redisconn.Parse(redisconn.Config{URL: d.Environment["MLSCHED_REDIS_URL"]})
	if err != nil {
		t.Fatal(err)
	}
	if o.Kind != redisconn.Sentinel || o.Failover.MasterName != "mlsched" || len(o.Failover.SentinelAddrs) != 3 ||
		o.Failover.Username != authconf.RedisUser {
		t.Errorf("dispatcher MLSCHED_REDIS_URL %q: want the 3 sentinels, master mlsched, user %s", d.Environment["MLSCHED_REDIS_URL"], authconf.RedisUser)
	}
	if _, err := os.Stat(filepath.Join(repoPath(t, "deployments/redis"), "start.sh")); err != nil {
		t.Error(err)
	}
}

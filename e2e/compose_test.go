package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/redis/go-redis/v9"
	"go.yaml.in/yaml/v3"

	"github.com/mlsched/mlsched/e2e/harness"
	"github.com/mlsched/mlsched/shared/authconf"
	"github.com/mlsched/mlsched/shared/natsconn"
	"github.com/mlsched/mlsched/shared/protocol"
)

// composeService is what the tests read of a docker-compose.yml service
// (YAML anchors and merge keys resolved, as compose does).
type composeService struct {
	Hostname string `yaml:"hostname"`
	Build    struct {
		Target string `yaml:"target"`
	} `yaml:"build"`
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	Volumes     []string          `yaml:"volumes"`
	Secrets     []string          `yaml:"secrets"`
	Profiles    []string          `yaml:"profiles"`
}

type composeFile struct {
	Services map[string]composeService `yaml:"services"`
	Secrets  map[string]struct {
		File string `yaml:"file"`
	} `yaml:"secrets"`
}

func loadCompose(t *testing.T) composeFile {
	t.Helper()
	data, err := os.ReadFile(repoPath(t, "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var f composeFile
	if err := yaml.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	return f
}

// composeNodes is the node list `make secrets` gives mlsched auth init.
func composeNodes(t *testing.T) []string {
	t.Helper()
	mk, err := os.ReadFile(repoPath(t, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^COMPOSE_NODES \?= (\S+)$`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("Makefile: no COMPOSE_NODES ?= ...")
	}
	if !strings.Contains(string(mk), "auth init -compose -dir secrets -nodes $(COMPOSE_NODES)") {
		t.Fatal("Makefile: make secrets does not run mlsched auth init -compose -dir secrets -nodes $(COMPOSE_NODES)")
	}
	return strings.Split(string(m[1]), ",")
}

// makeSecrets writes into dir what `make secrets` writes into ./secrets.
func makeSecrets(t *testing.T, dir string) {
	t.Helper()
	if _, err := authconf.Write(dir, authconf.Options{Nodes: composeNodes(t), Redis: true, SecretMode: 0o644}); err != nil {
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

// natsClients are the services that connect to NATS, with the seed each
// must be given: a dispatcher's, the CLI's admin key, a worker's node key.
func natsClients(t *testing.T, f composeFile) map[string]string {
	t.Helper()
	out := map[string]string{}
	for name, s := range f.Services {
		if s.Environment["MLSCHED_NATS_URL"] == "" {
			continue
		}
		switch {
		case strings.HasPrefix(name, "dispatcher"):
			out[name] = authconf.Identity{Role: authconf.Dispatcher}.Name() + ".nk"
		case name == "mlsched":
			out[name] = authconf.Identity{Role: authconf.Admin}.Name() + ".nk"
		case strings.HasPrefix(name, "worker"):
			out[name] = authconf.Identity{Role: authconf.Node, NodeID: s.Environment["MLSCHED_NODE_ID"]}.Name() + ".nk"
		default:
			t.Errorf("service %s connects to NATS but is neither dispatcher, worker nor the CLI: which key?", name)
		}
	}
	return out
}

// TestComposeUsesAuth: docker-compose.yml runs with authorization by
// default. Every nats-server includes auth.conf, which defines users (no
// anonymous access); every service that connects to NATS is given exactly
// its role's seed as a compose secret and points MLSCHED_NATS_NKEY at it;
// every secret file is one `make secrets` writes; Redis loads the ACL file
// and the dispatcher logs in as its user with a password file. No
// credential is written in the file itself.
func TestComposeUsesAuth(t *testing.T) {
	f := loadCompose(t)
	made := t.TempDir()
	makeSecrets(t, made)
	for name, sec := range f.Secrets {
		if sec.File != "./secrets/"+name {
			t.Errorf("secret %s comes from %q, want ./secrets/%s", name, sec.File, name)
		} else if _, err := os.Stat(filepath.Join(made, name)); err != nil {
			t.Errorf("secret %s: make secrets does not write it (%v)", name, err)
		}
	}
	clients := natsClients(t, f)
	if len(clients) < 8 {
		t.Errorf("only %d NATS clients found: %v", len(clients), clients)
	}
	for name, seed := range clients {
		s := f.Services[name]
		if got := s.Environment["MLSCHED_NATS_NKEY"]; got != "/run/secrets/"+seed {
			t.Errorf("%s: MLSCHED_NATS_NKEY = %q, want /run/secrets/%s", name, got, seed)
		}
		if !slices.Contains(s.Secrets, seed) {
			t.Errorf("%s is not given the secret %s (it has %v)", name, seed, s.Secrets)
		}
		if _, ok := f.Secrets[seed]; !ok {
			t.Errorf("%s: secret %s is not declared", name, seed)
		}
		for _, sec := range s.Secrets { // least privilege: nobody holds another's key
			if strings.HasSuffix(sec, ".nk") && sec != seed {
				t.Errorf("%s is also given %s", name, sec)
			}
		}
		for _, v := range []string{"MLSCHED_NATS_USER", "MLSCHED_NATS_TOKEN_FILE", "MLSCHED_NATS_CREDS"} {
			if s.Environment[v] != "" {
				t.Errorf("%s sets %s besides its nkey", name, v)
			}
		}
		if strings.Contains(s.Environment["MLSCHED_NATS_URL"], "@") {
			t.Errorf("%s: credentials in MLSCHED_NATS_URL", name)
		}
	}
	// Services that run together must not share a node id (their keys would
	// be one node's): the default set, and each profile with it.
	byProfile := map[string]map[string]string{}
	for name, s := range f.Services {
		id := s.Environment["MLSCHED_NODE_ID"]
		if id == "" {
			continue
		}
		prof := strings.Join(s.Profiles, ",")
		if byProfile[prof] == nil {
			byProfile[prof] = map[string]string{}
		}
		if other := byProfile[prof][id]; other != "" {
			t.Errorf("%s and %s are both node %s", name, other, id)
		}
		byProfile[prof][id] = name
	}

	natsServers := 0
	for name, s := range f.Services {
		if !slices.Equal(s.Command, []string{"-c", "/etc/nats/nats.conf"}) {
			continue
		}
		natsServers++
		if !slices.Contains(s.Volumes, "./secrets/auth.conf:/etc/nats/auth.conf:ro") {
			t.Errorf("%s does not mount ./secrets/auth.conf next to its nats.conf: %v", name, s.Volumes)
		}
	}
	if natsServers != 4 {
		t.Errorf("%d nats-server services, want nats and nats-1..3", natsServers)
	}
	for _, rel := range []string{"deployments/nats/nats.conf", "deployments/nats/cluster.conf"} {
		t.Setenv("NATS_SERVER_NAME", "nats-1")
		t.Setenv("NATS_ZONE", "az:a")
		opts, err := server.ProcessConfigFile(composeNATSConf(t, rel))
		if err != nil {
			t.Fatalf("%s with auth.conf: %v", rel, err)
		}
		if len(opts.Nkeys) < 3+len(composeNodes(t)) || opts.NoAuthUser != "" || len(opts.Users) != 0 {
			t.Errorf("%s: %d nkey users, no_auth_user %q, %d other users: want every role's key and no anonymous access",
				rel, len(opts.Nkeys), opts.NoAuthUser, len(opts.Users))
		}
	}

	r := f.Services["redis"]
	if cmd := strings.Join(r.Command, " "); !strings.Contains(cmd, "--aclfile /run/secrets/"+authconf.RedisACLFile) ||
		!slices.Contains(r.Secrets, authconf.RedisACLFile) {
		t.Errorf("redis does not load the ACL file from its secret: %v, secrets %v", r.Command, r.Secrets)
	}
	for _, name := range []string{"dispatcher", "dispatcher-r3"} {
		d := f.Services[name]
		if d.Environment["MLSCHED_REDIS_URL"] != "redis://"+authconf.RedisUser+"@redis:6379/0" ||
			d.Environment["MLSCHED_REDIS_PASSWORD_FILE"] != "/run/secrets/"+authconf.RedisPasswordFile ||
			!slices.Contains(d.Secrets, authconf.RedisPasswordFile) {
			t.Errorf("%s does not log in to Redis as %s with its password file: %v, secrets %v", name, authconf.RedisUser, d.Environment, d.Secrets)
		}
	}
	// The one-line step is documented where a user starts.
	step := "auth init -compose -dir secrets -nodes " + strings.Join(composeNodes(t), ",")
	for _, doc := range []string{"README.md", "docs/security.md", "docker-compose.yml"} {
		b, err := os.ReadFile(repoPath(t, doc))
		if err != nil || !strings.Contains(string(b), "make secrets") || !strings.Contains(string(b), step) {
			t.Errorf("%s does not give the one-line step `make secrets` (%s) (%v)", doc, step, err)
		}
	}
	di, err := os.ReadFile(repoPath(t, "deployments/Dockerfile.dockerignore"))
	if err != nil || !regexp.MustCompile(`(?m)^/?secrets/?$`).Match(di) {
		t.Errorf("deployments/Dockerfile.dockerignore does not keep ./secrets out of the images (%v)", err)
	}
}

// composeRun runs services of docker-compose.yml as local processes with
// the environment compose gives them: the server host names point at local
// servers on free ports, /run/secrets at a directory holding only the
// service's own secrets, /models at deployments/models, and the HTTP
// listeners on free ports (compose gives each container its own).
type composeRun struct {
	t                   *testing.T
	c                   *harness.Cluster
	f                   composeFile
	secrets             string
	natsAddr, redisAddr string
}

func (r *composeRun) env(name string) map[string]string {
	r.t.Helper()
	s, ok := r.f.Services[name]
	if !ok {
		r.t.Fatalf("no service %s", name)
	}
	own := filepath.Join(r.c.Dir, "run-secrets", name)
	if err := os.MkdirAll(own, 0o700); err != nil {
		r.t.Fatal(err)
	}
	for _, sec := range s.Secrets {
		b, err := os.ReadFile(filepath.Join(r.secrets, sec))
		if err != nil {
			r.t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(own, sec), b, 0o600); err != nil {
			r.t.Fatal(err)
		}
	}
	rewrite := strings.NewReplacer("nats:4222", r.natsAddr, "redis:6379", r.redisAddr,
		"/run/secrets/", own+"/", "/models/", repoPath(r.t, "deployments/models")+"/")
	env := map[string]string{}
	for k, v := range s.Environment {
		env[k] = rewrite.Replace(v)
	}
	env["MLSCHED_HTTP_ADDR"] = "127.0.0.1:0"
	return env
}

// cli runs the mlsched service's command line.
func (r *composeRun) cli(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, harness.Binary(r.t, "mlsched"), args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range r.env("mlsched") {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestComposeDeploymentRuns runs the default docker-compose.yml deployment
// (nats, redis, dispatcher, worker-1..3, and the mlsched CLI) as local
// processes with exactly the configuration and environment compose gives
// them and the secrets `make secrets` writes: nats-server from
// deployments/nats/nats.conf including auth.conf, redis-server with the
// compose command and its ACL file. The workers start first (compose starts
// in any order) and wait for the dispatcher; then a task submitted with the
// CLI's key flows end to end, the dispatcher is not degraded (Redis took
// its password), anonymous clients are refused and no permission is
// violated anywhere.
func TestComposeDeploymentRuns(t *testing.T) {
	requireBinaries(t, "dispatcher", "worker", "mlsched")
	rbin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server is not installed (make redis-server)")
	}
	f := loadCompose(t)
	c := harness.New(t)
	r := &composeRun{t: t, c: c, f: f, secrets: filepath.Join(c.Dir, "secrets")}
	makeSecrets(t, r.secrets)

	// nats: compose's command, with its config and auth.conf where compose
	// mounts them, on free ports (flags override the file).
	natsSvc := f.Services["nats"]
	etc := filepath.Join(c.Dir, "etc-nats")
	if err := os.MkdirAll(etc, 0o755); err != nil {
		t.Fatal(err)
	}
	mounts := strings.NewReplacer("./deployments/", repoPath(t, "deployments")+"/", "./secrets/", r.secrets+"/")
	for _, v := range natsSvc.Volumes {
		parts := strings.Split(v, ":")
		if !strings.HasPrefix(parts[1], "/etc/nats/") {
			continue
		}
		b, err := os.ReadFile(mounts.Replace(parts[0]))
		if err != nil {
			t.Fatal(err)
		}
		if parts[1] == "/etc/nats/nats.conf" { // the nats-data volume, here a directory of the test
			conf := strings.Replace(string(b), "store_dir: /data", fmt.Sprintf("store_dir: %q", filepath.Join(c.Dir, "nats-data")), 1)
			if conf == string(b) {
				t.Fatal("deployments/nats/nats.conf: no store_dir: /data to point at the test's directory")
			}
			b = []byte(conf)
		}
		if err := os.WriteFile(filepath.Join(etc, strings.TrimPrefix(parts[1], "/etc/nats/")), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	port, err1 := harness.FreePort()
	mport, err2 := harness.FreePort()
	rport, err3 := harness.FreePort()
	for _, err := range []error{err1, err2, err3} {
		if err != nil {
			t.Fatal(err)
		}
	}
	args := strings.Split(strings.ReplaceAll(strings.Join(natsSvc.Command, "\x00"), "/etc/nats/", etc+"/"), "\x00")
	args = append(args, "-a", "127.0.0.1", "-p", strconv.Itoa(port), "-m", strconv.Itoa(mport))
	np := c.Process("nats", harness.Binary(t, "nats-server"), args, nil)
	if err := np.StartReady(func(ctx context.Context) error {
		nc, err := natsconn.Connect(natsconn.Config{URL: fmt.Sprintf("nats://127.0.0.1:%d", port), Nkey: filepath.Join(r.secrets, "admin.nk")}, natsconn.Conn{})
		if err == nil {
			nc.Close()
		}
		return err
	}); err != nil {
		t.Fatalf("nats-server with compose's configuration: %v", err)
	}
	r.natsAddr = fmt.Sprintf("127.0.0.1:%d", port)

	// redis: compose's command, secrets and port rewritten, no persistence.
	redisSvc := f.Services["redis"]
	rargs := []string{}
	for _, a := range redisSvc.Command[1:] {
		rargs = append(rargs, strings.ReplaceAll(a, "/run/secrets/", r.secrets+"/"))
	}
	rargs = append(rargs, "--port", strconv.Itoa(rport), "--bind", "127.0.0.1", "--dir", t.TempDir(), "--daemonize", "no")
	rp := c.Process("redis", rbin, rargs, nil)
	r.redisAddr = fmt.Sprintf("127.0.0.1:%d", rport)
	if err := rp.StartReady(func(ctx context.Context) error { // compose's health check: PING as the default user
		cl := redis.NewClient(&redis.Options{Addr: r.redisAddr, MaxRetries: -1})
		defer cl.Close()
		return cl.Ping(ctx).Err()
	}); err != nil {
		t.Fatalf("redis-server with compose's command: %v", err)
	}

	if nc, err := natsconn.Connect(natsconn.Config{URL: "nats://" + r.natsAddr}, natsconn.Conn{}); !natsconn.IsAuthError(err) {
		t.Errorf("anonymous connection: want an authorization error, got %v", err)
		if nc != nil {
			nc.Close()
		}
	}

	var workers []*harness.Process
	for _, name := range []string{"worker-1", "worker-2", "worker-3"} {
		w := c.Process(name, harness.Binary(t, "worker"), nil, r.env(name))
		if err := w.Start(); err != nil {
			t.Fatal(err)
		}
		workers = append(workers, w)
	}
	for _, w := range workers {
		harness.Eventually(t, harness.ReadyTimeout, w.Name+" waits for the dispatcher", func() error {
			if !w.Running() {
				return fmt.Errorf("%s exited:\n%s", w.Name, w.Logs())
			}
			if !strings.Contains(w.Logs(), "waiting for the dispatcher to create stream") {
				return fmt.Errorf("%s does not say it waits", w.Name)
			}
			return nil
		})
	}
	d := c.Process("dispatcher", harness.Binary(t, "dispatcher"), nil, r.env("dispatcher"))
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	harness.Eventually(t, harness.ReadyTimeout, "the dispatcher sees the three workers, not degraded", func() error {
		if !d.Running() {
			return fmt.Errorf("the dispatcher exited:\n%s", d.Logs())
		}
		out, err := r.cli(ctx, "stats", "-json")
		if err != nil {
			return fmt.Errorf("mlsched stats: %v: %s", err, out)
		}
		var rep protocol.StatsReport
		if err := json.Unmarshal([]byte(strings.SplitN(out, "\n", 2)[0]), &rep); err != nil {
			return fmt.Errorf("mlsched stats -json: %v: %s", err, out)
		}
		if rep.Degraded {
			return fmt.Errorf("the dispatcher is degraded: %s", rep.DegradedReason)
		}
		if len(rep.Nodes) != 3 {
			return fmt.Errorf("the dispatcher sees %d nodes", len(rep.Nodes))
		}
		return nil
	})
	out, err := r.cli(ctx, "submit", "-type", "classify", "-payload", `{"text":"hello"}`, "-models", "slow-solid",
		"-wait", "-wait-timeout", "2m", "-progress", "0")
	if err != nil || !strings.Contains(out, `"status":"succeeded"`) {
		t.Fatalf("mlsched submit -wait with the CLI's key: %v\n%s", err, out)
	}

	// The one refusal expected: a worker's attempt to create the streams
	// before the dispatcher did (docs/security.md).
	expected := regexp.MustCompile(`mlsched-worker-worker-\d.* Publish Violation - Subject "\$JS\.API\.STREAM\.CREATE\.|Permissions Violation for Publish to \\"\$JS\.API\.STREAM\.CREATE\.`)
	for _, p := range append([]*harness.Process{np, d}, workers...) {
		for _, line := range strings.Split(p.Logs(), "\n") {
			bad := strings.Contains(strings.ToLower(line), "violation") || strings.Contains(line, "Authorization Error")
			if bad && (p == d || !expected.MatchString(line)) {
				t.Errorf("%s: %s", p.Name, line)
			}
		}
	}
}

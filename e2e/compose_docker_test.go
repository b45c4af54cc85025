package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/dispatcher/authconf"
	"github.com/mlsched/mlsched/shared/client"
	"github.com/mlsched/mlsched/shared/natsconn"
	"github.com/mlsched/mlsched/shared/topology"
	"github.com/mlsched/mlsched/worker"
)

// The compose tests run docker-compose.yml on real containers (make
// compose-test, make chaos-compose, which build the images first with make
// images). They never publish on a fixed host port: every published port is
// an ephemeral one on 127.0.0.1, through the *_PUBLISH variables of the
// compose file. Each run is its own project, removed with its volumes and
// networks at the end; the containers' logs are in the test output when it
// fails.

// composeProject is one `docker compose -p NAME` project of the repository.
type composeProject struct {
	t       *testing.T
	name    string
	root    string
	files   []string
	secrets string
	env     []string
	logFile string
	logCmd  *exec.Cmd

	mu    sync.Mutex
	scale map[string]int
}

// requireCompose skips unless the compose tests were asked for and Docker
// with Compose v2 is reachable.
func requireCompose(t *testing.T) {
	t.Helper()
	if os.Getenv("MLSCHED_COMPOSE_TEST") != "1" {
		t.Skip("compose test on real containers: run `make compose-test` (MLSCHED_COMPOSE_TEST=1; it builds the images first)")
	}
	if err := exec.Command("docker", "info").Run(); err != nil {
		t.Skipf("no Docker daemon reachable (docker info: %v): the compose test needs one", err)
	}
	out, err := exec.Command("docker", "compose", "version").CombinedOutput()
	if err != nil {
		t.Fatalf("docker compose (v2) is not installed (make compose-plugin builds it): %v: %s", err, out)
	}
	t.Logf("%s", strings.TrimSpace(string(out)))
}

func newComposeProject(t *testing.T, prefix string, files ...string) *composeProject {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	p := &composeProject{t: t, name: prefix + "-" + hex.EncodeToString(b), root: repoPath(t, "."),
		files: append([]string{"docker-compose.yml"}, files...), secrets: filepath.Join(t.TempDir(), "secrets"),
		scale: map[string]int{}}
	p.logFile = filepath.Join(t.TempDir(), "compose.log")
	p.env = append(os.Environ(),
		"MLSCHED_SECRETS="+p.secrets,
		// every published port ephemeral, on loopback
		"MLSCHED_NATS_PUBLISH=127.0.0.1:", "MLSCHED_NATS2_PUBLISH=127.0.0.1:", "MLSCHED_NATS3_PUBLISH=127.0.0.1:",
		"MLSCHED_NATS_MONITOR_PUBLISH=127.0.0.1:",
		"MLSCHED_HTTP_PUBLISH=127.0.0.1:", "MLSCHED_PROMETHEUS_PUBLISH=127.0.0.1:")
	if ps := p.psAll(); ps != "" {
		t.Fatalf("project %s is not clean: %s", p.name, ps)
	}
	t.Cleanup(p.down)
	return p
}

func (p *composeProject) args(args ...string) []string {
	a := []string{"compose", "-p", p.name}
	for _, f := range p.files {
		a = append(a, "-f", f)
	}
	return append(a, args...)
}

// run runs docker compose with args and returns its combined output.
func (p *composeProject) run(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "docker", p.args(args...)...)
	cmd.Dir, cmd.Env = p.root, p.env
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("docker %s: %w\n%s", strings.Join(p.args(args...), " "), err, out)
	}
	return string(out), nil
}

func (p *composeProject) must(ctx context.Context, args ...string) string {
	p.t.Helper()
	out, err := p.run(ctx, args...)
	if err != nil {
		p.t.Fatal(err)
	}
	return out
}

// docker runs a plain docker command.
func docker(ctx context.Context, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, "docker", args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("docker %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return strings.TrimSpace(string(out)), nil
}

// psAll lists every container, volume and network of the project.
func (p *composeProject) psAll() string {
	label := "label=com.docker.compose.project=" + p.name
	var left []string
	for _, kind := range [][]string{{"ps", "-aq"}, {"volume", "ls", "-q"}, {"network", "ls", "-q"}} {
		out, _ := docker(context.Background(), append(kind, "--filter", label)...)
		if out != "" {
			left = append(left, kind[0]+": "+strings.Join(strings.Fields(out), " "))
		}
	}
	return strings.Join(left, "; ")
}

// followLogs keeps `docker compose logs -f` of the project in a file, so
// that the logs of containers a scale-in removed are kept too.
func (p *composeProject) followLogs() {
	f, err := os.Create(p.logFile)
	if err != nil {
		p.t.Fatal(err)
	}
	cmd := exec.Command("docker", p.args("logs", "-f", "--no-color", "-t")...)
	cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = p.root, p.env, f, f
	if err := cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	p.logCmd = cmd
}

// refollow restarts the log follower, which stops following containers
// created after it started.
func (p *composeProject) refollow() {
	if p.logCmd != nil {
		_ = p.logCmd.Process.Kill()
		_ = p.logCmd.Wait()
	}
	f, err := os.OpenFile(p.logFile, os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return
	}
	cmd := exec.Command("docker", p.args("logs", "-f", "--no-color", "-t", "--since", "1s")...)
	cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = p.root, p.env, f, f
	if cmd.Start() == nil {
		p.logCmd = cmd
	}
}

func (p *composeProject) logs() string {
	b, _ := os.ReadFile(p.logFile)
	return string(b)
}

// down removes the project (containers, volumes, networks), after putting
// the logs in the output of a failed test, and checks nothing is left.
func (p *composeProject) down() {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if p.t.Failed() {
		out, _ := p.run(ctx, "ps", "-a")
		p.t.Logf("containers at failure:\n%s", out)
		if l := p.logs(); l != "" {
			p.t.Logf("container logs (followed):\n%s", tail(l, 400))
		} else {
			out, _ := p.run(ctx, "logs", "--no-color", "--tail", "200")
			p.t.Logf("container logs:\n%s", out)
		}
	}
	if p.logCmd != nil {
		_ = p.logCmd.Process.Kill()
		_ = p.logCmd.Wait()
	}
	// unpause first: a paused container cannot be stopped
	if ids, _ := docker(ctx, "ps", "-q", "--filter", "status=paused", "--filter", "label=com.docker.compose.project="+p.name); ids != "" {
		_, _ = docker(ctx, append([]string{"unpause"}, strings.Fields(ids)...)...)
	}
	if out, err := p.run(ctx, "--profile", "*", "down", "-v", "--remove-orphans", "-t", "5"); err != nil {
		p.t.Errorf("compose down: %v\n%s", err, out)
	}
	if left := p.psAll(); left != "" {
		p.t.Errorf("left after compose down: %s", left)
	}
}

func tail(s string, lines int) string {
	l := strings.Split(s, "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}

// hostPort is the 127.0.0.1:port a service's container port is published on.
func (p *composeProject) hostPort(ctx context.Context, service string, port, index int) string {
	p.t.Helper()
	out := strings.TrimSpace(p.must(ctx, "port", "--index", fmt.Sprint(index), service, fmt.Sprint(port)))
	if !strings.HasPrefix(out, "127.0.0.1:") {
		p.t.Fatalf("%s:%d is published on %q, want 127.0.0.1", service, port, out)
	}
	return out
}

// containers are the ids of the service's running containers.
func (p *composeProject) containers(ctx context.Context, service string) []string {
	out, _ := p.run(ctx, "ps", "-q", service)
	return strings.Fields(out)
}

type psEntry struct {
	Name, Service, State, Health string
}

func (p *composeProject) ps(ctx context.Context) []psEntry {
	p.t.Helper()
	out := p.must(ctx, "ps", "--format", "json")
	var entries []psEntry
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line == "" {
			continue
		}
		var e psEntry
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			var many []psEntry // some versions print one array
			if err2 := json.Unmarshal([]byte(line), &many); err2 != nil {
				p.t.Fatalf("compose ps: %v: %s", err, line)
			}
			entries = append(entries, many...)
			continue
		}
		entries = append(entries, e)
	}
	return entries
}

// allHealthy waits until every running container reports healthy.
func (p *composeProject) allHealthy(ctx context.Context, d time.Duration) []psEntry {
	p.t.Helper()
	deadline := time.Now().Add(d)
	for {
		entries := p.ps(ctx)
		var bad []string
		for _, e := range entries {
			if e.State != "running" || e.Health != "healthy" {
				bad = append(bad, fmt.Sprintf("%s %s/%s", e.Name, e.State, e.Health))
			}
		}
		if len(bad) == 0 && len(entries) > 0 {
			return entries
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("not every service is healthy after %v: %v", d, bad)
		}
		time.Sleep(time.Second)
	}
}

// setScale scales services (with every other scale kept) and waits for
// every container to be healthy.
func (p *composeProject) setScale(ctx context.Context, svcScale map[string]int, profiles ...string) error {
	p.mu.Lock()
	for s, n := range svcScale {
		p.scale[s] = n
	}
	args := []string{}
	for _, pr := range profiles {
		args = append(args, "--profile", pr)
	}
	args = append(args, "up", "-d", "--no-recreate", "--no-build", "--wait", "--wait-timeout", "120")
	for s, n := range p.scale {
		args = append(args, "--scale", fmt.Sprintf("%s=%d", s, n))
	}
	p.mu.Unlock()
	_, err := p.run(ctx, args...)
	p.refollow()
	return err
}

// composeSecrets runs `make secrets` into the project's secrets directory.
func (p *composeProject) makeSecrets(ctx context.Context) {
	p.t.Helper()
	cmd := exec.CommandContext(ctx, "make", "--no-print-directory", "secrets", "SECRETS_DIR="+p.secrets)
	cmd.Dir = p.root
	if out, err := cmd.CombinedOutput(); err != nil {
		p.t.Fatalf("make secrets: %v\n%s", err, out)
	}
}

// conn connects from the host through the published NATS port with one of
// the secrets' creds.
func (p *composeProject) conn(url, creds string, errs func(error)) *nats.Conn {
	p.t.Helper()
	var opts []nats.Option
	if errs != nil {
		opts = append(opts, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs(err) }))
	}
	inbox := map[string]string{"producer": natsconn.InboxProducer, "admin": natsconn.InboxAdmin, "dispatcher": natsconn.InboxDispatcher}[strings.TrimSuffix(creds, ".creds")]
	nc, err := natsconn.Connect(natsconn.Config{URL: url, Creds: filepath.Join(p.secrets, creds)},
		natsconn.Conn{Name: "compose-test-" + creds, Inbox: inbox, Retry: true, Timeout: 5 * time.Second}, opts...)
	if err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(nc.Close)
	return nc
}

// liveNodes are the node ids in the heartbeat bucket (admin's view).
func liveNodes(ctx context.Context, js jetstream.JetStream) ([]string, error) {
	kv, err := js.KeyValue(ctx, topology.BucketNodes)
	if err != nil {
		return nil, err
	}
	keys, err := kv.Keys(ctx)
	if err != nil && err != jetstream.ErrNoKeysFound {
		return nil, err
	}
	sort.Strings(keys)
	return keys, nil
}

// dashboardView GETs /api/view of a dispatcher's dashboard.
func dashboardView(ctx context.Context, addr string) (replicas, nodes []string, err error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/api/view", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return nil, nil, fmt.Errorf("GET /api/view: %s: %s", resp.Status, body)
	}
	var v struct {
		View struct {
			Replicas []struct{ Name string } `json:"replicas"`
			Nodes    []struct{ Name string } `json:"nodes"`
		} `json:"view"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		return nil, nil, err
	}
	for _, r := range v.View.Replicas {
		replicas = append(replicas, r.Name)
	}
	for _, n := range v.View.Nodes {
		nodes = append(nodes, n.Name)
	}
	sort.Strings(replicas)
	sort.Strings(nodes)
	return replicas, nodes, nil
}

// promTargets counts the live (health up) active targets per job.
func promTargets(ctx context.Context, addr string) (map[string]int, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/api/v1/targets?state=active", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var v struct {
		Data struct {
			ActiveTargets []struct {
				Labels map[string]string `json:"labels"`
				Health string            `json:"health"`
			} `json:"activeTargets"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		return nil, err
	}
	up := map[string]int{}
	for _, tg := range v.Data.ActiveTargets {
		if tg.Health == "up" {
			up[tg.Labels["job"]]++
		}
	}
	return up, nil
}

// eventually retries check until it returns nil or d passes.
func eventually(d time.Duration, check func() error) error {
	deadline := time.Now().Add(d)
	for {
		err := check()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(time.Second)
	}
}

// containerHostname is the host name (the short container id) of a
// container: the dispatcher's replica name.
func containerHostname(ctx context.Context, id string) string {
	out, _ := docker(ctx, "inspect", "-f", "{{.Config.Hostname}}", id)
	return out
}

// crossReplica connects as another replica of the worker service would (a
// user key of its own, its JWT signed with the pool key every replica is
// given) and tries to act as node victim: consume its dispatches and
// publish its outcome. It returns the server's refusals.
func crossReplica(t *testing.T, url, poolKey, victim string) []string {
	t.Helper()
	cfg := natsconn.Config{URL: url, PoolKey: poolKey}
	self, err := cfg.PoolIdentity()
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var refusals []string
	nc, err := natsconn.Connect(cfg, natsconn.Conn{Name: "compose-test-replica", Inbox: natsconn.InboxNode(self)},
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			mu.Lock()
			refusals = append(refusals, err.Error())
			mu.Unlock()
		}))
	if err != nil {
		t.Fatalf("a new replica's identity is refused: %v", err)
	}
	defer nc.Close()
	if _, err := nc.SubscribeSync(topology.DispatchSubject(victim)); err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish(topology.OutcomeSubject(victim), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	// its own outcome subject is allowed: only the victim's is refused
	if err := nc.Publish(topology.OutcomeSubject(self), []byte(`not an outcome`)); err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	want := []string{
		fmt.Sprintf("Permissions Violation for Subscription to %q", topology.DispatchSubject(victim)),
		fmt.Sprintf("Permissions Violation for Publish to %q", topology.OutcomeSubject(victim)),
	}
	_ = eventually(10*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		for _, w := range want {
			if !slices.ContainsFunc(refusals, func(r string) bool { return strings.Contains(r, w) }) {
				return fmt.Errorf("no %q yet", w)
			}
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	for _, w := range want {
		if !slices.ContainsFunc(refusals, func(r string) bool { return strings.Contains(r, w) }) {
			t.Errorf("replica %s acting as %s: nats-server did not refuse it (%s); refusals: %q", self, victim, w, refusals)
		}
	}
	for _, r := range refusals {
		if strings.Contains(r, self) {
			t.Errorf("replica %s was refused an action as itself: %s", self, r)
		}
	}
	return slices.Clone(refusals)
}

// TestComposeDocker runs the README's two commands (make secrets, docker
// compose up -d --build) with the monitoring profile, on real containers,
// then 2000 tasks from the host while workers are scaled 3 -> 6 -> 2, one
// is killed, one paused past the node TTL, the dispatcher restarted and
// scaled to 2; every task must have exactly one result in the results
// stream. On the way: nats-server refuses a replica acting as another, the
// dashboard merges every replica, Prometheus scrapes every replica.
func TestComposeDocker(t *testing.T) {
	requireCompose(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	p := newComposeProject(t, "mlsched-test")
	// the workers' models files, mounted from a copy the test changes
	modelsDir := copyModels(t)
	p.env = append(p.env, "MLSCHED_MODELS_DIR="+modelsDir)
	readme := composeReadmeCommands(t)
	if want := []string{"make secrets", "docker compose up -d --build"}; len(readme) < 3 || !slices.Equal(readme[:2], want) {
		t.Fatalf("README's compose block begins %q, want %q", readme, want)
	}
	t0 := time.Now()
	p.makeSecrets(ctx)
	p.must(ctx, "--profile", "monitoring", "up", "-d", "--build", "--wait", "--wait-timeout", "180")
	p.followLogs()
	entries := p.allHealthy(ctx, time.Minute)
	var names []string
	for _, e := range entries {
		names = append(names, e.Service+"="+e.Health)
	}
	sort.Strings(names)
	t.Logf("make secrets + up --build --wait: %.1fs; healthy: %v", time.Since(t0).Seconds(), names)
	for _, svc := range []string{"nats", "redis", "dispatcher", "dashboard", "worker", "prometheus"} {
		if !slices.ContainsFunc(entries, func(e psEntry) bool { return e.Service == svc }) {
			t.Errorf("service %s is not running", svc)
		}
	}
	if n := len(p.containers(ctx, "worker")); n != 3 {
		t.Errorf("default worker replicas = %d, want 3", n)
	}

	// Secrets inside a worker: only its own, readable by its user, the
	// directory on the host 0700.
	w1 := p.containers(ctx, "worker")[0]
	if out, err := docker(ctx, "exec", w1, "sh", "-c", "ls /run/secrets; stat -c '%a %U:%G' /run/secrets/worker-pool.nk; id -un"); err != nil {
		t.Error(err)
	} else {
		t.Logf("worker secrets: %q", out)
		if f := strings.Fields(out); len(f) != 4 || f[0] != authconf.PoolKeyFile || f[3] != "mlsched" {
			t.Errorf("a worker container sees %q: want only %s, run as mlsched", out, authconf.PoolKeyFile)
		}
	}
	if fi, err := os.Stat(p.secrets); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("secrets directory mode: %v %v, want 0700", fi.Mode(), err)
	}

	natsURL := "nats://" + p.hostPort(ctx, "nats", 4222, 1)
	admin := p.conn(natsURL, "admin.creds", nil)
	adminJS, _ := jetstream.New(admin)
	prod := p.conn(natsURL, "producer.creds", nil)
	js, err := jetstream.New(prod)
	if err != nil {
		t.Fatal(err)
	}
	var nodes []string
	if err := eventually(30*time.Second, func() error {
		nodes, err = liveNodes(ctx, adminJS)
		if err == nil && len(nodes) != 3 {
			err = fmt.Errorf("%d live nodes: %v", len(nodes), nodes)
		}
		return err
	}); err != nil {
		t.Fatalf("3 worker replicas, 3 nodes: %v", err)
	}
	t.Logf("worker replicas' node ids (their own user keys): %v", nodes)

	// Each replica's dispatch consumer goes away an hour after its
	// replica (the dispatcher's view: it may read every consumer).
	dispJS, _ := jetstream.New(p.conn(natsURL, "dispatcher.creds", nil))
	for _, id := range nodes {
		c, err := dispJS.Consumer(ctx, topology.StreamDispatch, topology.NodeConsumer(id))
		if err != nil {
			t.Errorf("consumer of node %s: %v", id, err)
		} else if got := c.CachedInfo().Config.InactiveThreshold; got != worker.PoolConsumerInactive {
			t.Errorf("consumer of node %s: inactive threshold %v, want %v", id, got, worker.PoolConsumerInactive)
		}
	}

	// The dashboard's address, which must stay through all that follows.
	dashAddr := p.hostPort(ctx, "dashboard", 9090, 1)

	// A second replica tries to act as the first: refused by nats-server.
	for _, r := range crossReplica(t, natsURL, filepath.Join(p.secrets, authconf.PoolKeyFile), nodes[0]) {
		t.Logf("refused by nats-server: %s", r)
	}

	// The load: 2000 tasks at 20/s from the host with the producer's creds.
	audit := newResultAudit()
	auditCons, err := js.OrderedConsumer(ctx, topology.StreamResults, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy})
	if err != nil {
		t.Fatal(err)
	}
	auditCC, err := auditCons.Consume(func(m jetstream.Msg) { audit.observe(m.Subject(), m.Data()) })
	if err != nil {
		t.Fatal(err)
	}
	defer auditCC.Stop()
	cl := client.New(js)
	n := 2000
	tasks := make([]chaosTask, n)
	ids := make([]string, n)
	for i := range tasks {
		ids[i] = fmt.Sprintf("compose-%05d", i)
		tasks[i] = chaosTask{ID: ids[i], Type: []string{"classify", "embed"}[i%2], Kind: kindGood, MsgID: ids[i]}
	}
	prodr := &chaosProducer{cl: cl}
	start := time.Now()
	prodErr := make(chan error, 1)
	go func() { prodErr <- prodr.run(ctx, tasks, 20, start) }()

	// The operations, while the tasks run.
	var steps []string
	step := func(at time.Duration, what string, do func() error) {
		if !sleepCtx(ctx, time.Until(start.Add(at))) {
			t.Fatalf("%s: %v", what, ctx.Err())
		}
		began := time.Now()
		if err := do(); err != nil {
			t.Fatalf("t+%.0fs %s: %v", time.Since(start).Seconds(), what, err)
		}
		steps = append(steps, fmt.Sprintf("t+%.1fs %s (%.1fs)", began.Sub(start).Seconds(), what, time.Since(began).Seconds()))
	}
	step(5*time.Second, "scale worker 3 -> 6", func() error { return p.setScale(ctx, map[string]int{"worker": 6}, "monitoring") })
	var killed, paused string
	step(20*time.Second, "docker kill one worker", func() error {
		killed = p.containers(ctx, "worker")[1]
		_, err := docker(ctx, "kill", killed)
		return err
	})
	step(28*time.Second, "docker pause one worker 15s (node TTL 10s), unpause", func() error {
		paused = p.containers(ctx, "worker")[2]
		if _, err := docker(ctx, "pause", paused); err != nil {
			return err
		}
		sleepCtx(ctx, 15*time.Second)
		_, err := docker(ctx, "unpause", paused)
		return err
	})
	step(50*time.Second, "docker restart the dispatcher", func() error {
		_, err := docker(ctx, "restart", p.containers(ctx, "dispatcher")[0])
		return err
	})
	step(60*time.Second, "scale dispatcher 1 -> 2", func() error { return p.setScale(ctx, map[string]int{"dispatcher": 2}, "monitoring") })
	step(75*time.Second, "scale worker 6 -> 2", func() error { return p.setScale(ctx, map[string]int{"worker": 2}, "monitoring") })
	for _, s := range steps {
		t.Log(s)
	}
	if err := <-prodErr; err != nil {
		t.Fatalf("producer: %v", err)
	}
	t.Logf("submitted %d tasks in %.1fs (%d retried submits)", n, time.Since(start).Seconds(), prodr.retries.Load())
	wctx, wcancel := context.WithTimeout(ctx, 4*time.Minute)
	results, _ := waitAllResults(wctx, cl, ids)
	wcancel()
	if err := eventually(30*time.Second, func() error {
		if m := audit.messages(); m < len(results) {
			return fmt.Errorf("results stream delivered %d of %d", m, len(results))
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
	lost := n - len(results)
	dups := audit.duplicates()
	problems := audit.check(ids, results)
	var lostAttempts, overDeadline int
	var maxLatency float64
	for _, r := range results {
		maxLatency = max(maxLatency, r.LatencyMs)
		budget := 0.0
		for _, a := range r.History {
			if a.Status.IsLost() { // protocol.OutcomeLost or protocol.OutcomeNodeLost
				lostAttempts++
			}
			budget += 30000 + 5000 // an attempt's timeout (the default) and its slack
		}
		if r.LatencyMs > budget {
			overDeadline++
		}
	}
	t.Logf("results: %d tasks, %d results, lost %d, duplicate %d, attempts swept as lost %d, results later than their attempts' deadlines %d, max latency %.1fs",
		n, len(results), lost, len(dups), lostAttempts, overDeadline, maxLatency/1000)
	if lost != 0 || len(dups) != 0 || len(problems) != 0 {
		t.Errorf("lost %d, duplicates %v, problems (first 10): %v", lost, dups, problems[:min(10, len(problems))])
	}
	if overDeadline != 0 {
		t.Errorf("%d results came later than their attempts' deadlines", overDeadline)
	}

	// The rest of the README's compose block (the CLI), then its
	// third-party producer, with the producer's creds and inbox (after the
	// audit: their tasks are not the load's).
	for _, line := range readme[2:] {
		composeCLI(ctx, t, p, line, p.containers(ctx, "worker"))
	}
	composeProducer(ctx, t, p, natsURL)

	// The scaled-in workers drained: each logged its drain and its stop
	// (the 4 removed by 6 -> 2; none needed the grace's nak).
	logs := p.logs()
	draining, stopped, graceOver := strings.Count(logs, `"message":"worker draining"`),
		strings.Count(logs, `"message":"worker stopped"`), strings.Count(logs, "shutdown grace over")
	t.Logf("worker logs: %d drains, %d graceful stops, %d shutdown graces over", draining, stopped, graceOver)
	if stopped < 4 {
		t.Errorf("%d workers logged a graceful stop, want at least the 4 scaled in", stopped)
	}

	// docker compose kill -s HUP nats: nats-server reloads auth.conf (what a
	// key rotation needs) and stays healthy.
	p.must(ctx, "kill", "-s", "HUP", "nats")
	if err := eventually(30*time.Second, func() error {
		if !strings.Contains(p.logs(), "Reloaded server configuration") {
			return fmt.Errorf("nats did not log a reload after SIGHUP")
		}
		return waitHealthy(ctx, p.one(ctx, "nats"), 30*time.Second)
	}); err != nil {
		t.Error(err)
	} else {
		t.Log("docker compose kill -s HUP nats: configuration reloaded, healthy")
	}

	// The dashboard answers on the published port and merges every replica.
	disp := p.containers(ctx, "dispatcher")
	var wantReplicas []string
	for _, id := range disp {
		wantReplicas = append(wantReplicas, containerHostname(ctx, id))
	}
	sort.Strings(wantReplicas)
	if err := eventually(60*time.Second, func() error {
		nodes, err = liveNodes(ctx, adminJS)
		if err != nil {
			return err
		}
		for i := range disp {
			addr := p.hostPort(ctx, "dispatcher", 9090, i+1)
			replicas, dnodes, err := dashboardView(ctx, addr)
			if err != nil {
				return err
			}
			if !slices.Equal(replicas, wantReplicas) || !slices.Equal(dnodes, nodes) || len(nodes) != 2 {
				return fmt.Errorf("dashboard %s: replicas %v nodes %v; want %v and the 2 live nodes %v", addr, replicas, dnodes, wantReplicas, nodes)
			}
		}
		return nil
	}); err != nil {
		t.Error(err)
	} else {
		t.Logf("dashboards of both dispatchers show replicas %v and nodes %v", wantReplicas, nodes)
	}

	// Prometheus: a live target for every replica.
	prom := p.hostPort(ctx, "prometheus", 9095, 1)
	if err := eventually(90*time.Second, func() error {
		up, err := promTargets(ctx, prom)
		if err != nil {
			return err
		}
		if up["mlsched-worker"] != 2 || up["mlsched-dispatcher"] != 2 {
			return fmt.Errorf("live targets %v, want 2 workers and 2 dispatchers", up)
		}
		return nil
	}); err != nil {
		t.Error(err)
	} else {
		t.Log("Prometheus: 2 worker and 2 dispatcher targets up")
	}

	// The dashboard's address through the upgrade step and scaling, then
	// a models file changed without a rebuild (issue 40).
	composeDashboardStays(ctx, t, p, dashAddr, 2, 1)
	composeModelsChange(ctx, t, p, modelsDir, adminJS)
	t.Logf("whole test %.1fs", time.Since(t0).Seconds())
}

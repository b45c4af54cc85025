package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/mlsched/mlsched/dispatcher/authconf"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// Cluster is a set of processes owned by one test. Everything it starts is
// killed in t.Cleanup, and the logs of every process are printed if the test
// failed.
type Cluster struct {
	t   testing.TB
	Dir string

	mu    sync.Mutex
	procs []*Process
	NATS  *NATS
	// NATSCluster is set instead of NATS by StartNATSCluster.
	NATSCluster *NATSCluster
	Redis       *Redis
	Dispatchers []*Dispatcher
	Workers     []*Worker

	nc *nats.Conn
	js jetstream.JetStream

	auth *Auth // set by EnableAuth
}

// New returns an empty cluster for t.
func New(t testing.TB) *Cluster {
	t.Helper()
	c := &Cluster{t: t, Dir: t.TempDir()}
	t.Cleanup(c.cleanup)
	return c
}

func (c *Cluster) cleanup() {
	c.mu.Lock()
	procs := append([]*Process(nil), c.procs...)
	nc := c.nc
	c.mu.Unlock()
	if nc != nil {
		nc.Close()
	}
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].Kill()
	}
	if c.t.Failed() || os.Getenv(EnvLogs) == "all" {
		for _, p := range procs {
			c.t.Logf("---- log of %s (%s) ----\n%s", p.Name, p.LogPath, tail(p.Logs(), 48<<10))
		}
	}
	if dir := os.Getenv(EnvLogDir); dir != "" {
		dst := filepath.Join(dir, strings.NewReplacer("/", "_", " ", "_").Replace(c.t.Name()))
		if err := os.MkdirAll(dst, 0o755); err != nil {
			c.t.Logf("keep logs: %v", err)
			return
		}
		for _, p := range procs {
			if err := os.WriteFile(filepath.Join(dst, p.Name+".log"), []byte(p.Logs()), 0o644); err != nil {
				c.t.Logf("keep logs: %v", err)
			}
		}
		c.t.Logf("process logs kept in %s", dst)
	}
}

// Environment variables read by the harness itself (never passed on).
const (
	// EnvLogs=all prints every process log even when the test passed
	// (by default only on failure).
	EnvLogs = "MLSCHED_E2E_LOGS"
	// EnvLogDir names a directory where the full process logs of every
	// test are kept (e.g. as CI artefacts).
	EnvLogDir = "MLSCHED_E2E_LOG_DIR"
)

func (c *Cluster) newProcess(name, path string, args, env []string) *Process {
	dir := filepath.Join(c.Dir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		c.t.Fatal(err)
	}
	p := &Process{Name: name, Path: path, Args: args, Env: env, Dir: dir, LogPath: filepath.Join(c.Dir, name+".log")}
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
	return p
}

// Process registers another process the test needs (a model server, say),
// not started: its directory is under the cluster's, it is killed in
// cleanup and its log printed on failure like the rest. Env entries with an
// empty value are dropped; MLSCHED_* variables are never inherited.
func (c *Cluster) Process(name, path string, args []string, env map[string]string) *Process {
	return c.newProcess(name, path, args, mergeEnv(env, nil))
}

// startReady starts p and waits for ready; it fails fast with the log when
// the process exits first.
func startReady(p *Process, ready func(ctx context.Context) error) error {
	if err := p.Start(); err != nil {
		return err
	}
	return waitReady(p, ready)
}

func waitReady(p *Process, ready func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), ReadyTimeout)
	defer cancel()
	exited := p.Exited()
	go func() {
		select {
		case <-exited:
			cancel()
		case <-ctx.Done():
		}
	}()
	err := WaitFor(ctx, func() error { return ready(ctx) })
	if err != nil {
		select {
		case <-exited:
			return fmt.Errorf("%s exited before it was ready (%v): %w\n%s", p.Name, p.ExitErr(), err, tail(p.Logs(), 8<<10))
		default:
			return fmt.Errorf("%s not ready in %v: %w", p.Name, ReadyTimeout, err)
		}
	}
	return nil
}

// ---------------------------------------------------------------- NATS

// NATS is a nats-server process with JetStream on file storage.
type NATS struct {
	*Process
	Port        int
	MonitorPort int
	// URL is the client URL, nats://127.0.0.1:<port>.
	URL string
	// MonitorURL is the HTTP monitoring base URL.
	MonitorURL string
	// StoreDir is the JetStream store, kept across restarts.
	StoreDir   string
	ConfigPath string
	// ServerName is the server_name of a cluster node ("e2e" for a single
	// server).
	ServerName string
}

// NATSConfig renders the nats-server configuration the harness uses: the
// same durability setting as deployments/nats/nats.conf.
func NATSConfig(port, monitorPort int, storeDir string) string {
	return fmt.Sprintf(`# written by the e2e harness
listen: "127.0.0.1:%d"
http: "127.0.0.1:%d"
server_name: "e2e"
max_payload: 8MB
jetstream {
  store_dir: %q
  # fsync every write: without it an acknowledged message can be lost when
  # the machine (not just the process) dies.
  sync_interval: always
  max_memory_store: 256MB
  max_file_store: 4GB
}
`, port, monitorPort, storeDir)
}

// StartNATS starts nats-server and waits until JetStream is healthy. The
// cluster keeps a client connection to it (see Conn).
func (c *Cluster) StartNATS() *NATS {
	c.t.Helper()
	return c.StartNATSSync("")
}

// StartNATSSync is StartNATS with another sync_interval than "always"
// ("" keeps it): "2m", the server's default, is the bench's fast mode,
// for a test that measures that mode's latency.
func (c *Cluster) StartNATSSync(syncInterval string) *NATS {
	c.t.Helper()
	bin := Binary(c.t, "nats-server")
	var lastErr error
	for try := 0; try < 3; try++ { // a free port may be taken before we bind it
		port, err1 := FreePort()
		mport, err2 := FreePort()
		if err := errors.Join(err1, err2); err != nil {
			c.t.Fatal(err)
		}
		name := "nats"
		if try > 0 {
			name = fmt.Sprintf("nats-try%d", try)
		}
		p := c.newProcess(name, bin, nil, nil)
		n := &NATS{Process: p, Port: port, MonitorPort: mport,
			URL:        fmt.Sprintf("nats://127.0.0.1:%d", port),
			MonitorURL: fmt.Sprintf("http://127.0.0.1:%d", mport),
			StoreDir:   filepath.Join(p.Dir, "jetstream"), ConfigPath: filepath.Join(p.Dir, "nats.conf")}
		conf := NATSConfig(port, mport, n.StoreDir)
		if syncInterval != "" {
			conf = strings.Replace(conf, "sync_interval: always", "sync_interval: "+syncInterval, 1)
		}
		if c.auth != nil {
			inc, err := c.auth.include(p.Dir)
			if err != nil {
				c.t.Fatal(err)
			}
			conf += inc
		}
		if err := os.WriteFile(n.ConfigPath, []byte(conf), 0o644); err != nil {
			c.t.Fatal(err)
		}
		p.Args = []string{"-c", n.ConfigPath}
		if lastErr = n.Start(); lastErr == nil {
			c.mu.Lock()
			c.NATS = n
			c.mu.Unlock()
			c.connect(n.URL)
			return n
		}
		p.Kill()
		if !strings.Contains(p.Logs(), "address already in use") {
			break
		}
	}
	c.t.Fatalf("start nats-server: %v", lastErr)
	return nil
}

// StartNATSCluster starts a cluster of nats-server processes (3 by
// default) whose every link goes through a proxy the test can cut (see
// NATSCluster), and waits until each server is healthy. Dispatchers and
// workers started afterwards get every server's URL and
// MLSCHED_STREAM_REPLICAS set to the cluster size.
func (c *Cluster) StartNATSCluster(o NATSClusterOptions) *NATSCluster {
	c.t.Helper()
	nc, err := startNATSCluster(o, func(name string) (*Process, error) { return c.newProcess(name, "", nil, nil), nil })
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(nc.Close)
	c.mu.Lock()
	c.NATSCluster = nc
	c.mu.Unlock()
	c.connect(nc.URL)
	return nc
}

// NATSURL is what clients connect to: the server's URL, or the cluster's
// comma-separated URL list ("" before StartNATS or StartNATSCluster).
func (c *Cluster) NATSURL() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.NATSCluster != nil:
		return c.NATSCluster.URL
	case c.NATS != nil:
		return c.NATS.URL
	}
	return ""
}

// natsEnv is the NATS part of a dispatcher's or worker's environment.
func (c *Cluster) natsEnv() map[string]string {
	env := map[string]string{"MLSCHED_NATS_URL": c.NATSURL()}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.NATSCluster != nil {
		env["MLSCHED_STREAM_REPLICAS"] = strconv.Itoa(len(c.NATSCluster.Nodes))
	}
	return env
}

// Start starts the server and waits until it is healthy.
func (n *NATS) Start() error { return startReady(n.Process, n.ready) }

// Restart stops the server with SIGTERM and starts it again on the same port
// and store, waiting until it is healthy.
func (n *NATS) Restart() error {
	if err := n.Process.Stop(); err != nil && !isExitErr(err) {
		return err
	}
	return n.Start()
}

func (n *NATS) ready(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, n.MonitorURL+"/healthz", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("healthz: %s", resp.Status)
	}
	return nil
}

// connect opens the cluster's own client connection, which reconnects for
// ever so that it survives server restarts.
func (c *Cluster) connect(url string) {
	opts := []nats.Option{nats.Name("e2e-harness"), nats.MaxReconnects(-1),
		nats.ReconnectWait(50 * time.Millisecond), nats.RetryOnFailedConnect(true)}
	if c.auth != nil {
		opts = append(opts, c.auth.natsOption())
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		c.t.Fatalf("connect to nats: %v", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		c.t.Fatal(err)
	}
	c.mu.Lock()
	c.nc, c.js = nc, js
	c.mu.Unlock()
}

// Conn returns the cluster's client connection (StartNATS first).
func (c *Cluster) Conn() (*nats.Conn, jetstream.JetStream) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.nc == nil {
		c.t.Fatal("harness: StartNATS before Conn")
	}
	return c.nc, c.js
}

// Connect opens a new client connection for the test, closed in t.Cleanup.
func (c *Cluster) Connect(opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	c.t.Helper()
	url := c.NATSURL()
	if url == "" {
		c.t.Fatal("harness: StartNATS before Connect")
	}
	opts = append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond)}, opts...)
	if c.auth != nil {
		opts = append([]nats.Option{c.auth.natsOption()}, opts...)
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		c.t.Fatalf("connect: %v", err)
	}
	c.t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		c.t.Fatal(err)
	}
	return nc, js
}

// ---------------------------------------------------------------- Redis

// Redis is a redis-server process without persistence.
type Redis struct {
	*Process
	Port int
	// Addr is host:port; URL is redis://Addr/0.
	Addr string
	URL  string
}

// StartRedis starts redis-server (found in PATH) and waits for PING.
func (c *Cluster) StartRedis() *Redis {
	c.t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		c.t.Fatalf("redis-server is not installed (apt-get install redis-server, or run make test as root): %v", err)
	}
	var lastErr error
	for try := 0; try < 3; try++ {
		port, err := FreePort()
		if err != nil {
			c.t.Fatal(err)
		}
		name := "redis"
		if try > 0 {
			name = fmt.Sprintf("redis-try%d", try)
		}
		p := c.newProcess(name, bin, nil, nil)
		p.Args = []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--dir", p.Dir, "--daemonize", "no", "--logfile", ""}
		r := &Redis{Process: p, Port: port, Addr: fmt.Sprintf("127.0.0.1:%d", port)}
		r.URL = "redis://" + r.Addr + "/0"
		if lastErr = r.Start(); lastErr == nil {
			c.mu.Lock()
			c.Redis = r
			c.mu.Unlock()
			return r
		}
		p.Kill()
		if !strings.Contains(p.Logs(), "in use") {
			break
		}
	}
	c.t.Fatalf("start redis-server: %v", lastErr)
	return nil
}

// Start starts the server and waits for PING.
func (r *Redis) Start() error { return startReady(r.Process, r.ready) }

// Restart stops and starts the server (its data is lost: no persistence).
func (r *Redis) Restart() error {
	if err := r.Process.Stop(); err != nil && !isExitErr(err) {
		return err
	}
	return r.Start()
}

// Client returns a client of the server, closed in t.Cleanup.
func (r *Redis) Client(t testing.TB) *redis.Client {
	cl := redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() { cl.Close() })
	return cl
}

func (r *Redis) ready(ctx context.Context) error {
	cl := redis.NewClient(&redis.Options{Addr: r.Addr, MaxRetries: -1, DialTimeout: time.Second})
	defer cl.Close()
	return cl.Ping(ctx).Err()
}

// ---------------------------------------------------------------- Dispatcher

// DispatcherOptions configure a dispatcher process.
type DispatcherOptions struct {
	// Policy sets MLSCHED_POLICY ("" keeps the dispatcher's default).
	Policy string
	// NoRedis runs the dispatcher on in-memory statistics even when the
	// cluster has a Redis (default: use the cluster's Redis if any).
	NoRedis bool
	// Env adds or overrides MLSCHED_* variables; an empty value removes one.
	Env map[string]string
}

// Dispatcher is a dispatcher process.
type Dispatcher struct {
	*Process
	// Name is its MLSCHED_DISPATCHER_NAME, the Dispatcher field of its
	// StatsReport (default "dispatcher-<n>").
	Name string
	c    *Cluster
}

// StartDispatcher starts a dispatcher and waits until it answers
// mlsched.admin.stats.
func (c *Cluster) StartDispatcher(o DispatcherOptions) *Dispatcher {
	c.t.Helper()
	if c.NATSURL() == "" {
		c.t.Fatal("harness: StartNATS before StartDispatcher")
	}
	env := mergeEnvMap(c.natsEnv(), map[string]string{
		"MLSCHED_LOG_FORMAT": "json",
		"MLSCHED_LOG_LEVEL":  "info",
		"MLSCHED_HTTP_ADDR":  "127.0.0.1:0", // never the default port: see HTTPURL
	})
	if c.Redis != nil && !o.NoRedis {
		env["MLSCHED_REDIS_URL"] = c.Redis.URL
	}
	if o.Policy != "" {
		env["MLSCHED_POLICY"] = o.Policy
	}
	c.mu.Lock()
	name := fmt.Sprintf("dispatcher-%d", len(c.Dispatchers)+1)
	c.mu.Unlock()
	env["MLSCHED_DISPATCHER_NAME"] = name
	if c.auth != nil {
		c.auth.env(env, authconf.Identity{Role: authconf.Dispatcher})
	}
	env = mergeEnvMap(env, o.Env)
	p := c.newProcess(name, Binary(c.t, "dispatcher"), nil, mergeEnv(env, nil))
	d := &Dispatcher{Process: p, Name: env["MLSCHED_DISPATCHER_NAME"], c: c}
	c.mu.Lock()
	c.Dispatchers = append(c.Dispatchers, d)
	c.mu.Unlock()
	if err := d.Start(); err != nil {
		c.t.Fatal(err)
	}
	return d
}

// Start starts the dispatcher and waits until it answers admin requests.
func (d *Dispatcher) Start() error { return startReady(d.Process, d.ready) }

// Restart stops the dispatcher with SIGTERM and starts it again.
func (d *Dispatcher) Restart() error {
	if err := d.Process.Stop(); err != nil && !isExitErr(err) {
		return err
	}
	return d.Start()
}

// ready: the dispatcher answers mlsched.admin.stats under its name.
func (d *Dispatcher) ready(ctx context.Context) error {
	_, err := d.Stats(ctx)
	return err
}

// Stats returns this dispatcher's StatsReport.
func (d *Dispatcher) Stats(ctx context.Context) (protocol.StatsReport, error) {
	want := 0 // stop collecting once every running dispatcher answered
	d.c.mu.Lock()
	for _, o := range d.c.Dispatchers {
		if o.Running() {
			want++
		}
	}
	d.c.mu.Unlock()
	rctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	reps, err := d.c.AdminStats(rctx, want)
	if err != nil {
		return protocol.StatsReport{}, err
	}
	for _, r := range reps {
		if r.Dispatcher == d.Name {
			return r, nil
		}
	}
	return protocol.StatsReport{}, fmt.Errorf("%s does not answer %s", d.Name, protocol.SubjectAdminStats)
}

// AdminStats asks every dispatcher for its StatsReport and collects replies
// until want distinct dispatchers answered or ctx ends. It returns an error
// only when none answered.
func (c *Cluster) AdminStats(ctx context.Context, want int) ([]protocol.StatsReport, error) {
	nc, _ := c.Conn()
	inbox := nats.NewInbox()
	ch := make(chan *nats.Msg, 64)
	sub, err := nc.ChanSubscribe(inbox, ch)
	if err != nil {
		return nil, err
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest(protocol.SubjectAdminStats, inbox, nil); err != nil {
		return nil, err
	}
	seen := map[string]protocol.StatsReport{}
	var decodeErr error
	for len(seen) < want {
		select {
		case m := <-ch:
			if m.Header.Get("Status") == "503" { // the server says: no responders
				if len(seen) == 0 {
					return nil, fmt.Errorf("no dispatcher answers %s: %w", protocol.SubjectAdminStats, nats.ErrNoResponders)
				}
				continue
			}
			var r protocol.StatsReport
			if err := json.Unmarshal(m.Data, &r); err != nil {
				decodeErr = fmt.Errorf("bad stats report %q: %w", truncate(m.Data), err)
				continue
			}
			seen[r.Dispatcher] = r
		case <-ctx.Done():
			if len(seen) == 0 {
				return nil, errors.Join(fmt.Errorf("no dispatcher answered %s: %w", protocol.SubjectAdminStats, ctx.Err()), decodeErr)
			}
			return sortedReports(seen), nil
		}
	}
	return sortedReports(seen), nil
}

func sortedReports(m map[string]protocol.StatsReport) []protocol.StatsReport {
	out := make([]protocol.StatsReport, 0, len(m))
	for _, r := range m {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Dispatcher < out[j].Dispatcher })
	return out
}

func truncate(b []byte) string {
	if len(b) > 200 {
		return string(b[:200]) + "…"
	}
	return string(b)
}

// ---------------------------------------------------------------- Worker

// WorkerOptions configure a worker process.
type WorkerOptions struct {
	// NodeID sets MLSCHED_NODE_ID (default "node-<n>").
	NodeID string
	// ModelsFile sets MLSCHED_MODELS_FILE (made absolute).
	ModelsFile string
	// Concurrency sets MLSCHED_CONCURRENCY (0 keeps the worker's default).
	Concurrency int
	// SimSeed sets MLSCHED_SIM_SEED (0 keeps the worker's default).
	SimSeed int64
	// Env adds or overrides MLSCHED_* variables; an empty value removes one.
	Env map[string]string
	// NoWait returns once the process started, without waiting for its
	// heartbeat (default: wait), for a worker that has to wait for
	// something first.
	NoWait bool
}

// Worker is a worker process serving one node id.
type Worker struct {
	*Process
	NodeID string
	c      *Cluster
}

// StartWorker starts a worker and waits until its heartbeat, sent after it
// started, is in the MLSCHED_NODES bucket.
func (c *Cluster) StartWorker(o WorkerOptions) *Worker {
	c.t.Helper()
	if c.NATSURL() == "" {
		c.t.Fatal("harness: StartNATS before StartWorker")
	}
	c.mu.Lock()
	n := len(c.Workers) + 1
	c.mu.Unlock()
	if o.NodeID == "" {
		o.NodeID = fmt.Sprintf("node-%d", n)
	}
	env := mergeEnvMap(c.natsEnv(), map[string]string{
		"MLSCHED_NODE_ID":    o.NodeID,
		"MLSCHED_LOG_FORMAT": "json",
		"MLSCHED_LOG_LEVEL":  "info",
		"MLSCHED_HTTP_ADDR":  "127.0.0.1:0",
	})
	if o.ModelsFile != "" {
		abs, err := filepath.Abs(o.ModelsFile)
		if err != nil {
			c.t.Fatal(err)
		}
		env["MLSCHED_MODELS_FILE"] = abs
	}
	if o.Concurrency > 0 {
		env["MLSCHED_CONCURRENCY"] = strconv.Itoa(o.Concurrency)
	}
	if o.SimSeed != 0 {
		env["MLSCHED_SIM_SEED"] = strconv.FormatInt(o.SimSeed, 10)
	}
	if c.auth != nil {
		c.auth.env(env, authconf.Identity{Role: authconf.Node, NodeID: o.NodeID})
	}
	p := c.newProcess("worker-"+o.NodeID, Binary(c.t, "worker"), nil, mergeEnv(env, o.Env))
	w := &Worker{Process: p, NodeID: o.NodeID, c: c}
	c.mu.Lock()
	c.Workers = append(c.Workers, w)
	c.mu.Unlock()
	start := w.Start
	if o.NoWait {
		start = w.Process.Start
	}
	if err := start(); err != nil {
		c.t.Fatal(err)
	}
	return w
}

// Start starts the worker and waits for a heartbeat of this run.
func (w *Worker) Start() error { return startReady(w.Process, w.ready) }

// Restart stops the worker with SIGTERM and starts it again.
func (w *Worker) Restart() error {
	if err := w.Process.Stop(); err != nil && !isExitErr(err) {
		return err
	}
	return w.Start()
}

// Heartbeat returns the node's current heartbeat from the MLSCHED_NODES
// bucket.
func (w *Worker) Heartbeat(ctx context.Context) (protocol.Heartbeat, error) {
	return w.c.Heartbeat(ctx, w.NodeID)
}

func (w *Worker) ready(ctx context.Context) error {
	hb, err := w.Heartbeat(ctx)
	if err != nil {
		return err
	}
	at := hb.StartedAt
	if at.IsZero() {
		at = hb.SentAt
	}
	// A heartbeat of an earlier run may still be in the bucket.
	if at.Before(w.StartedAt().Add(-10 * time.Millisecond)) {
		return fmt.Errorf("heartbeat of %s is from an earlier run (%v)", w.NodeID, at)
	}
	return nil
}

// Heartbeat reads a node's heartbeat from the MLSCHED_NODES bucket.
func (c *Cluster) Heartbeat(ctx context.Context, node string) (protocol.Heartbeat, error) {
	_, js := c.Conn()
	kv, err := js.KeyValue(ctx, topology.BucketNodes)
	if err != nil {
		return protocol.Heartbeat{}, fmt.Errorf("bucket %s: %w", topology.BucketNodes, err)
	}
	e, err := kv.Get(ctx, node)
	if err != nil {
		return protocol.Heartbeat{}, fmt.Errorf("heartbeat of %s: %w", node, err)
	}
	var hb protocol.Heartbeat
	if err := json.Unmarshal(e.Value(), &hb); err != nil {
		return protocol.Heartbeat{}, fmt.Errorf("heartbeat of %s: %w", node, err)
	}
	return hb, nil
}

func mergeEnvMap(base, over map[string]string) map[string]string {
	m := map[string]string{}
	for k, v := range base {
		m[k] = v
	}
	for k, v := range over {
		m[k] = v
	}
	return m
}

func mergeEnv(base, over map[string]string) []string {
	m := mergeEnvMap(base, over)
	keys := make([]string, 0, len(m))
	for k, v := range m {
		if v != "" {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	env := make([]string, 0, len(keys))
	for _, k := range keys {
		env = append(env, k+"="+m[k])
	}
	return env
}

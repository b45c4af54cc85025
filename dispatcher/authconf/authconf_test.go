package authconf_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/mlsched/mlsched/dispatcher/authconf"
	"github.com/mlsched/mlsched/shared/client"
	"github.com/mlsched/mlsched/shared/natsconn"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/redistest"
	"github.com/mlsched/mlsched/shared/tlstest"
	"github.com/mlsched/mlsched/shared/topology"
)

// deployment is a nats-server started from a configuration that includes
// the auth.conf `mlsched auth init` writes.
type deployment struct {
	t   *testing.T
	dir string
	url string
	res authconf.Result
}

func startServer(t *testing.T, nodes []string, extra string) *deployment {
	t.Helper()
	dir := t.TempDir()
	res, err := authconf.Init(filepath.Join(dir, "auth"), nodes, nil)
	if err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "auth", "nats.conf")
	body := fmt.Sprintf("listen: \"127.0.0.1:-1\"\njetstream { store_dir: %q }\n%s\ninclude %s\n",
		filepath.Join(dir, "js"), extra, authconf.ConfFile)
	if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	opts.NoLog, opts.NoSigs = true, true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return &deployment{t: t, dir: filepath.Join(dir, "auth"), url: s.ClientURL(), res: res}
}

// conn is a connection as one identity that records the permission
// violations the server reports.
type conn struct {
	t  *testing.T
	nc *nats.Conn
	js jetstream.JetStream

	mu         sync.Mutex
	violations []string
}

func inboxOf(id authconf.Identity) string {
	switch id.Role {
	case authconf.Dispatcher:
		return natsconn.InboxDispatcher
	case authconf.Producer:
		return natsconn.InboxProducer
	case authconf.Admin:
		return natsconn.InboxAdmin
	}
	return natsconn.InboxNode(id.NodeID)
}

func (d *deployment) connect(id authconf.Identity, cfg natsconn.Config) *conn {
	d.t.Helper()
	c := &conn{t: d.t}
	if cfg.URL == "" {
		cfg.URL = d.url
	}
	cfg.Nkey = id.SeedFile(d.dir)
	nc, err := natsconn.Connect(cfg, natsconn.Conn{Name: id.Name(), Inbox: inboxOf(id)},
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			c.mu.Lock()
			c.violations = append(c.violations, err.Error())
			c.mu.Unlock()
		}))
	if err != nil {
		d.t.Fatalf("connect as %s: %v", id.Name(), err)
	}
	d.t.Cleanup(nc.Close)
	c.nc = nc
	if c.js, err = jetstream.New(nc); err != nil {
		d.t.Fatal(err)
	}
	return c
}

// refused waits until the server has reported a permission violation for
// subject (the operation was refused by the server, not merely slow).
func (c *conn) refused(op, kind, subject string) {
	c.t.Helper()
	want := fmt.Sprintf("Permissions Violation for %s to %q", kind, subject)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		c.mu.Lock()
		for _, v := range c.violations {
			if strings.Contains(v, want) {
				c.mu.Unlock()
				return
			}
		}
		c.mu.Unlock()
		time.Sleep(10 * time.Millisecond)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t.Errorf("%s: the server reported no %q; violations: %q", op, want, c.violations)
}

func short(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 750*time.Millisecond)
	t.Cleanup(cancel)
	return ctx
}

func long(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func nodeConsumer(id string) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable: topology.NodeConsumer(id), FilterSubject: topology.DispatchSubject(id),
		AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: -1,
	}
}

// setup creates the topology with the dispatcher's key, as a dispatcher
// starting first does.
func (d *deployment) setup() *conn {
	disp := d.connect(authconf.Identity{Role: authconf.Dispatcher}, natsconn.Config{})
	ctx := long(d.t)
	if err := topology.Ensure(ctx, disp.js, topology.Config{}); err != nil {
		d.t.Fatalf("dispatcher creates the topology: %v", err)
	}
	if _, err := topology.EnsureSupersededBucket(ctx, disp.js, topology.Config{}); err != nil {
		d.t.Fatalf("dispatcher creates the superseded bucket: %v", err)
	}
	return disp
}

func TestNodeCannotReachAnotherNode(t *testing.T) {
	d := startServer(t, []string{"n1", "n2"}, "")
	disp := d.setup()
	ctx := long(t)
	for i := range 100 {
		m := nats.NewMsg(topology.DispatchSubject("n2"))
		m.Data = []byte(fmt.Sprintf(`{"id":"t%d","type":"x","payload":"secret-%d"}`, i, i))
		m.Header.Set(protocol.HdrTaskID, fmt.Sprintf("t%d", i))
		if _, err := disp.js.PublishMsg(ctx, m); err != nil {
			t.Fatalf("dispatcher publishes a dispatch: %v", err)
		}
	}

	n1 := d.connect(authconf.Identity{Role: authconf.Node, NodeID: "n1"}, natsconn.Config{})
	if err := topology.Ensure(ctx, n1.js, topology.Config{}); err != nil {
		t.Fatalf("n1 checks the topology: %v", err)
	}
	stream, err := n1.js.Stream(ctx, topology.StreamDispatch)
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	// Its own consumer works, and holds none of n2's tasks.
	own, err := topology.EnsureConsumer(ctx, stream, nodeConsumer("n1"))
	if err != nil {
		t.Fatalf("n1 creates its own consumer: %v", err)
	}
	if b, err := own.FetchNoWait(100); err == nil {
		for range b.Messages() {
			got++
		}
	}

	// Subscribing to n2's dispatch subject.
	sub, err := n1.nc.SubscribeSync(topology.DispatchSubject("n2"))
	if err != nil {
		t.Fatal(err)
	}
	n1.refused("subscribe to n2's dispatches", "Subscription", topology.DispatchSubject("n2"))
	// Creating n2's consumer, or its own name on n2's subject.
	if _, err := stream.CreateConsumer(short(t), nodeConsumer("n2")); err == nil {
		t.Error("n1 created n2's consumer")
	}
	n1.refused("create n2's consumer", "Publish", "$JS.API.CONSUMER.CREATE.MLSCHED_DISPATCH.node-n2.mlsched.node.n2.tasks")
	steal := nodeConsumer("n2")
	steal.Durable = topology.NodeConsumer("n1")
	if _, err := stream.CreateOrUpdateConsumer(short(t), steal); err == nil {
		t.Error("n1 rebound its consumer to n2's subject")
	}
	n1.refused("rebind to n2's subject", "Publish", "$JS.API.CONSUMER.CREATE.MLSCHED_DISPATCH.node-n1.mlsched.node.n2.tasks")
	// Pulling from n2's consumer (created by n2 itself).
	n2 := d.connect(authconf.Identity{Role: authconf.Node, NodeID: "n2"}, natsconn.Config{})
	n2stream, err := n2.js.Stream(ctx, topology.StreamDispatch)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := topology.EnsureConsumer(ctx, n2stream, nodeConsumer("n2")); err != nil {
		t.Fatalf("n2 creates its consumer: %v", err)
	}
	if c2, err := stream.Consumer(short(t), topology.NodeConsumer("n2")); err == nil {
		if b, err := c2.FetchNoWait(100); err == nil {
			for range b.Messages() {
				got++
			}
		}
	}
	// Direct get on the dispatch stream.
	if _, err := stream.GetMsg(short(t), 1); err == nil {
		t.Error("n1 read a dispatch by sequence")
	}
	n1.refused("direct get", "Publish", "$JS.API.DIRECT.GET.MLSCHED_DISPATCH")
	if _, err := stream.GetLastMsgForSubject(short(t), topology.DispatchSubject("n2")); err == nil {
		t.Error("n1 read n2's last dispatch")
	}
	// Heartbeats: its own, not n2's.
	kv, err := n1.js.KeyValue(ctx, topology.BucketNodes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "n1", []byte(`{"node":"n1"}`)); err != nil {
		t.Fatalf("n1 writes its heartbeat: %v", err)
	}
	if _, err := kv.Put(short(t), "n2", []byte(`{"node":"n2","capacity":1000}`)); err == nil {
		t.Error("n1 wrote n2's heartbeat")
	}
	n1.refused("write n2's heartbeat", "Publish", "$KV.MLSCHED_NODES.n2")
	// The measured fake-heartbeat attack: a node "evil" with capacity 1000.
	if _, err := kv.Put(short(t), "evil", []byte(`{"node":"evil","capacity":1000}`)); err == nil {
		t.Error("n1 announced a fake node")
	}
	n1.refused("announce a fake node", "Publish", "$KV.MLSCHED_NODES.evil")
	// Outcomes: its own subject only; no results.
	if _, err := n1.js.Publish(ctx, topology.OutcomeSubject("n1"), []byte(`{}`)); err != nil {
		t.Fatalf("n1 publishes its outcome: %v", err)
	}
	if _, err := n1.js.Publish(short(t), topology.OutcomeSubject("n2"), []byte(`{}`)); err == nil {
		t.Error("n1 published on n2's outcome subject")
	}
	n1.refused("publish n2's outcome", "Publish", topology.OutcomeSubject("n2"))
	// Direct reports: its own subject, answered by a dispatcher; not n2's.
	// disp is the dispatcher role (setup above)
	rsub, err := disp.nc.QueueSubscribe(topology.SubjectReportsAll, topology.QueueDispatchers, func(m *nats.Msg) {
		_ = m.Respond([]byte("settled " + m.Subject))
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := disp.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if m, err := n1.nc.Request(topology.ReportSubject("n1"), []byte(`{}`), 5*time.Second); err != nil || string(m.Data) != "settled "+topology.ReportSubject("n1") {
		t.Fatalf("n1's direct report answered by the dispatcher: %v", err)
	}
	if err := n1.nc.Publish(topology.ReportSubject("n2"), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	n1.refused("report as n2", "Publish", topology.ReportSubject("n2"))
	_ = rsub.Unsubscribe()
	if _, err := n1.js.Publish(short(t), topology.ResultSubject("t1"), []byte(`{}`)); err == nil {
		t.Error("n1 published a result")
	}
	n1.refused("publish a result", "Publish", topology.ResultSubject("t1"))

	if m, err := sub.NextMsg(200 * time.Millisecond); err == nil {
		t.Errorf("n1's subscription received %q", m.Subject)
	}
	if got != 0 {
		t.Errorf("n1 received %d of n2's 100 tasks", got)
	}
	// n2 gets all 100 with its own key.
	c2, err := n2stream.Consumer(ctx, topology.NodeConsumer("n2"))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for n < 100 {
		b, err := c2.Fetch(100, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		k := 0
		for m := range b.Messages() {
			if err := m.Ack(); err != nil {
				t.Fatalf("n2 acks: %v", err)
			}
			k++
		}
		if k == 0 {
			break
		}
		n += k
	}
	if n != 100 {
		t.Errorf("n2 received %d of its 100 tasks", n)
	}
}

func TestProducerCannotForge(t *testing.T) {
	d := startServer(t, []string{"n1"}, "")
	disp := d.setup()
	ctx := long(t)
	prod := d.connect(authconf.Identity{Role: authconf.Producer}, natsconn.Config{})

	c, err := client.Dial(natsconn.Config{URL: d.url, Nkey: authconf.Identity{Role: authconf.Producer}.SeedFile(d.dir)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Submit(ctx, protocol.Task{ID: "p1", Type: "x"}); err != nil {
		t.Fatalf("producer submits: %v", err)
	}
	if _, err := disp.js.Publish(ctx, topology.ResultSubject("p1"), []byte(`{"id":"p1","type":"x","status":"succeeded"}`)); err != nil {
		t.Fatal(err)
	}
	if r, err := c.Result(ctx, "p1"); err != nil || r.Status != protocol.StatusSucceeded {
		t.Fatalf("producer reads the result: %+v, %v", r, err)
	}
	if r, err := c.Wait(ctx, "p1"); err != nil || r.ID != "p1" {
		t.Fatalf("producer waits for the result: %+v, %v", r, err)
	}

	for _, subj := range []string{topology.OutcomeSubject("n1"), topology.ResultSubject("p2"), "$KV.MLSCHED_NODES.n1"} {
		if _, err := prod.js.Publish(short(t), subj, []byte(`{}`)); err == nil {
			t.Errorf("producer published on %s", subj)
		}
		prod.refused("publish "+subj, "Publish", subj)
	}
	if err := prod.js.DeleteStream(short(t), topology.StreamTasks); err == nil {
		t.Error("producer deleted the task stream")
	}
	prod.refused("delete a stream", "Publish", "$JS.API.STREAM.DELETE.MLSCHED_TASKS")
	rs, err := prod.js.Stream(ctx, topology.StreamResults)
	if err != nil {
		t.Fatal(err)
	}
	if err := rs.Purge(short(t)); err == nil {
		t.Error("producer purged the results")
	}
	prod.refused("purge a stream", "Publish", "$JS.API.STREAM.PURGE.MLSCHED_RESULTS")
	if _, err := disp.js.Stream(ctx, topology.StreamResults); err != nil {
		t.Fatal(err)
	}
	info, err := rs.Info(ctx)
	if err != nil || info.State.Msgs != 1 {
		t.Fatalf("results after the attempts: %+v, %v", info, err)
	}
}

// TestDispatcherGathersReplicaReports: the dashboard of one dispatcher
// asks every replica for its report (clusterview) on its own key; it may
// not cancel tasks.
func TestDispatcherGathersReplicaReports(t *testing.T) {
	d := startServer(t, nil, "")
	id := authconf.Identity{Role: authconf.Dispatcher}
	replica, dashboard := d.connect(id, natsconn.Config{}), d.connect(id, natsconn.Config{})
	sub, err := replica.nc.Subscribe(protocol.SubjectAdminStats, func(m *nats.Msg) { _ = m.Respond([]byte(`{"dispatcher":"r1"}`)) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := replica.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	m, err := dashboard.nc.Request(protocol.SubjectAdminStats, nil, 10*time.Second)
	if err != nil || !strings.Contains(string(m.Data), "r1") {
		t.Fatalf("dispatcher asks replicas for their reports: %v, %v", m, err)
	}
	if err := dashboard.nc.Publish(protocol.SubjectAdminCancel, []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	dashboard.refused("cancel", "Publish", protocol.SubjectAdminCancel)
}

func TestAnonymousRefused(t *testing.T) {
	d := startServer(t, nil, "")
	_, err := natsconn.Connect(natsconn.Config{URL: d.url}, natsconn.Conn{})
	if !natsconn.IsAuthError(err) {
		t.Fatalf("anonymous connection: want an authorization error, got %v", err)
	}
}

func TestTLSVerifyRefusesClientWithoutCertificate(t *testing.T) {
	f := tlstest.New(t)
	d := startServer(t, nil, fmt.Sprintf("tls {\n  cert_file: %q\n  key_file: %q\n  ca_file: %q\n  verify: true\n  timeout: 2\n}\n",
		f.ServerCert, f.ServerKey, f.CA))
	admin := authconf.Identity{Role: authconf.Admin}
	url := strings.Replace(d.url, "nats://", "tls://", 1)
	_, err := natsconn.Connect(natsconn.Config{URL: url, CA: f.CA, Nkey: admin.SeedFile(d.dir)}, natsconn.Conn{Timeout: 2 * time.Second})
	if err == nil {
		t.Fatal("a client without a certificate connected")
	}
	c := d.connect(admin, natsconn.Config{URL: url, CA: f.CA, Cert: f.ClientCert, Key: f.ClientKey})
	if _, err := c.nc.TLSConnectionState(); err != nil {
		t.Fatalf("with its certificate: %v", err)
	}
}

func TestInitKeepsRotatesAndValidates(t *testing.T) {
	dir := t.TempDir()
	r1, err := authconf.Init(dir, []string{"n1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(r1.Created) != 4 {
		t.Fatalf("created %v", r1.Created)
	}
	st, err := os.Stat(filepath.Join(dir, "node-n1.nk"))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("seed file mode: %v, %v", st, err)
	}
	r2, err := authconf.Init(dir, []string{"n1", "n2"}, []string{"producer"})
	if err != nil {
		t.Fatal(err)
	}
	pub := map[string]string{}
	for _, u := range r1.Users {
		pub[u.Name()] = u.PublicKey
	}
	for _, u := range r2.Users {
		switch old, ok := pub[u.Name()]; {
		case u.Name() == "producer" && old == u.PublicKey:
			t.Error("producer key not rotated")
		case u.Name() != "producer" && ok && old != u.PublicKey:
			t.Errorf("%s key changed without rotation", u.Name())
		}
	}
	if len(r2.Created) != 1 || len(r2.Rotated) != 1 {
		t.Fatalf("second run: created %v rotated %v", r2.Created, r2.Rotated)
	}
	conf, _ := os.ReadFile(r2.Conf)
	for _, u := range r2.Users {
		seed, _ := os.ReadFile(u.SeedFile(dir))
		if strings.Contains(string(conf), strings.TrimSpace(string(seed))) || !strings.Contains(string(conf), u.PublicKey) {
			t.Fatalf("auth.conf holds %s's seed or lacks its public key", u.Name())
		}
	}
	for _, bad := range [][]string{{"a.b"}, {"*"}, {"x", "x"}, {""}} {
		if _, err := authconf.Init(t.TempDir(), bad, nil); err == nil {
			t.Errorf("nodes %q accepted", bad)
		}
	}
	if _, err := authconf.Init(t.TempDir(), []string{"n1"}, []string{"node-n9"}); err == nil {
		t.Error("rotating an unknown identity accepted")
	}
}

// TestRedisSecrets: with Options.Redis, Write makes a password file and an
// ACL file that a real redis-server loads: the default user may only PING
// (the compose health check), the mlsched user with the password may use
// the statistics keys and INFO, nothing dangerous and no other key. The
// password is kept on the next run and renewed by -rotate redis; compose's
// mode makes the secret files readable, the directory staying private.
func TestRedisSecrets(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "secrets")
	res, err := authconf.Write(dir, authconf.Options{Nodes: []string{"n1"}, Redis: true, SecretMode: 0o644})
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]os.FileMode{dir: 0o700, filepath.Join(dir, "node-n1.nk"): 0o644,
		filepath.Join(dir, authconf.RedisPasswordFile): 0o644, res.RedisACL: 0o644, res.SentinelACL: 0o644} {
		if st, err := os.Stat(path); err != nil || st.Mode().Perm() != want {
			t.Errorf("%s: %v, %v; want mode %o", path, st, err, want)
		}
	}
	pw := func() string {
		b, err := os.ReadFile(filepath.Join(dir, authconf.RedisPasswordFile))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	first := pw()
	acl, _ := os.ReadFile(res.RedisACL)
	if len(first) < 32 || strings.Contains(string(acl), first) {
		t.Fatalf("password %d chars; in the ACL file: %v", len(first), strings.Contains(string(acl), first))
	}

	p, err := redistest.StartProcessArgs(t.TempDir(), 0, "--aclfile", res.RedisACL)
	if errors.Is(err, redistest.ErrNoBinary) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	ctx := long(t)
	anon := redis.NewClient(&redis.Options{Addr: p.Addr, MaxRetries: -1})
	defer anon.Close()
	if err := anon.Ping(ctx).Err(); err != nil {
		t.Errorf("default user PING: %v", err)
	}
	if err := anon.Get(ctx, "mlsched:x").Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Errorf("default user GET: %v, want NOPERM", err)
	}
	user := redis.NewClient(&redis.Options{Addr: p.Addr, Username: authconf.RedisUser, Password: first, MaxRetries: -1})
	defer user.Close()
	if err := user.Set(ctx, "mlsched:x", "1", 0).Err(); err != nil {
		t.Errorf("mlsched SET on a statistics key: %v", err)
	}
	if err := user.Info(ctx, "server").Err(); err != nil {
		t.Errorf("mlsched INFO: %v", err)
	}
	for name, cmd := range map[string]*redis.StatusCmd{"SET other:x": user.Set(ctx, "other:x", "1", 0), "FLUSHALL": user.FlushAll(ctx)} {
		if err := cmd.Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
			t.Errorf("mlsched %s: %v, want NOPERM", name, err)
		}
	}
	wrong := redis.NewClient(&redis.Options{Addr: p.Addr, Username: authconf.RedisUser, Password: "wrong", MaxRetries: -1})
	defer wrong.Close()
	if err := wrong.Ping(ctx).Err(); err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Errorf("wrong password: %v, want WRONGPASS", err)
	}

	if _, err := authconf.Write(dir, authconf.Options{Nodes: []string{"n1"}, Redis: true}); err != nil || pw() != first {
		t.Fatalf("second run changed the password (%v)", err)
	}
	if st, _ := os.Stat(filepath.Join(dir, "node-n1.nk")); st.Mode().Perm() != 0o600 {
		t.Errorf("a run without compose's mode left the kept seed %o", st.Mode().Perm())
	}
	if _, err := authconf.Write(dir, authconf.Options{Nodes: []string{"n1"}, Redis: true, Rotate: []string{"redis"}}); err != nil || pw() == first {
		t.Fatalf("rotate redis kept the password (%v)", err)
	}
	if _, err := authconf.Write(dir, authconf.Options{Nodes: []string{"n1"}, Rotate: []string{"redis"}}); err == nil {
		t.Error("rotate redis without Redis accepted")
	}
}

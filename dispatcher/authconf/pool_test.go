package authconf_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/dispatcher/authconf"
	"github.com/mlsched/mlsched/shared/natsconn"
	"github.com/mlsched/mlsched/shared/topology"
)

// startJWTServer starts nats-server in operator mode from the auth.conf of
// `mlsched auth init -compose` (Options.JWT), with a fixed named node n1.
func startJWTServer(t *testing.T) *deployment {
	t.Helper()
	adir := filepath.Join(t.TempDir(), "auth")
	if _, err := authconf.Write(adir, authconf.Options{Nodes: []string{"n1"}, JWT: true, Redis: true, SecretMode: 0o644}); err != nil {
		t.Fatal(err)
	}
	return startJWTServerIn(t, adir)
}

// startJWTServerIn starts nats-server on the auth.conf in adir.
func startJWTServerIn(t *testing.T, adir string) *deployment {
	t.Helper()
	dir := t.TempDir()
	res := authconf.Result{}
	conf := filepath.Join(adir, "nats.conf")
	body := fmt.Sprintf("listen: \"127.0.0.1:-1\"\njetstream { store_dir: %q }\ninclude %s\n", filepath.Join(dir, "js"), authconf.ConfFile)
	if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	opts.NoLog, opts.NoSigs = os.Getenv("MLSCHED_TEST_NATS_LOG") == "", true
	s, err := server.NewServer(opts)
	if !opts.NoLog {
		opts.Debug, opts.Trace = true, true
		s.ConfigureLogger()
	}
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return &deployment{t: t, dir: adir, url: s.ClientURL(), res: res}
}

// connectCfg connects with cfg's credentials as they are.
func (d *deployment) connectCfg(name, inbox string, cfg natsconn.Config) *conn {
	d.t.Helper()
	c := &conn{t: d.t}
	cfg.URL = d.url
	nc, err := natsconn.Connect(cfg, natsconn.Conn{Name: name, Inbox: inbox},
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			c.mu.Lock()
			c.violations = append(c.violations, err.Error())
			c.mu.Unlock()
		}))
	if err != nil {
		d.t.Fatalf("connect as %s: %v", name, err)
	}
	d.t.Cleanup(nc.Close)
	c.nc = nc
	if c.js, err = jetstream.New(nc); err != nil {
		d.t.Fatal(err)
	}
	return c
}

// replica connects as a new worker replica would: its own user key, its
// own JWT signed with the pool key; the node id is its public key.
func (d *deployment) replica() (*conn, string) {
	d.t.Helper()
	cfg := natsconn.Config{PoolKey: filepath.Join(d.dir, authconf.PoolKeyFile)}
	id, err := cfg.PoolIdentity()
	if err != nil {
		d.t.Fatal(err)
	}
	return d.connectCfg("replica", natsconn.InboxNode(id), cfg), id
}

// Every replica signs its own identity with the one pool key; the server
// binds each to its own public key, so a replica can do what a node does,
// as itself only.
func TestPoolReplicasAreBoundToTheirOwnKey(t *testing.T) {
	d := startJWTServer(t)
	disp := d.connectCfg("dispatcher", natsconn.InboxDispatcher,
		natsconn.Config{Creds: authconf.Identity{Role: authconf.Dispatcher}.CredsFile(d.dir)})
	ctx := long(t)
	if err := topology.Ensure(ctx, disp.js, topology.Config{}); err != nil {
		t.Fatalf("dispatcher creates the topology (JetStream in the account): %v", err)
	}
	a, idA := d.replica()
	b, idB := d.replica()
	if idA == idB || !strings.HasPrefix(idA, "U") || len(idA) != 56 {
		t.Fatalf("replica ids %q, %q: want two distinct user public keys", idA, idB)
	}
	for _, r := range []struct {
		c  *conn
		id string
	}{{a, idA}, {b, idB}} {
		if err := topology.Ensure(ctx, r.c.js, topology.Config{}); err != nil {
			t.Fatalf("replica checks the topology: %v", err)
		}
		stream, err := r.c.js.Stream(ctx, topology.StreamDispatch)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := topology.EnsureConsumer(ctx, stream, nodeConsumer(r.id)); err != nil {
			t.Fatalf("replica creates its own consumer: %v", err)
		}
		if err := r.c.nc.Publish(topology.OutcomeSubject(r.id), []byte("{}")); err != nil {
			t.Fatal(err)
		}
	}
	// B as A: refused by the server.
	if _, err := b.nc.SubscribeSync(topology.DispatchSubject(idA)); err != nil {
		t.Fatal(err)
	}
	b.refused("B subscribes to A's dispatch subject", "Subscription", topology.DispatchSubject(idA))
	if err := b.nc.Publish(topology.OutcomeSubject(idA), []byte("{}")); err != nil {
		t.Fatal(err)
	}
	b.refused("B publishes A's outcome", "Publish", topology.OutcomeSubject(idA))
	if err := b.nc.Publish(topology.ReportSubject(idA), []byte("{}")); err != nil {
		t.Fatal(err)
	}
	b.refused("B publishes A's report", "Publish", topology.ReportSubject(idA))
	if err := b.nc.Publish("$KV."+topology.BucketNodes+"."+idA, []byte("{}")); err != nil {
		t.Fatal(err)
	}
	b.refused("B writes A's heartbeat", "Publish", "$KV."+topology.BucketNodes+"."+idA)
	stream, err := b.js.Stream(ctx, topology.StreamDispatch)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.CreateOrUpdateConsumer(short(t), nodeConsumer(idA)); err == nil {
		t.Error("B created A's consumer")
	}
	b.refused("B creates A's consumer", "Publish",
		"$JS.API.CONSUMER.CREATE."+topology.StreamDispatch+"."+topology.NodeConsumer(idA)+"."+topology.DispatchSubject(idA))
	b.mu.Lock()
	for _, v := range b.violations {
		if strings.Contains(v, idB) {
			t.Errorf("B was refused an action as itself: %s", v)
		}
	}
	b.mu.Unlock()

	// A fixed named node (creds signed by the account) works as before.
	n1 := d.connectCfg("n1", natsconn.InboxNode("n1"),
		natsconn.Config{Creds: authconf.Identity{Role: authconf.Node, NodeID: "n1"}.CredsFile(d.dir)})
	if err := topology.Ensure(ctx, n1.js, topology.Config{}); err != nil {
		t.Fatalf("n1 checks the topology: %v", err)
	}
	if err := n1.nc.Publish(topology.OutcomeSubject(idA), []byte("{}")); err != nil {
		t.Fatal(err)
	}
	n1.refused("n1 publishes A's outcome", "Publish", topology.OutcomeSubject(idA))

	// Without credentials: refused.
	if _, err := natsconn.Connect(natsconn.Config{URL: d.url}, natsconn.Conn{}); err == nil {
		t.Error("an anonymous connection was accepted")
	}
}

// A rotated role's old creds are refused: the account JWT revokes its key.
func TestJWTRotatedUserRevoked(t *testing.T) {
	d := startJWTServer(t)
	id := authconf.Identity{Role: authconf.Producer}
	old := filepath.Join(t.TempDir(), "old.creds")
	if err := os.WriteFile(old, mustRead(t, id.CredsFile(d.dir)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := authconf.Write(d.dir, authconf.Options{Nodes: []string{"n1"}, JWT: true, Redis: true, SecretMode: 0o644,
		Rotate: []string{"producer"}}); err != nil {
		t.Fatal(err)
	}
	// a server started on the rewritten auth.conf
	d2 := startJWTServerIn(t, d.dir)
	if nc, err := natsconn.Connect(natsconn.Config{URL: d2.url, Creds: old}, natsconn.Conn{}); err == nil {
		nc.Close()
		t.Error("the rotated producer's old creds were accepted")
	}
	nc, err := natsconn.Connect(natsconn.Config{URL: d2.url, Creds: id.CredsFile(d.dir)}, natsconn.Conn{})
	if err != nil {
		t.Fatalf("the new producer creds: %v", err)
	}
	nc.Close()
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Rotating the pool key and reloading nats-server (SIGHUP: docker compose
// kill -s HUP nats) refuses identities signed with the old key and accepts
// the new key's, without a restart.
func TestJWTPoolRotationReloads(t *testing.T) {
	dir := t.TempDir()
	adir := filepath.Join(dir, "auth")
	o := authconf.Options{JWT: true, Redis: true, SecretMode: 0o644}
	if _, err := authconf.Write(adir, o); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(adir, "nats.conf")
	body := fmt.Sprintf("listen: \"127.0.0.1:-1\"\njetstream { store_dir: %q }\ninclude %s\n", filepath.Join(dir, "js"), authconf.ConfFile)
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
	pool := filepath.Join(adir, authconf.PoolKeyFile)
	oldKey := filepath.Join(dir, "old-pool.nk")
	if err := os.WriteFile(oldKey, mustRead(t, pool), 0o600); err != nil {
		t.Fatal(err)
	}
	dial := func(key string) error {
		nc, err := natsconn.Connect(natsconn.Config{URL: s.ClientURL(), PoolKey: key}, natsconn.Conn{})
		if err == nil {
			nc.Close()
		}
		return err
	}
	if err := dial(oldKey); err != nil {
		t.Fatalf("a replica with the pool key: %v", err)
	}
	o.Rotate = []string{authconf.PoolRotate}
	time.Sleep(1100 * time.Millisecond) // a JWT written in another second differs (iat)
	if _, err := authconf.Write(adir, o); err != nil {
		t.Fatal(err)
	}
	if err := s.Reload(); err != nil {
		t.Fatalf("reload after rotating the pool key: %v", err)
	}
	if err := dial(oldKey); err == nil {
		t.Error("after rotation and reload, an identity signed with the old pool key was accepted")
	}
	if err := dial(pool); err != nil {
		t.Errorf("after rotation and reload, the new pool key: %v", err)
	}
}

package natsconn_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/shared/config"
	"github.com/mlsched/mlsched/shared/logtest"
	"github.com/mlsched/mlsched/shared/natsconn"
	"github.com/mlsched/mlsched/shared/tlstest"
)

func start(t *testing.T, opts *server.Options) *server.Server {
	t.Helper()
	opts.Host, opts.Port, opts.NoLog, opts.NoSigs = "127.0.0.1", server.RANDOM_PORT, true, true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s
}

func write(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func hostPort(s *server.Server) string {
	return strings.TrimPrefix(strings.TrimPrefix(s.ClientURL(), "nats://"), "tls://")
}

func mustConnect(t *testing.T, c natsconn.Config, how natsconn.Conn) *nats.Conn {
	t.Helper()
	nc, err := natsconn.Connect(c, how)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func TestNkey(t *testing.T) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	seed, _ := kp.Seed()
	s := start(t, &server.Options{Nkeys: []*server.NkeyUser{{Nkey: pub}}})

	nc := mustConnect(t, natsconn.Config{URL: s.ClientURL(), Nkey: write(t, "u.nk", string(seed))}, natsconn.Conn{})
	if !nc.IsConnected() {
		t.Fatal("not connected")
	}
	_, err = natsconn.Connect(natsconn.Config{URL: s.ClientURL()}, natsconn.Conn{})
	if !natsconn.IsAuthError(err) {
		t.Fatalf("anonymous connection: want an authorization error, got %v", err)
	}
	other, _ := nkeys.CreateUser()
	oseed, _ := other.Seed()
	_, err = natsconn.Connect(natsconn.Config{URL: s.ClientURL(), Nkey: write(t, "o.nk", string(oseed))}, natsconn.Conn{})
	if !natsconn.IsAuthError(err) {
		t.Fatalf("unknown nkey: want an authorization error, got %v", err)
	}
}

func TestUserPasswordFileAndToken(t *testing.T) {
	s := start(t, &server.Options{Users: []*server.User{{Username: "alice", Password: "s3cret-pw"}}})
	pw := write(t, "pw", "s3cret-pw\n")
	mustConnect(t, natsconn.Config{URL: s.ClientURL(), User: "alice", PasswordFile: pw}, natsconn.Conn{})
	_, err := natsconn.Connect(natsconn.Config{URL: s.ClientURL(), User: "alice", PasswordFile: write(t, "bad", "nope")}, natsconn.Conn{})
	if !natsconn.IsAuthError(err) {
		t.Fatalf("wrong password: want an authorization error, got %v", err)
	}

	ts := start(t, &server.Options{Authorization: "t0ken-xyz"})
	mustConnect(t, natsconn.Config{URL: ts.ClientURL(), TokenFile: write(t, "tok", "t0ken-xyz\n")}, natsconn.Conn{})
	if _, err := natsconn.Connect(natsconn.Config{URL: ts.ClientURL(), TokenFile: write(t, "tok2", "wrong")}, natsconn.Conn{}); !natsconn.IsAuthError(err) {
		t.Fatalf("wrong token: %v", err)
	}
}

func TestMutualTLS(t *testing.T) {
	f := tlstest.New(t)
	cert, err := tls.LoadX509KeyPair(f.ServerCert, f.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	pem, _ := os.ReadFile(f.CA)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	s := start(t, &server.Options{
		TLS: true, TLSVerify: true, TLSTimeout: 2,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12},
	})
	url := "tls://" + hostPort(s)
	nc := mustConnect(t, natsconn.Config{URL: url, CA: f.CA, Cert: f.ClientCert, Key: f.ClientKey}, natsconn.Conn{})
	if _, ok := nc.TLSConnectionState(); ok != nil {
		t.Fatalf("no TLS state: %v", ok)
	}
	if _, err := natsconn.Connect(natsconn.Config{URL: url, CA: f.CA}, natsconn.Conn{Timeout: 2 * time.Second}); err == nil {
		t.Fatal("a client without a certificate was let in")
	}
	if _, err := natsconn.Connect(natsconn.Config{URL: url, Cert: f.ClientCert, Key: f.ClientKey}, natsconn.Conn{Timeout: 2 * time.Second}); err == nil {
		t.Fatal("a client that does not trust the test CA connected")
	}
}

func TestServerListAndInboxPrefix(t *testing.T) {
	s := start(t, &server.Options{})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "nats://" + l.Addr().String()
	l.Close()
	c := natsconn.Config{URL: " " + dead + " , " + s.ClientURL()}
	if got := c.Servers(); len(got) != 2 || got[0] != dead {
		t.Fatalf("Servers = %q", got)
	}
	nc := mustConnect(t, c, natsconn.Conn{Inbox: natsconn.InboxNode("n1")})
	if got := nc.ConnectedUrl(); got != s.ClientURL() {
		t.Fatalf("connected to %s, want %s", got, s.ClientURL())
	}
	if in := nc.NewInbox(); !strings.HasPrefix(in, "_INBOX.node.n1.") {
		t.Fatalf("inbox %q does not use the node prefix", in)
	}
	c.InboxPrefix = "_INBOX.custom"
	if in := mustConnect(t, c, natsconn.Conn{Inbox: natsconn.InboxAdmin}).NewInbox(); !strings.HasPrefix(in, "_INBOX.custom.") {
		t.Fatalf("inbox %q ignores MLSCHED_NATS_INBOX_PREFIX", in)
	}
	if got := (natsconn.Config{}).Servers(); len(got) != 1 || got[0] != natsconn.DefaultURL {
		t.Fatalf("default servers %q", got)
	}
}

// Credentials in a URL appear neither in a connect error nor in the
// reconnection log lines.
func TestCredentialsRedacted(t *testing.T) {
	const pw = "hunter2-secret"
	s := start(t, &server.Options{Users: []*server.User{{Username: "bob", Password: pw}}})
	bad := fmt.Sprintf("nats://bob:%s-wrong@%s", pw, hostPort(s))
	_, err := natsconn.Connect(natsconn.Config{URL: bad}, natsconn.Conn{})
	if err == nil || strings.Contains(err.Error(), pw) || !natsconn.IsAuthError(err) {
		t.Fatalf("error %v: want an authorization error without the password", err)
	}

	var buf logtest.Buffer
	log := zerolog.New(&buf)
	reconnected := make(chan struct{}, 1)
	c := natsconn.Config{URL: fmt.Sprintf("nats://bob:%s@%s", pw, hostPort(s))}
	nc, err := natsconn.Connect(c, natsconn.Conn{Log: &log, Retry: true},
		nats.ReconnectWait(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	prev := nc.Opts.ReconnectedCB
	nc.SetReconnectHandler(func(c *nats.Conn) { prev(c); reconnected <- struct{}{} })
	if err := nc.ForceReconnect(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-reconnected:
	case <-time.After(10 * time.Second):
		t.Fatal("no reconnection")
	}
	out := buf.String()
	if !strings.Contains(out, "reconnected to NATS") {
		t.Fatalf("no reconnection logged: %s", out)
	}
	if strings.Contains(out, pw) || strings.Contains(out, "bob") {
		t.Fatalf("credentials in the log: %s", out)
	}
	if got := c.Redacted(); strings.Contains(got, pw) {
		t.Fatalf("Redacted = %q", got)
	}
}

func TestValidate(t *testing.T) {
	for _, c := range []natsconn.Config{
		{Nkey: "a", TokenFile: "b"},
		{User: "u"},
		{PasswordFile: "p"},
		{Cert: "c"},
		{InboxPrefix: "_INBOX.>"},
		{InboxPrefix: "x."},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
	if _, err := natsconn.Connect(natsconn.Config{Nkey: filepath.Join(t.TempDir(), "missing.nk")}, natsconn.Conn{}); err == nil || !strings.Contains(err.Error(), "MLSCHED_NATS_NKEY") {
		t.Fatalf("missing seed file: %v", err)
	}
}

// envconfig reads MLSCHED_NATS_*, and never the bare $USER or $URL.
func TestEnvconfig(t *testing.T) {
	t.Setenv("USER", "root")
	t.Setenv("URL", "nats://wrong:1")
	t.Setenv("MLSCHED_NATS_NKEY", "/run/secrets/node.nk")
	t.Setenv("MLSCHED_NATS_INBOX_PREFIX", "_INBOX.x")
	t.Setenv("MLSCHED_NATS_PASSWORD_FILE", "")
	var spec struct{ NATS natsconn.Config }
	if err := config.Load(&spec); err != nil {
		t.Fatal(err)
	}
	c := spec.NATS
	if c.User != "" || c.URL != natsconn.DefaultURL || c.Nkey != "/run/secrets/node.nk" || c.InboxPrefix != "_INBOX.x" {
		t.Fatalf("loaded %+v", c)
	}
	var usage bytes.Buffer
	if err := config.Usage(&usage, &spec); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"MLSCHED_NATS_URL", "MLSCHED_NATS_PASSWORD_FILE", "MLSCHED_NATS_TOKEN_FILE", "MLSCHED_NATS_INBOX_PREFIX", "MLSCHED_NATS_CA"} {
		if !strings.Contains(usage.String(), v) {
			t.Errorf("usage lacks %s:\n%s", v, usage.String())
		}
	}
}

// An http:// URL is refused with a message saying what to use (issue 22:
// nats.go said only EOF); nats://, tls:// and a bare host:port pass.
func TestValidateRefusesHTTPURLs(t *testing.T) {
	for _, u := range []string{"http://127.0.0.1:8222", "nats://a:4222,https://b:443", "redis://x:6379"} {
		err := natsconn.Config{URL: u}.Validate()
		if err == nil || !strings.Contains(err.Error(), "invalid MLSCHED_NATS_URL=") || !strings.Contains(err.Error(), "nats://") {
			t.Errorf("URL %q: error %v, want one naming MLSCHED_NATS_URL and saying to use nats://", u, err)
		}
	}
	for _, u := range []string{"", "nats://127.0.0.1:4222", "tls://h:4222,nats://g:4222", "127.0.0.1:4222"} {
		if err := (natsconn.Config{URL: u}).Validate(); err != nil {
			t.Errorf("URL %q refused: %v", u, err)
		}
	}
}

// A long-running process started before NATS waits for it, saying so,
// instead of exiting (issue 22); it gives up when its context ends.
func TestConnectContextWaitsForTheServer(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close() // free now; the server starts on it later
	var buf logtest.Buffer
	log := zerolog.New(&buf)
	c := natsconn.Config{URL: fmt.Sprintf("nats://127.0.0.1:%d", port)}
	type res struct {
		nc  *nats.Conn
		err error
	}
	got := make(chan res, 1)
	go func() {
		nc, err := natsconn.ConnectContext(t.Context(), c, natsconn.Conn{Log: &log, Retry: true})
		got <- res{nc, err}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(buf.String(), "NATS does not answer at start: retrying") {
		if time.Now().After(deadline) {
			t.Fatalf("no warning while NATS is down; log: %s", buf.String())
		}
		time.Sleep(10 * time.Millisecond) // polling interval
	}
	opts := &server.Options{Host: "127.0.0.1", Port: port, NoLog: true, NoSigs: true}
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatalf("ConnectContext: %v", r.err)
		}
		r.nc.Close()
	case <-time.After(20 * time.Second):
		t.Fatal("still not connected 20s after the server started")
	}

	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if _, err := natsconn.ConnectContext(ctx, natsconn.Config{URL: "nats://127.0.0.1:1"}, natsconn.Conn{Retry: true}); err == nil || !strings.Contains(err.Error(), "gave up") {
		t.Fatalf("with the context over: %v, want it to give up", err)
	}
	if _, err := natsconn.ConnectContext(t.Context(), natsconn.Config{URL: "nats://127.0.0.1:1"}, natsconn.Conn{}); err == nil {
		t.Fatal("without Retry it retried or connected")
	}
}

package natsconn_test

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/shared/config"
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

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

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

	var buf syncBuf
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

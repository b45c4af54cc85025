package redistest

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mlsched/mlsched/shared/tlstest"
)

// StartTLS runs a fresh redis-server for t that speaks TLS only (no plain
// port) on a free loopback port, with f's server certificate and f's CA to
// verify client certificates; authClients makes a client certificate
// required. It is stopped by t.Cleanup. It skips the test when the
// installed redis-server was built without TLS, and fails it when there is
// none.
func StartTLS(t testing.TB, f tlstest.Files, authClients bool) *Process {
	t.Helper()
	bin, err := exec.LookPath(Binary)
	if err != nil {
		t.Fatalf("redistest: %v", ErrNoBinary)
	}
	auth := "no"
	if authClients {
		auth = "yes"
	}
	pingTLS, err := tlsPing(f)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	dir := t.TempDir()
	var lastErr error
	for try := 0; try < 5; try++ { // a picked port can be taken meanwhile
		port, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		args := []string{
			"--port", "0", "--tls-port", strconv.Itoa(port),
			"--tls-cert-file", f.ServerCert, "--tls-key-file", f.ServerKey, "--tls-ca-cert-file", f.CA,
			"--tls-auth-clients", auth,
			"--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir,
			"--daemonize", "no", "--protected-mode", "no", "--loglevel", "warning", "--logfile", "",
		}
		p, err := startCmdPing(bin, args, dir, port, pingTLS)
		if err == nil {
			t.Cleanup(p.Stop)
			return p
		}
		if msg := err.Error(); strings.Contains(msg, "tls-port") || strings.Contains(msg, "TLS support") ||
			strings.Contains(msg, "Bad directive") {
			t.Skipf("the installed redis-server has no TLS support (Debian's is built with it): %v", err)
		}
		lastErr = err
	}
	t.Fatalf("redistest: TLS redis-server: %v", lastErr)
	return nil
}

// tlsPing pings over TLS with f's CA and client certificate.
func tlsPing(f tlstest.Files) (func(addr string) error, error) {
	ca, err := os.ReadFile(f.CA)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, errors.New("no certificate in " + f.CA)
	}
	cert, err := tls.LoadX509KeyPair(f.ClientCert, f.ClientKey)
	if err != nil {
		return nil, fmt.Errorf("client certificate: %w", err)
	}
	cfg := &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
	return func(addr string) error {
		d := &net.Dialer{Timeout: 200 * time.Millisecond}
		c, err := tls.DialWithDialer(d, "tcp", addr, cfg)
		if err != nil {
			return err
		}
		return pingOn(c)
	}, nil
}

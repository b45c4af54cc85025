// Package natstest starts an embedded NATS server with JetStream on a random
// port and a temporary store directory, for tests and the dev mode.
package natstest

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Start runs an embedded server with JetStream. StoreDir "" makes a temporary
// one that Shutdown removes.
func Start(storeDir string) (*server.Server, error) {
	tmp := ""
	if storeDir == "" {
		d, err := os.MkdirTemp("", "mlsched-nats-*")
		if err != nil {
			return nil, err
		}
		storeDir, tmp = d, d
	}
	opts := &server.Options{
		Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: storeDir,
		NoLog: true, NoSigs: true, MaxPayload: 8 << 20,
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("nats server: %w", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		return nil, fmt.Errorf("nats server not ready in 10s")
	}
	if tmp != "" {
		go func() { s.WaitForShutdown(); os.RemoveAll(tmp) }()
	}
	return s, nil
}

// Server is a test server with a connected client.
type Server struct {
	*server.Server
	URL string
	NC  *nats.Conn
	JS  jetstream.JetStream
}

// New starts a server for t, stopped by t.Cleanup.
func New(t testing.TB) *Server {
	t.Helper()
	s, err := Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return &Server{Server: s, URL: s.ClientURL(), NC: nc, JS: js}
}

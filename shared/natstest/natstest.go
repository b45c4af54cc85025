// Package natstest starts an embedded NATS server with JetStream on a random
// port and a temporary store directory, for tests (natsembed has the server
// alone, for programs).
package natstest

import (
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/shared/natsembed"
)

// Start runs an embedded server with JetStream (see natsembed.Start).
func Start(storeDir string) (*server.Server, error) { return natsembed.Start(storeDir) }

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

// Package natstest starts an embedded NATS server with JetStream on a random
// port and a temporary store directory, for tests (natsembed has the server
// alone, for programs).
package natstest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/shared/freeport"
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

// Cluster is an embedded cluster of JetStream servers on loopback routes,
// with a client connected to the comma-separated URL list.
type Cluster struct {
	Servers []*server.Server
	// URL lists every server's client URL, comma-separated (what
	// nats.Connect and MLSCHED_NATS_URL take).
	URL string
	NC  *nats.Conn
	JS  jetstream.JetStream
}

// StartCluster runs n embedded JetStream servers (file storage in storeDirs
// under root, "" for a temporary root that the last shutdown removes)
// routed to each other on loopback, and waits until every server is healthy
// (JetStream meta leader elected). Shut each server down when done.
func StartCluster(n int, root string) ([]*server.Server, error) {
	if n < 1 {
		return nil, fmt.Errorf("cluster of %d servers", n)
	}
	tmp := ""
	if root == "" {
		d, err := os.MkdirTemp("", "mlsched-nats-cluster-*")
		if err != nil {
			return nil, err
		}
		root, tmp = d, d
	}
	var servers []*server.Server
	fail := func(err error) ([]*server.Server, error) {
		for _, s := range servers {
			s.Shutdown()
		}
		if tmp != "" {
			os.RemoveAll(tmp)
		}
		return nil, err
	}
	// Route ports are picked before the servers start, so that each can
	// list the others (a clustered server binds its route listener only
	// after JetStream is set up).
	ports := make([]int, n)
	var routes []string
	for i := range ports {
		p, err := freeport.Take()
		if err != nil {
			return fail(err)
		}
		ports[i] = p
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", ports[i]))
	}
	for i := range n {
		opts := &server.Options{
			ServerName: fmt.Sprintf("n%d", i+1), Host: "127.0.0.1", Port: server.RANDOM_PORT,
			JetStream: true, StoreDir: fmt.Sprintf("%s/n%d", root, i+1),
			NoLog: true, NoSigs: true, MaxPayload: 8 << 20,
			Cluster: server.ClusterOpts{Name: "natstest", Host: "127.0.0.1", Port: ports[i]},
			Routes:  server.RoutesFromStr(strings.Join(routes, ",")),
		}
		s, err := server.NewServer(opts)
		if err != nil {
			return fail(fmt.Errorf("nats server n%d: %w", i+1, err))
		}
		go s.Start()
		servers = append(servers, s)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, s := range servers {
		if !s.ReadyForConnections(10 * time.Second) {
			return fail(fmt.Errorf("nats server %s not ready in 10s", s.Name()))
		}
		for {
			h := s.Healthz(nil)
			if h.Status == "ok" {
				break
			}
			if time.Now().After(deadline) {
				return fail(fmt.Errorf("nats server %s not healthy in 30s: %s", s.Name(), h.Error))
			}
			time.Sleep(20 * time.Millisecond) // polling a condition with a deadline
		}
	}
	if tmp != "" {
		go func() {
			for _, s := range servers {
				s.WaitForShutdown()
			}
			os.RemoveAll(tmp)
		}()
	}
	return servers, nil
}

// NewCluster starts an n-server cluster for t, shut down by t.Cleanup.
func NewCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	servers, err := StartCluster(n, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, s := range servers {
			s.Shutdown()
		}
		for _, s := range servers {
			s.WaitForShutdown()
		}
	})
	urls := make([]string, len(servers))
	for i, s := range servers {
		urls[i] = s.ClientURL()
	}
	url := strings.Join(urls, ",")
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return &Cluster{Servers: servers, URL: url, NC: nc, JS: js}
}

// WaitStreamCurrent waits until the stream has a leader and every replica is
// current, or ctx ends.
func (c *Cluster) WaitStreamCurrent(ctx context.Context, name string) error {
	for {
		err := func() error {
			// One attempt's requests get a short deadline: during an election
			// a request may get no answer at all.
			ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			s, err := c.JS.Stream(ctx, name)
			if err != nil {
				return err
			}
			info, err := s.Info(ctx)
			if err != nil {
				return err
			}
			if info.Cluster == nil || info.Cluster.Leader == "" {
				return errors.New("no leader")
			}
			for _, r := range info.Cluster.Replicas {
				if !r.Current || r.Offline {
					return fmt.Errorf("replica %s not current", r.Name)
				}
			}
			return nil
		}()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("stream %s: %w (last: %v)", name, ctx.Err(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

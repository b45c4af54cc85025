package redistest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is a redis-server owned by one test; t.Cleanup kills it.
type Server struct {
	// Addr is host:port; it stays the same across Restart.
	Addr string

	dir  string
	port int

	mu   sync.Mutex
	proc *Process
}

// Start runs a fresh redis-server for t on a free loopback port. It fails
// the test when redis-server is not installed.
func Start(t testing.TB) *Server {
	t.Helper()
	dir := t.TempDir()
	p, err := StartProcess(dir, 0)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	s := &Server{Addr: p.Addr, dir: dir, port: p.Port, proc: p}
	t.Cleanup(s.Stop)
	return s
}

// Client returns a client of the server, closed by t.Cleanup. Its timeouts
// are short so that outage tests fail over quickly.
func (s *Server) Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{
		Addr:         s.Addr,
		DialTimeout:  time.Second,
		ReadTimeout:  2 * time.Second,
		WriteTimeout: 2 * time.Second,
		MaxRetries:   -1, // a test sees a failure as it happens
	})
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("redistest: ping %s: %v", s.Addr, err)
	}
	return c
}

// Stop kills the server (an outage). Safe to call more than once.
func (s *Server) Stop() {
	s.mu.Lock()
	p := s.proc
	s.proc = nil
	s.mu.Unlock()
	if p != nil {
		p.Stop()
	}
}

// Restart stops the server if it runs and starts a new, empty one on the
// same port (there is no persistence), so existing clients reconnect to it.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Stop()
	deadline := time.Now().Add(readyTimeout)
	var err error
	for {
		var p *Process
		// the port may linger for a moment after the kill
		if p, err = StartProcess(s.dir, s.port); err == nil {
			s.mu.Lock()
			s.proc = p
			s.mu.Unlock()
			return
		}
		if err == ErrNoBinary || time.Now().After(deadline) {
			break
		}
		<-time.After(20 * time.Millisecond)
	}
	t.Fatalf("redistest: restart on %s: %v", s.Addr, err)
}

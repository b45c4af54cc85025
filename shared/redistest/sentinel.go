package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelBinary is the redis-sentinel executable looked up in PATH
// (Debian's redis-sentinel package).
const SentinelBinary = "redis-sentinel"

// MasterName is the name the sentinels of a Sentinel setup monitor.
const MasterName = "mlsched"

// Sentinel is a Redis Sentinel setup on loopback: a master, a replica and
// three sentinels (quorum 2) that declare a master down after 1s, each on a
// free port, without persistence. Tests reach it through URL, as
// MLSCHED_REDIS_URL would.
type Sentinel struct {
	// Sentinels are the sentinels' addresses.
	Sentinels []string

	dir       string
	mu        sync.Mutex
	data      map[string]*Process // by address; nil while killed
	dataDirs  map[string]string
	sentinels []*Process
}

// StartSentinel starts a Sentinel setup for t and waits until every
// sentinel knows the replica and the other sentinels, so that a failover can
// happen. It skips the test when redis-sentinel is not installed.
func StartSentinel(t testing.TB) *Sentinel {
	t.Helper()
	if _, err := exec.LookPath(SentinelBinary); err != nil {
		t.Skip("redis-sentinel is not installed (Debian package redis-sentinel; `make test` installs it when run as root): skipping the Sentinel test")
	}
	s := &Sentinel{dir: t.TempDir(), data: map[string]*Process{}, dataDirs: map[string]string{}}
	t.Cleanup(s.Stop)
	master := s.startData(t, "data0", 0)
	replica := s.startData(t, "data1", 0, "--replicaof", "127.0.0.1", strconv.Itoa(master.Port))
	for i := range 3 {
		s.startSentinel(t, i, master.Port)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.waitReady(ctx, master.Addr, replica.Addr); err != nil {
		t.Fatalf("redistest: sentinel setup: %v", err)
	}
	return s
}

func (s *Sentinel) startData(t testing.TB, name string, port int, extra ...string) *Process {
	t.Helper()
	dir := filepath.Join(s.dir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p, err := StartProcessArgs(dir, port, extra...)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	s.mu.Lock()
	s.data[p.Addr] = p
	s.dataDirs[p.Addr] = dir
	s.mu.Unlock()
	return p
}

func (s *Sentinel) startSentinel(t testing.TB, i, masterPort int) {
	t.Helper()
	bin, err := exec.LookPath(SentinelBinary)
	if err != nil {
		t.Skip("redis-sentinel is not installed")
	}
	dir := filepath.Join(s.dir, "sentinel"+strconv.Itoa(i))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var lastErr error
	for try := 0; try < 5; try++ {
		port, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		conf := filepath.Join(dir, "sentinel.conf") // sentinels rewrite their configuration
		text := fmt.Sprintf(`port %d
bind 127.0.0.1
daemonize no
protected-mode no
dir %s
logfile ""
loglevel warning
sentinel monitor %s 127.0.0.1 %d 2
sentinel down-after-milliseconds %s 1000
sentinel failover-timeout %s 10000
sentinel parallel-syncs %s 1
`, port, dir, MasterName, masterPort, MasterName, MasterName, MasterName)
		if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		p, err := startCmd(bin, []string{conf}, dir, port)
		if err == nil {
			s.mu.Lock()
			s.sentinels = append(s.sentinels, p)
			s.Sentinels = append(s.Sentinels, p.Addr)
			s.mu.Unlock()
			return
		}
		lastErr = err
	}
	t.Fatalf("redistest: start sentinel %d: %v", i, lastErr)
}

// waitReady waits until every sentinel sees the master, the replica (in
// sync) and the two other sentinels.
func (s *Sentinel) waitReady(ctx context.Context, master, replica string) error {
	rc := redis.NewClient(&redis.Options{Addr: replica, MaxRetries: -1})
	defer rc.Close()
	var why string
	for {
		why = ""
		info, err := rc.Info(ctx, "replication").Result()
		if err != nil || !strings.Contains(info, "master_link_status:up") {
			why = fmt.Sprintf("replica %s not in sync: %v", replica, err)
		}
		for _, a := range s.Sentinels {
			if why != "" {
				break
			}
			sc := redis.NewSentinelClient(&redis.Options{Addr: a, MaxRetries: -1})
			addr, err1 := sc.GetMasterAddrByName(ctx, MasterName).Result()
			reps, err2 := sc.Replicas(ctx, MasterName).Result()
			sens, err3 := sc.Sentinels(ctx, MasterName).Result()
			sc.Close()
			switch {
			case err1 != nil || err2 != nil || err3 != nil:
				why = fmt.Sprintf("sentinel %s: %v %v %v", a, err1, err2, err3)
			case net.JoinHostPort(addr[0], addr[1]) != master:
				why = fmt.Sprintf("sentinel %s sees master %v", a, addr)
			case len(reps) < 1 || len(sens) < 2:
				why = fmt.Sprintf("sentinel %s sees %d replicas and %d other sentinels", a, len(reps), len(sens))
			}
		}
		if why == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready: %s", why)
		case <-time.After(50 * time.Millisecond): // poll interval
		}
	}
}

// URL is the setup's MLSCHED_REDIS_URL.
func (s *Sentinel) URL() string {
	return "redis+sentinel://" + strings.Join(s.Sentinels, ",") + "/" + MasterName
}

// Master asks the sentinels for the master's address.
func (s *Sentinel) Master(ctx context.Context) (string, error) {
	var lastErr error
	for _, a := range s.Sentinels {
		sc := redis.NewSentinelClient(&redis.Options{Addr: a, MaxRetries: -1})
		addr, err := sc.GetMasterAddrByName(ctx, MasterName).Result()
		sc.Close()
		if err == nil {
			return net.JoinHostPort(addr[0], addr[1]), nil
		}
		lastErr = err
	}
	return "", fmt.Errorf("no sentinel answered: %w", lastErr)
}

// KillMaster kills the current master with SIGKILL and returns its address.
func (s *Sentinel) KillMaster(t testing.TB) string {
	t.Helper()
	addr, err := s.Master(t.Context())
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	s.mu.Lock()
	p := s.data[addr]
	s.data[addr] = nil
	s.mu.Unlock()
	if p == nil {
		t.Fatalf("redistest: master %s is not running", addr)
	}
	p.Stop()
	return addr
}

// WaitFailover waits until the sentinels name a master other than old and
// that server says it is a master, and returns its address.
func (s *Sentinel) WaitFailover(t testing.TB, old string, timeout time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		addr, err := s.Master(t.Context())
		if err == nil && addr != old {
			c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
			info, err := c.Info(t.Context(), "replication").Result()
			c.Close()
			if err == nil && strings.Contains(info, "role:master") {
				return addr
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: no failover away from %s within %v (master now %q, %v)", old, timeout, addr, err)
		}
		time.Sleep(50 * time.Millisecond) // poll interval
	}
}

// RestartAsReplica starts the killed server at addr again, empty, as a
// replica of master, as an operator brings a failed node back.
func (s *Sentinel) RestartAsReplica(t testing.TB, addr, master string) {
	t.Helper()
	_, port, _ := net.SplitHostPort(addr)
	mh, mp, _ := net.SplitHostPort(master)
	p, _ := strconv.Atoi(port)
	s.mu.Lock()
	dir := s.dataDirs[addr]
	s.mu.Unlock()
	deadline := time.Now().Add(readyTimeout)
	for {
		proc, err := StartProcessArgs(dir, p, "--replicaof", mh, mp)
		if err == nil {
			s.mu.Lock()
			s.data[addr] = proc
			s.mu.Unlock()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: restart %s: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond) // the port may linger after the kill
	}
}

// Stop kills every process of the setup.
func (s *Sentinel) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.sentinels {
		p.Stop()
	}
	for a, p := range s.data {
		if p != nil {
			p.Stop()
		}
		s.data[a] = nil
	}
}

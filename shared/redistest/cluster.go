package redistest

import (
	"context"
	"fmt"
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

// Cluster is a Redis Cluster of three masters, each with Replicas
// replicas, on loopback, created with redis-cli --cluster create, without
// persistence; a node that misses its master for 2 s fails it over.
type Cluster struct {
	// Addrs are the nodes' addresses.
	Addrs []string

	mu    sync.Mutex
	procs map[string]*Process // by address; nil once killed
}

// ClusterOptions shape a Cluster.
type ClusterOptions struct {
	// Replicas per master (default 0: three masters alone).
	Replicas int
}

// StartCluster starts a three-master Redis Cluster for t and waits until
// every node reports cluster_state:ok. It skips the test when redis-cli
// (Debian's redis-tools, a dependency of redis-server) is missing.
func StartCluster(t testing.TB) *Cluster { return StartClusterWith(t, ClusterOptions{}) }

// StartClusterWith is StartCluster with options; with replicas it also waits
// until every replica is in sync with its master, so that any master can
// fail over.
func StartClusterWith(t testing.TB, o ClusterOptions) *Cluster {
	t.Helper()
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Skip("redis-cli is not installed (Debian package redis-tools, installed with redis-server): skipping the Redis Cluster test")
	}
	c := &Cluster{procs: map[string]*Process{}}
	t.Cleanup(c.Stop)
	dir := t.TempDir()
	for i := range 3 * (1 + o.Replicas) {
		d := filepath.Join(dir, "node"+strconv.Itoa(i))
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		p, err := StartProcessArgs(d, 0, "--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(d, "nodes.conf"),
			"--cluster-node-timeout", "2000")
		if err != nil {
			t.Fatalf("redistest: %v", err)
		}
		c.procs[p.Addr] = p
		c.Addrs = append(c.Addrs, p.Addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	args := append([]string{"--cluster", "create"}, c.Addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(o.Replicas), "--cluster-yes")
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redistest: redis-cli --cluster create: %v: %s", err, out)
	}
	for _, a := range c.Addrs {
		nc := redis.NewClient(&redis.Options{Addr: a, MaxRetries: -1})
		for {
			info, err := nc.ClusterInfo(ctx).Result()
			why := fmt.Sprintf("%v %q", err, info)
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				repl, err := nc.Info(ctx, "replication").Result()
				why = fmt.Sprintf("%v %q", err, repl)
				if err == nil && (strings.Contains(repl, "role:master") || strings.Contains(repl, "master_link_status:up")) {
					break
				}
			}
			if ctx.Err() != nil {
				nc.Close()
				t.Fatalf("redistest: cluster node %s not ready: %s", a, why)
			}
			time.Sleep(50 * time.Millisecond) // poll interval
		}
		nc.Close()
	}
	return c
}

// MasterOf returns the address of the master that serves key's slot, as a
// running node sees it.
func (c *Cluster) MasterOf(ctx context.Context, key string) (string, error) {
	var lastErr error
	for _, a := range c.running() {
		nc := redis.NewClient(&redis.Options{Addr: a, MaxRetries: -1})
		slot, err := nc.ClusterKeySlot(ctx, key).Result()
		var nodes string
		if err == nil {
			nodes, err = nc.ClusterNodes(ctx).Result()
		}
		nc.Close()
		if err != nil {
			lastErr = err
			continue
		}
		if addr := slotMaster(nodes, int(slot)); addr != "" {
			return addr, nil
		}
		lastErr = fmt.Errorf("node %s knows no live master for slot %d", a, slot)
	}
	return "", fmt.Errorf("redistest: master of %q: %w", key, lastErr)
}

// slotMaster finds, in CLUSTER NODES output, the live master serving slot.
func slotMaster(nodes string, slot int) string {
	for _, line := range strings.Split(nodes, "\n") {
		f := strings.Fields(line)
		if len(f) < 9 {
			continue
		}
		flags := "," + f[2] + ","
		if !strings.Contains(flags, ",master,") || strings.Contains(flags, ",fail") {
			continue
		}
		for _, r := range f[8:] {
			lo, hi, ok := strings.Cut(r, "-")
			if !ok {
				hi = lo
			}
			l, err1 := strconv.Atoi(lo)
			h, err2 := strconv.Atoi(hi)
			if err1 == nil && err2 == nil && l <= slot && slot <= h {
				addr, _, _ := strings.Cut(f[1], "@")
				return addr
			}
		}
	}
	return ""
}

// Kill kills the node at addr with SIGKILL.
func (c *Cluster) Kill(t testing.TB, addr string) {
	t.Helper()
	c.mu.Lock()
	p := c.procs[addr]
	c.procs[addr] = nil
	c.mu.Unlock()
	if p == nil {
		t.Fatalf("redistest: cluster node %s is not running", addr)
	}
	p.Stop()
}

// WaitFailover waits until a node other than old serves key's slot as a
// master and every running node reports cluster_state:ok, and returns it.
func (c *Cluster) WaitFailover(t testing.TB, key, old string, timeout time.Duration) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	for {
		addr, err := c.MasterOf(ctx, key)
		if err == nil && addr == old {
			err = fmt.Errorf("%s still serves the slot", old)
		}
		for _, a := range c.running() {
			if err != nil {
				break
			}
			nc := redis.NewClient(&redis.Options{Addr: a, MaxRetries: -1})
			info, ierr := nc.ClusterInfo(ctx).Result()
			nc.Close()
			if ierr != nil || !strings.Contains(info, "cluster_state:ok") {
				err = fmt.Errorf("node %s: %v %q", a, ierr, info)
			}
		}
		if err == nil {
			return addr
		}
		select {
		case <-ctx.Done():
			t.Fatalf("redistest: no failover away from %s within %v: %v", old, timeout, err)
		case <-time.After(50 * time.Millisecond): // poll interval
		}
	}
}

func (c *Cluster) running() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, a := range c.Addrs { // in start order, not map order
		if c.procs[a] != nil {
			out = append(out, a)
		}
	}
	return out
}

// URL is the cluster's MLSCHED_REDIS_URL.
func (c *Cluster) URL() string { return "redis+cluster://" + strings.Join(c.Addrs, ",") }

// Stop kills every node.
func (c *Cluster) Stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for a, p := range c.procs {
		if p != nil {
			p.Stop()
		}
		c.procs[a] = nil
	}
}

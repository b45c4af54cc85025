package redistest

import (
	"context"

	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Cluster is a Redis Cluster of three masters (no replicas) on loopback,
// created with redis-cli --cluster create, without persistence.
type Cluster struct {
	// Addrs are the nodes' addresses.
	Addrs []string
	procs []*Process
}

// StartCluster starts a three-master Redis Cluster for t and waits until
// every node reports cluster_state:ok. It skips the test when redis-cli
// (Debian's redis-tools, a dependency of redis-server) is missing.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Skip("redis-cli is not installed (Debian package redis-tools, installed with redis-server): skipping the Redis Cluster test")
	}
	c := &Cluster{}
	t.Cleanup(c.Stop)
	dir := t.TempDir()
	for i := range 3 {
		d := filepath.Join(dir, "node"+strconv.Itoa(i))
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		p, err := StartProcessArgs(d, 0, "--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(d, "nodes.conf"),
			"--cluster-node-timeout", "2000")
		if err != nil {
			t.Fatalf("redistest: %v", err)
		}
		c.procs = append(c.procs, p)
		c.Addrs = append(c.Addrs, p.Addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	args := append([]string{"--cluster", "create"}, c.Addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redistest: redis-cli --cluster create: %v: %s", err, out)
	}
	for _, a := range c.Addrs {
		nc := redis.NewClient(&redis.Options{Addr: a, MaxRetries: -1})
		for {
			info, err := nc.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if ctx.Err() != nil {
				nc.Close()
				t.Fatalf("redistest: cluster node %s not ok: %v %q", a, err, info)
			}
			time.Sleep(50 * time.Millisecond) // poll interval
		}
		nc.Close()
	}
	return c
}

// URL is the cluster's MLSCHED_REDIS_URL.
func (c *Cluster) URL() string { return "redis+cluster://" + strings.Join(c.Addrs, ",") }

// Stop kills every node.
func (c *Cluster) Stop() {
	for _, p := range c.procs {
		p.Stop()
	}
}

package harness_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/mlsched/mlsched/e2e/harness"
)

// TestGroup starts nats-server (with a non-default sync interval) and
// redis-server outside a Cluster, checks they serve and are configured as
// asked, and that Close stops them and removes the group's directory.
func TestGroup(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server is not installed")
	}
	g, err := harness.NewGroup("")
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			g.Close()
		}
	}()
	n, err := g.StartNATS("nats", "1s")
	if err != nil {
		t.Fatal(err)
	}
	conf, err := os.ReadFile(n.ConfigPath)
	if err != nil {
		t.Fatal(err)
	}
	if want := "sync_interval: 1s"; !strings.Contains(string(conf), want) {
		t.Errorf("config lacks %q:\n%s", want, conf)
	}
	resp, err := http.Get(n.MonitorURL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("healthz: %s", resp.Status)
	}
	r, err := g.StartRedis("redis")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl := redis.NewClient(&redis.Options{Addr: r.Addr})
	defer cl.Close()
	if err := cl.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	g.Close()
	closed = true
	if n.Running() || r.Running() {
		t.Error("a process still runs after Close")
	}
	if _, err := os.Stat(g.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("group directory %s still exists (%v)", g.Dir, err)
	}
}

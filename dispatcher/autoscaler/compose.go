package autoscaler

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/mlsched/mlsched/shared/protocol"
)

// Compose scales the services of one docker compose project with the
// compose CLI (`docker compose`, or the standalone `docker-compose` v2):
// a pool is a service whose containers announce worker heartbeats (their
// host name is the short container id). A scale-in is `up --scale`, which
// stops the highest-numbered containers with SIGTERM and the service's
// stop_grace_period: the worker drains, its running tasks finish.
//
// The CLI needs the Docker socket, which is root on the host: docs/operations.md
// says how to give it the least (run it on the host, or in the profile's
// container with only the socket and the project's files, read-only).
type Compose struct {
	// Command is the compose CLI (default: docker compose).
	Command []string
	// Project is the compose project name (-p); "" lets compose derive it
	// from Dir.
	Project string
	// Files are the compose files (-f); none: compose's defaults in Dir.
	Files []string
	// Dir is the project directory (the CLI's working directory).
	Dir string
	// Services restricts the pools to these services (none: every service
	// whose containers announce heartbeats).
	Services []string
	// Env is the CLI's environment (nil: this process's), for the
	// variables the compose files interpolate.
	Env []string
	// Timeout bounds one CLI call (default 2m: a scale-in waits for the
	// workers to drain).
	Timeout time.Duration
}

// Name implements Backend.
func (c *Compose) Name() string { return "compose" }

func (c *Compose) args(rest ...string) []string {
	cmd := c.Command
	if len(cmd) == 0 {
		cmd = []string{"docker", "compose"}
	}
	out := append([]string(nil), cmd...)
	if c.Project != "" {
		out = append(out, "-p", c.Project)
	}
	for _, f := range c.Files {
		out = append(out, "-f", f)
	}
	return append(out, rest...)
}

func (c *Compose) run(ctx context.Context, rest ...string) ([]byte, error) {
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = 2 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	args := c.args(rest...)
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Dir, cmd.Env = c.Dir, c.Env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 400 {
			msg = msg[len(msg)-400:]
		}
		return nil, fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, msg)
	}
	return stdout.Bytes(), nil
}

// composeContainer is the part of `compose ps --format json` read here.
type composeContainer struct {
	ID      string `json:"ID"`
	Name    string `json:"Name"`
	Service string `json:"Service"`
	State   string `json:"State"`
}

// parsePS reads `compose ps --format json`: one object per line (v2.21
// and later) or one array (before).
func parsePS(out []byte) ([]composeContainer, error) {
	out = bytes.TrimSpace(out)
	if len(out) == 0 {
		return nil, nil
	}
	if out[0] == '[' {
		var cs []composeContainer
		if err := json.Unmarshal(out, &cs); err != nil {
			return nil, fmt.Errorf("compose ps output: %w", err)
		}
		return cs, nil
	}
	var cs []composeContainer
	for _, line := range bytes.Split(out, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var c composeContainer
		if err := json.Unmarshal(line, &c); err != nil {
			return nil, fmt.Errorf("compose ps output: %w", err)
		}
		cs = append(cs, c)
	}
	return cs, nil
}

// Pools implements Backend: every service of the project (so that one
// scaled to zero is still listed), with its running containers.
func (c *Compose) Pools(ctx context.Context) ([]BackendPool, error) {
	services := c.Services
	if len(services) == 0 {
		out, err := c.run(ctx, "config", "--services")
		if err != nil {
			return nil, err
		}
		services = strings.Fields(string(out))
	}
	out, err := c.run(ctx, "ps", "--format", "json")
	if err != nil {
		return nil, err
	}
	cs, err := parsePS(out)
	if err != nil {
		return nil, err
	}
	pools := make([]BackendPool, 0, len(services))
	for _, s := range services {
		p := BackendPool{Name: s}
		for _, ct := range cs {
			if ct.Service != s || ct.State != "running" {
				continue
			}
			p.Replicas++
			p.Hosts = append(p.Hosts, shortID(ct.ID), ct.Name)
		}
		pools = append(pools, p)
	}
	return pools, nil
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// Scale implements Backend: `compose up -d --no-deps --no-recreate --scale
// S=N S`, which leaves the other services and the running replicas alone.
func (c *Compose) Scale(ctx context.Context, pool string, replicas int) error {
	if replicas < 0 {
		return fmt.Errorf("scale %s to %d: a negative count", pool, replicas)
	}
	_, err := c.run(ctx, "up", "-d", "--no-deps", "--no-recreate", "--scale", pool+"="+strconv.Itoa(replicas), pool)
	return err
}

// Heartbeats is the backend when nothing can be scaled from here (another
// orchestrator runs the workers): a pool is the set of live workers
// announcing the same models (those of one models file), named after them;
// its replicas are those workers. It recommends, through the decisions
// bucket and the metric; Scale fails with ErrCannotScale.
type Heartbeats struct {
	// Nodes reads the live heartbeats.
	Nodes func(ctx context.Context) ([]protocol.Heartbeat, error)
}

// Name implements Backend.
func (h *Heartbeats) Name() string { return "heartbeats" }

// PoolOf is the pool a worker belongs to by its models: "models:" and
// their sorted names, comma separated.
func PoolOf(hb protocol.Heartbeat) string {
	names := make([]string, 0, len(hb.Models)+len(hb.Unready))
	for _, m := range hb.Models {
		names = append(names, m.Name)
	}
	for _, u := range hb.Unready {
		names = append(names, u.Name)
	}
	sort.Strings(names)
	return "models:" + strings.Join(names, ",")
}

// Pools implements Backend.
func (h *Heartbeats) Pools(ctx context.Context) ([]BackendPool, error) {
	hbs, err := h.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	count := map[string]int{}
	for _, hb := range hbs {
		if !hb.Draining {
			count[PoolOf(hb)]++
		}
	}
	var out []BackendPool
	for name, n := range count {
		out = append(out, BackendPool{Name: name, Replicas: n, Match: func(hb protocol.Heartbeat) bool { return PoolOf(hb) == name }})
	}
	return out, nil
}

// Scale implements Backend.
func (h *Heartbeats) Scale(context.Context, string, int) error { return ErrCannotScale }

// errNoCompose is returned by DetectCompose when no compose CLI works.
var errNoCompose = errors.New("no compose CLI: neither `docker compose` nor `docker-compose` v2 runs")

// DetectCompose finds a working compose v2 CLI: `docker compose`, then
// `docker-compose` when it is v2.
func DetectCompose(ctx context.Context) ([]string, error) {
	for _, cmd := range [][]string{{"docker", "compose"}, {"docker-compose"}} {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		out, err := exec.CommandContext(ctx, cmd[0], append(cmd[1:], "version", "--short")...).Output()
		cancel()
		v := strings.TrimPrefix(strings.TrimSpace(string(out)), "v")
		if err == nil && strings.HasPrefix(v, "2") {
			return cmd, nil
		}
	}
	return nil, errNoCompose
}

package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
)

// BinaryPath is Binary for programs that are not tests (a benchmark
// command): it returns the path of a binary, building it on first use, or
// the error. Call RemoveBuilds at exit when nothing came from EnvBin.
func BinaryPath(name string) (string, error) { return binary(name) }

// RemoveBuilds removes the directory BinaryPath built into; Main does the
// same for tests.
func RemoveBuilds() {
	if binDir != "" {
		os.RemoveAll(binDir)
	}
}

// StartReady starts p and waits, at most ReadyTimeout, until ready returns
// nil. It fails fast, with the tail of the log, when p exits first.
func (p *Process) StartReady(ready func(ctx context.Context) error) error {
	return startReady(p, ready)
}

// Group is a set of processes started by a program that is not a test, such
// as mlsched-bench: the same processes as a Cluster, but errors are returned
// instead of failing a test, and Close stops everything.
type Group struct {
	// Dir holds a directory and a log file per process.
	Dir string

	// NATSConfig is appended to the configuration of every single server
	// StartNATS starts (e.g. "prof_port: 8222" for a CPU profile).
	NATSConfig string

	ownDir bool
	mu     sync.Mutex
	procs  []*Process
}

// NewGroup returns an empty group working in dir; dir "" makes a temporary
// directory that Close removes.
func NewGroup(dir string) (*Group, error) {
	g := &Group{Dir: dir}
	if dir == "" {
		d, err := os.MkdirTemp("", "mlsched-group-*")
		if err != nil {
			return nil, err
		}
		g.Dir, g.ownDir = d, true
	}
	return g, nil
}

// Process registers a process (not started) whose directory is Dir/name and
// whose log is Dir/name.log. Env entries with an empty value are dropped;
// MLSCHED_* variables of our own environment are never inherited.
func (g *Group) Process(name, path string, args []string, env map[string]string) (*Process, error) {
	dir := filepath.Join(g.Dir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	p := &Process{Name: name, Path: path, Args: args, Env: mergeEnv(env, nil), Dir: dir,
		LogPath: filepath.Join(g.Dir, name+".log")}
	g.mu.Lock()
	g.procs = append(g.procs, p)
	g.mu.Unlock()
	return p, nil
}

// StartNATS starts nats-server with the harness configuration (NATSConfig:
// file storage, sync_interval always) and waits until JetStream is healthy.
// A non-empty syncInterval replaces "always" (e.g. "2m", the server's
// default), for measuring what the fsync per write costs.
func (g *Group) StartNATS(name, syncInterval string) (*NATS, error) {
	return g.StartNATSAuth(name, syncInterval, nil)
}

// StartNATSAuth is StartNATS with the server's configuration including the
// authorization of a (nil: none, anyone may connect).
func (g *Group) StartNATSAuth(name, syncInterval string, a *Auth) (*NATS, error) {
	bin, err := BinaryPath("nats-server")
	if err != nil {
		return nil, err
	}
	var lastErr error
	for try := 0; try < 3; try++ { // a free port may be taken before we bind it
		port, err1 := FreePort()
		mport, err2 := FreePort()
		if err := errors.Join(err1, err2); err != nil {
			return nil, err
		}
		p, err := g.Process(fmt.Sprintf("%s-%d", name, try), bin, nil, nil)
		if err != nil {
			return nil, err
		}
		n := &NATS{Process: p, Port: port, MonitorPort: mport,
			URL:        fmt.Sprintf("nats://127.0.0.1:%d", port),
			MonitorURL: fmt.Sprintf("http://127.0.0.1:%d", mport),
			StoreDir:   filepath.Join(p.Dir, "jetstream"), ConfigPath: filepath.Join(p.Dir, "nats.conf")}
		conf := NATSConfig(port, mport, n.StoreDir)
		if syncInterval != "" {
			conf = strings.Replace(conf, "sync_interval: always", "sync_interval: "+syncInterval, 1)
		}
		conf += g.NATSConfig
		if a != nil {
			inc, err := a.include(p.Dir)
			if err != nil {
				return nil, err
			}
			conf += inc
		}
		if err := os.WriteFile(n.ConfigPath, []byte(conf), 0o644); err != nil {
			return nil, err
		}
		p.Args = []string{"-c", n.ConfigPath}
		if lastErr = n.Start(); lastErr == nil {
			return n, nil
		}
		p.Kill()
		if !strings.Contains(p.Logs(), "address already in use") {
			break
		}
	}
	return nil, fmt.Errorf("start nats-server: %w", lastErr)
}

// StartNATSCluster starts a cluster of nats-server processes behind
// cuttable proxies (see NATSCluster) and waits until each is healthy; Close
// of the group stops them, NATSCluster.Close also closes the proxies.
func (g *Group) StartNATSCluster(o NATSClusterOptions) (*NATSCluster, error) {
	return startNATSCluster(o, func(name string) (*Process, error) { return g.Process(name, "", nil, nil) })
}

// StartRedis starts redis-server (from PATH) without persistence and waits
// for PING.
func (g *Group) StartRedis(name string) (*Redis, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redis-server is not installed (make redis-server): %w", err)
	}
	var lastErr error
	for try := 0; try < 3; try++ {
		port, err := FreePort()
		if err != nil {
			return nil, err
		}
		p, err := g.Process(fmt.Sprintf("%s-%d", name, try), bin, nil, nil)
		if err != nil {
			return nil, err
		}
		p.Args = []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--dir", p.Dir, "--daemonize", "no", "--logfile", ""}
		r := &Redis{Process: p, Port: port, Addr: fmt.Sprintf("127.0.0.1:%d", port)}
		r.URL = "redis://" + r.Addr + "/0"
		if lastErr = r.Start(); lastErr == nil {
			return r, nil
		}
		p.Kill()
		if !strings.Contains(p.Logs(), "in use") {
			break
		}
	}
	return nil, fmt.Errorf("start redis-server: %w", lastErr)
}

// Stop stops every process of the group, newest first: SIGTERM, then
// SIGKILL after the process's StopTimeout.
func (g *Group) Stop() {
	g.mu.Lock()
	procs := append([]*Process(nil), g.procs...)
	g.mu.Unlock()
	for i := len(procs) - 1; i >= 0; i-- {
		_ = procs[i].Stop()
	}
}

// Close stops every process and removes Dir if the group made it.
func (g *Group) Close() {
	g.Stop()
	if g.ownDir {
		os.RemoveAll(g.Dir)
	}
}

// LogTail returns the last n bytes of a process's log, for error messages.
func LogTail(p *Process, n int) string { return tail(p.Logs(), n) }

// Package redistest runs real redis-server processes for tests and test
// harnesses: each on its own free loopback port and temporary directory,
// without persistence, so that tests never share state by accident and never
// touch a Redis on the default port.
package redistest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mlsched/mlsched/shared/freeport"
)

// Binary is the redis-server executable looked up in PATH.
const Binary = "redis-server"

// ErrNoBinary means redis-server is not installed.
var ErrNoBinary = errors.New("redis-server not found in PATH: run `make test` (it installs it) or `apt-get install -y redis-server`")

// readyTimeout bounds how long a fresh server may take to answer PING.
const readyTimeout = 10 * time.Second

// Process is one running redis-server.
type Process struct {
	// Addr is host:port of the server.
	Addr string
	// Port the server listens on.
	Port int

	cmd  *exec.Cmd
	done chan struct{}
	out  *lockedBuffer

	stopOnce sync.Once
}

// StartProcess starts redis-server on 127.0.0.1:port (0 picks a free port)
// with dir as its working directory, no snapshots and no append-only file,
// and waits until it answers PING. The caller must Stop it.
func StartProcess(dir string, port int) (*Process, error) {
	return StartProcessArgs(dir, port)
}

// StartProcessArgs is StartProcess with more redis-server arguments, e.g.
// "--replicaof", "127.0.0.1", "7000".
func StartProcessArgs(dir string, port int, extra ...string) (*Process, error) {
	bin, err := exec.LookPath(Binary)
	if err != nil {
		return nil, ErrNoBinary
	}
	pick := port == 0
	var lastErr error
	// A picked port can be taken by someone else between picking and
	// binding: try a few.
	for try := 0; try < 5; try++ {
		if pick {
			if port, err = FreePort(); err != nil {
				return nil, err
			}
		}
		p, err := startOnce(bin, dir, port, extra)
		if err == nil {
			return p, nil
		}
		lastErr = err
		if !pick {
			break
		}
	}
	return nil, lastErr
}

func startOnce(bin, dir string, port int, extra []string) (*Process, error) {
	args := append([]string{
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", dir,
		"--daemonize", "no",
		"--protected-mode", "no",
		"--loglevel", "warning",
		"--logfile", "",
	}, extra...)
	return startCmd(bin, args, dir, port)
}

// StartConfig runs bin (redis-server or redis-sentinel) with the
// configuration file conf, which must make it listen on 127.0.0.1:port, plus
// args, in dir, and waits until it answers PING: for tests of shipped
// configuration files. The caller picks the port (FreePort) and must Stop it.
func StartConfig(bin, conf, dir string, port int, args ...string) (*Process, error) {
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("%s not found in PATH: %w", bin, err)
	}
	return startCmd(path, append([]string{conf}, args...), dir, port)
}

// startCmd runs bin with args and waits until it answers PING on port.
func startCmd(bin string, args []string, dir string, port int) (*Process, error) {
	return startCmdPing(bin, args, dir, port, ping)
}

// startCmdPing is startCmd with the PING of ping (TLS servers need theirs).
func startCmdPing(bin string, args []string, dir string, port int, ping func(addr string) error) (*Process, error) {
	out := &lockedBuffer{}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout = out
	cmd.Stderr = out
	setSysProcAttr(cmd)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	p := &Process{
		Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		Port: port,
		cmd:  cmd,
		done: make(chan struct{}),
		out:  out,
	}
	go func() { _ = cmd.Wait(); close(p.done) }()
	if err := p.waitReady(readyTimeout, ping); err != nil {
		p.Stop()
		return nil, fmt.Errorf("%s on port %d: %w; output: %s", bin, port, err, strings.TrimSpace(out.String()))
	}
	return p, nil
}

// waitReady polls PING until PONG, the process exits, or the timeout.
func (p *Process) waitReady(timeout time.Duration, ping func(addr string) error) error {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		if ping(p.Addr) == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no PONG within %v", timeout)
		}
		select {
		case <-p.done:
			return errors.New("exited before answering PING")
		case <-tick.C:
		}
	}
}

// ping sends an inline PING and expects +PONG.
func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return err
	}
	return pingOn(c)
}

// pingOn sends an inline PING on c, expects +PONG and closes c.
func pingOn(c net.Conn) error {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if strings.TrimSpace(line) != "+PONG" {
		return fmt.Errorf("unexpected reply %q", line)
	}
	return nil
}

// Stop kills the server and waits for it to exit. It is idempotent.
func (p *Process) Stop() {
	p.stopOnce.Do(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
	})
}

// Output is what the server logged (warnings and errors).
func (p *Process) Output() string { return p.out.String() }

// FreePort returns a TCP port that stays this test process's until it exits
// (freeport.Take).
func FreePort() (int, error) { return freeport.Take() }

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() > 64<<10 { // keep the head; a runaway log must not eat memory
		return len(p), nil
	}
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

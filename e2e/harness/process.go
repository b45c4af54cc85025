package harness

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrStopTimeout is returned by Stop when the process ignored SIGTERM for
// StopTimeout and had to be killed.
var ErrStopTimeout = errors.New("did not exit after SIGTERM; killed")

// harnessRunMarker starts the line the harness writes into a log at each run.
const harnessRunMarker = "=== harness: "

// ErrNotRunning is returned when a running process is expected.
var ErrNotRunning = errors.New("process is not running")

// Process is one child process whose output goes to LogPath. It can be
// stopped, killed and started again with the same arguments, so that a test
// can restart a server on the same port and data directory.
type Process struct {
	// Name labels the process in logs and errors.
	Name string
	// Path and Args are the command line.
	Path string
	Args []string
	// Env is added to the test's environment, from which every MLSCHED_*
	// variable has been removed so that the developer's settings do not leak
	// into a test.
	Env []string
	// Dir is the working directory.
	Dir string
	// LogPath receives stdout and stderr of every run, appended.
	LogPath string
	// StopTimeout bounds how long Stop waits after SIGTERM (default 15s).
	StopTimeout time.Duration

	mu        sync.Mutex
	cmd       *exec.Cmd
	done      chan struct{}
	waitErr   error
	runs      int
	startedAt time.Time
}

// Start starts the process. It fails if it is already running.
func (p *Process) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && !closed(p.done) {
		return fmt.Errorf("%s: already running", p.Name)
	}
	f, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("%s: log: %w", p.Name, err)
	}
	p.runs++
	fmt.Fprintf(f, harnessRunMarker+"%s run %d at %s: %s %s\n", p.Name, p.runs,
		time.Now().UTC().Format(time.RFC3339Nano), p.Path, strings.Join(p.Args, " "))
	cmd := exec.Command(p.Path, p.Args...)
	cmd.Dir = p.Dir
	cmd.Env = append(cleanEnv(), p.Env...)
	cmd.Stdout, cmd.Stderr = f, f
	// A process group of its own lets Kill reach the process's children (a
	// worker's exec models); Pdeathsig kills it if the test binary dies.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("%s: start: %w", p.Name, err)
	}
	done := make(chan struct{})
	p.cmd, p.done, p.waitErr, p.startedAt = cmd, done, nil, time.Now()
	go func() {
		err := cmd.Wait()
		f.Close()
		p.mu.Lock()
		p.waitErr = err
		p.mu.Unlock()
		close(done)
	}()
	return nil
}

// Running reports whether the process has been started and not exited.
func (p *Process) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd != nil && !closed(p.done)
}

// Pid returns the process id of the current run (0 when never started).
func (p *Process) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// StartedAt is when the current run started.
func (p *Process) StartedAt() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.startedAt
}

// Exited returns a channel closed when the current run exits (nil when the
// process was never started).
func (p *Process) Exited() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

// ExitErr is the error of the last run's exit (nil for exit status 0 or while
// it runs).
func (p *Process) ExitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.waitErr
}

// Signal sends sig to the process (not its group).
func (p *Process) Signal(sig syscall.Signal) error {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil || closed(done) {
		return fmt.Errorf("%s: %w", p.Name, ErrNotRunning)
	}
	return cmd.Process.Signal(sig)
}

// Stop sends SIGTERM and waits for the exit. After StopTimeout it kills the
// process group and returns ErrStopTimeout. Stopping a process that is not
// running is a no-op. It returns the exit error of a process that exited
// with a non-zero status after SIGTERM.
func (p *Process) Stop() error {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil || closed(done) {
		return nil
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	timeout := p.StopTimeout
	if timeout <= 0 {
		timeout = 15 * time.Second
	}
	select {
	case <-done:
		return p.ExitErr()
	case <-time.After(timeout):
		p.killGroup(cmd)
		<-done
		return fmt.Errorf("%s: %w", p.Name, ErrStopTimeout)
	}
}

// Kill sends SIGKILL to the process group and waits for the exit.
func (p *Process) Kill() {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil || closed(done) {
		return
	}
	p.killGroup(cmd)
	<-done
}

func (p *Process) killGroup(cmd *exec.Cmd) {
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); err != nil {
		_ = cmd.Process.Kill()
	}
}

// Restart stops the process (SIGTERM) and starts it again.
func (p *Process) Restart() error {
	if err := p.Stop(); err != nil && !isExitErr(err) {
		return err
	}
	return p.Start()
}

// Logs returns everything the process wrote, over all runs.
func (p *Process) Logs() string {
	b, err := os.ReadFile(p.LogPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	return string(b)
}

// tail returns at most the last n bytes of s, cut at a line start.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[len(s)-n:]
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return "…\n" + s
}

func isExitErr(err error) bool {
	var ee *exec.ExitError
	return errors.As(err, &ee)
}

func closed(c chan struct{}) bool {
	if c == nil {
		return false
	}
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MLSCHED_") {
			env = append(env, kv)
		}
	}
	return env
}

// HTTPURL is the base URL of the process's HTTP listener (MLSCHED_HTTP_ADDR;
// the harness gives every dispatcher and worker 127.0.0.1:0), read from the
// "http listening" line of its current run's log. It fails when the process
// has not logged one since it last started.
func (p *Process) HTTPURL() (string, error) {
	p.mu.Lock()
	runs := p.runs
	p.mu.Unlock()
	logs := p.Logs()
	addr := ""
	for _, line := range strings.Split(logs, "\n") {
		if strings.Contains(line, harnessRunMarker) {
			addr = "" // a new run: an earlier address is stale
			continue
		}
		var rec struct {
			Message string `json:"message"`
			Addr    string `json:"addr"`
		}
		if !strings.Contains(line, "http listening") || json.Unmarshal([]byte(line), &rec) != nil {
			continue
		}
		if strings.HasPrefix(rec.Message, "http listening") && rec.Addr != "" {
			addr = rec.Addr
		}
	}
	if addr == "" {
		return "", fmt.Errorf("%s (run %d): no \"http listening\" line in its log yet", p.Name, runs)
	}
	return "http://" + addr, nil
}

package executor

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/worker/model"
)

// Restart backoff of a subprocess that died: doubles from execBackoffMin up
// to execBackoffMax, and resets once a process lived execStableAfter.
const (
	execBackoffMin  = 100 * time.Millisecond
	execBackoffMax  = 5 * time.Second
	execStableAfter = 10 * time.Second
)

// ErrProcessExited is wrapped by the error of every request that was in
// flight when the model process died (a model error).
var ErrProcessExited = errors.New("model process exited")

// execRequest is one line written to the process's stdin.
type execRequest struct {
	ID      string          `json:"id"`
	TaskID  string          `json:"task_id"`
	Type    string          `json:"type"`
	Model   string          `json:"model"`
	Attempt int             `json:"attempt"`
	Payload json.RawMessage `json:"payload,omitempty"`
}

// execResponse is one line read from the process's stdout.
type execResponse struct {
	ID        string          `json:"id"`
	Output    json.RawMessage `json:"output"`
	Error     string          `json:"error"`
	TaskError bool            `json:"task_error"`
}

type execResult struct {
	out json.RawMessage
	err error
}

// Exec runs tasks on a long-lived subprocess that speaks JSON lines: it
// reads {"id","type","payload",...} requests on stdin and answers
// {"id","output"} or {"id","error","task_error"} on stdout, in any order.
// A process that dies fails its in-flight requests as model errors and is
// restarted with backoff.
type Exec struct {
	name string
	spec model.ExecSpec
	log  zerolog.Logger
	seq  atomic.Uint64

	mu     sync.Mutex
	proc   *execProc
	up     chan struct{} // closed when proc is set
	closed bool

	done     chan struct{}
	finished chan struct{}
	// Starts counts process starts (for tests and diagnostics).
	starts atomic.Int64
}

type execProc struct {
	cmd  *exec.Cmd
	wmu  sync.Mutex
	in   io.WriteCloser
	mu   sync.Mutex
	pend map[string]chan execResult
	dead bool
}

func newExec(s model.Spec, log zerolog.Logger) *Exec {
	e := &Exec{name: s.Name, spec: *s.Exec, log: log.With().Str("model", s.Name).Logger(),
		up: make(chan struct{}), done: make(chan struct{}), finished: make(chan struct{})}
	go e.supervise()
	return e
}

// Starts returns how many times the process was started.
func (e *Exec) Starts() int64 { return e.starts.Load() }

func (e *Exec) supervise() {
	defer close(e.finished)
	backoff := execBackoffMin
	for {
		select {
		case <-e.done:
			return
		default:
		}
		p, err := e.start()
		if err == nil {
			e.starts.Add(1)
			began := time.Now()
			e.mu.Lock()
			if e.closed { // Close ran while the process started
				e.mu.Unlock()
				_ = p.cmd.Process.Kill()
				_ = p.run()
				return
			}
			e.proc = p
			close(e.up)
			e.mu.Unlock()
			waitErr := p.run()
			e.mu.Lock()
			e.proc = nil
			e.up = make(chan struct{})
			e.mu.Unlock()
			p.failAll(fmt.Errorf("%w: %v", ErrProcessExited, waitErr))
			if time.Since(began) > execStableAfter {
				backoff = execBackoffMin
			}
			err = waitErr
		}
		select {
		case <-e.done:
			return
		default:
		}
		e.log.Warn().Err(err).Dur("restart_in", backoff).Msg("model process is not running")
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-e.done:
			t.Stop()
			return
		}
		backoff = min(2*backoff, execBackoffMax)
	}
}

func (e *Exec) start() (*execProc, error) {
	cmd := exec.Command(e.spec.Command[0], e.spec.Command[1:]...)
	cmd.Dir = e.spec.Dir
	if len(e.spec.Env) > 0 {
		cmd.Env = append(os.Environ(), e.spec.Env...)
	}
	cmd.Stderr = &lineLogger{log: e.log}
	cmd.WaitDelay = time.Second
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %q: %w", e.spec.Command[0], err)
	}
	p := &execProc{cmd: cmd, in: in, pend: map[string]chan execResult{}}
	go func() { // the reader; run waits for the process
		r := bufio.NewReaderSize(out, 64<<10)
		for {
			line, err := r.ReadBytes('\n')
			if len(bytes.TrimSpace(line)) > 0 {
				p.deliver(line, e.log)
			}
			if err != nil {
				return
			}
		}
	}()
	return p, nil
}

// run waits for the process to exit.
func (p *execProc) run() error {
	err := p.cmd.Wait()
	if err == nil {
		err = errors.New("exit status 0")
	}
	return err
}

func (p *execProc) deliver(line []byte, log zerolog.Logger) {
	var r execResponse
	if err := json.Unmarshal(line, &r); err != nil || r.ID == "" {
		log.Warn().Str("line", snippet(line)).Msg("model process wrote a line that is not a response")
		return
	}
	p.mu.Lock()
	ch, ok := p.pend[r.ID]
	delete(p.pend, r.ID)
	p.mu.Unlock()
	if !ok {
		log.Warn().Str("request", r.ID).Msg("model process answered an unknown or abandoned request")
		return
	}
	switch {
	case r.Error != "" && r.TaskError:
		ch <- execResult{err: &TaskError{Msg: r.Error}}
	case r.Error != "":
		ch <- execResult{err: errors.New(r.Error)}
	default:
		if len(r.Output) == 0 {
			r.Output = json.RawMessage("null")
		}
		ch <- execResult{out: r.Output}
	}
}

func (p *execProc) failAll(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dead = true
	for id, ch := range p.pend {
		ch <- execResult{err: err}
		delete(p.pend, id)
	}
}

// Run sends the task to the process and waits for its answer.
func (e *Exec) Run(ctx context.Context, t Task) (json.RawMessage, error) {
	var p *execProc
	for p == nil {
		e.mu.Lock()
		cur, up, closed := e.proc, e.up, e.closed
		e.mu.Unlock()
		if closed {
			return nil, errors.New("model executor is closed")
		}
		if cur != nil {
			p = cur
			break
		}
		select {
		case <-up:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	id := strconv.FormatUint(e.seq.Add(1), 10)
	line, err := json.Marshal(execRequest{ID: id, TaskID: t.ID, Type: t.Type, Model: t.Model, Attempt: t.Attempt, Payload: t.Payload})
	if err != nil {
		return nil, &TaskError{Msg: "payload is not valid JSON", Err: err}
	}
	ch := make(chan execResult, 1)
	p.mu.Lock()
	if p.dead {
		p.mu.Unlock()
		return nil, fmt.Errorf("%w: restarting", ErrProcessExited)
	}
	p.pend[id] = ch
	p.mu.Unlock()
	p.wmu.Lock()
	_, err = p.in.Write(append(line, '\n'))
	p.wmu.Unlock()
	if err != nil {
		p.mu.Lock()
		delete(p.pend, id)
		p.mu.Unlock()
		return nil, fmt.Errorf("%w: write request: %v", ErrProcessExited, err)
	}
	select {
	case r := <-ch:
		return r.out, r.err
	case <-ctx.Done():
		p.mu.Lock()
		delete(p.pend, id)
		p.mu.Unlock()
		return nil, ctx.Err()
	}
}

// Close stops the process: stdin is closed so it can exit by itself, and it
// is killed if it has not after a second.
func (e *Exec) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	p := e.proc
	close(e.done)
	e.mu.Unlock()
	if p != nil {
		p.in.Close()
		select {
		case <-e.finished:
			return nil
		case <-time.After(time.Second):
			_ = p.cmd.Process.Kill()
		}
	}
	<-e.finished
	return nil
}

// lineLogger logs a subprocess's stderr line by line.
type lineLogger struct {
	log zerolog.Logger
	buf []byte
}

func (l *lineLogger) Write(b []byte) (int, error) {
	l.buf = append(l.buf, b...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			break
		}
		if s := bytes.TrimSpace(l.buf[:i]); len(s) > 0 {
			l.log.Info().Str("stderr", string(s)).Msg("model process")
		}
		l.buf = l.buf[i+1:]
	}
	if len(l.buf) > 64<<10 { // a very long line without newline
		l.log.Info().Str("stderr", snippet(l.buf)).Msg("model process")
		l.buf = l.buf[:0]
	}
	return len(b), nil
}

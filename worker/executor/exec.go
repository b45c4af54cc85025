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
	"slices"
	"strconv"
	"strings"
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

// Exec runs tasks on a long-lived subprocess that speaks JSON lines
// (docs/models.md): once loaded it prints {"ready": true}; then it reads
// {"id","type","payload",...} requests on stdin and answers {"id","output"}
// or {"id","error","task_error"} on stdout, in any order. A process that
// dies fails its in-flight requests as model errors and is restarted with
// backoff; until it is ready again requests fail at once (ErrNotReady).
type Exec struct {
	name string
	spec model.ExecSpec
	log  zerolog.Logger
	seq  atomic.Uint64

	mu     sync.Mutex
	proc   *execProc // set while a process is ready
	closed bool
	state  atomic.Pointer[string] // why proc is nil
	// changed is called when the process turns ready or exits.
	changed func()

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
	// ready is closed when the process prints its ready line.
	ready chan struct{}
	// batch: its ready line declared {"batch": true}, so a batch of tasks
	// goes to it as one {"batch": [...]} line (set before ready closes).
	batch bool
}

func newExec(s model.Spec, log zerolog.Logger, changed func()) *Exec {
	if changed == nil {
		changed = func() {}
	}
	e := &Exec{name: s.Name, spec: *s.Exec, log: log.With().Str("model", s.Name).Logger(), changed: changed,
		done: make(chan struct{}), finished: make(chan struct{})}
	e.setState("starting")
	go e.supervise()
	return e
}

// Starts returns how many times the process was started.
func (e *Exec) Starts() int64 { return e.starts.Load() }

func (e *Exec) supervise() {
	defer close(e.finished)
	backoff := execBackoffMin
	var lastErr error
	for {
		select {
		case <-e.done:
			return
		default:
		}
		if lastErr != nil {
			e.setState(fmt.Sprintf("starting again, waiting for its ready line (last: %v)", lastErr))
		} else {
			e.setState("starting, waiting for its ready line")
		}
		p, err := e.start()
		if err == nil {
			e.starts.Add(1)
			var stop bool
			began := time.Now()
			if err, stop = e.serve(p); stop {
				return
			}
			if time.Since(began) > execStableAfter {
				backoff = execBackoffMin
			}
		}
		select {
		case <-e.done:
			return
		default:
		}
		lastErr = err
		e.setState(fmt.Sprintf("restarting in %v: %v", backoff, err))
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

// serve waits for the process's ready line, serves requests until it exits,
// and returns why it ended; stop is set when Close ended it.
func (e *Exec) serve(p *execProc) (err error, stop bool) {
	exited := make(chan error, 1)
	go func() { exited <- p.run() }()
	kill := func() error { _ = p.cmd.Process.Kill(); return <-exited }
	readyTimeout := e.spec.ReadyTimeout.D()
	if readyTimeout <= 0 {
		readyTimeout = model.DefaultExecReadyTimeout
	}
	rt := time.NewTimer(readyTimeout)
	defer rt.Stop()
	select {
	case <-p.ready:
	case err := <-exited:
		return fmt.Errorf("exited before its ready line: %v", err), false
	case <-rt.C:
		return fmt.Errorf("no ready line within %v (exec.ready_timeout): killed; exit: %v", readyTimeout, kill()), false
	case <-e.done:
		kill()
		return nil, true
	}
	e.mu.Lock()
	if e.closed { // Close ran while the process started
		e.mu.Unlock()
		kill()
		return nil, true
	}
	e.proc = p
	e.setState("")
	e.mu.Unlock()
	e.log.Info().Msg("model process ready")
	e.changed()
	waitErr := <-exited
	e.mu.Lock()
	e.proc = nil
	e.mu.Unlock()
	e.setState(fmt.Sprintf("exited: %v", waitErr))
	e.changed()
	p.failAll(fmt.Errorf("%w: %v", ErrProcessExited, waitErr))
	return waitErr, false
}

func (e *Exec) setState(s string) { e.state.Store(&s) }

// Ready reports whether the process is running and has printed its ready
// line; the error says what it is doing instead.
func (e *Exec) Ready(context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return errors.New("model executor is closed")
	}
	if e.proc != nil {
		return nil
	}
	return fmt.Errorf("%w: model process %s", ErrNotReady, *e.state.Load())
}

func (e *Exec) start() (*execProc, error) {
	cmd := exec.Command(e.spec.Command[0], e.spec.Command[1:]...)
	cmd.Dir = e.spec.Dir
	cmd.Env = ModelEnv(os.Environ(), e.spec.Env)
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
	p := &execProc{cmd: cmd, in: in, pend: map[string]chan execResult{}, ready: make(chan struct{})}
	maxLine := e.spec.MaxLineBytes
	if maxLine <= 0 {
		maxLine = model.DefaultMaxLineBytes
	}
	go p.read(out, maxLine, e.log) // run waits for the process
	return p, nil
}

// read handles the process's stdout: lines before the ready line are logged,
// then each line is a response. A line over maxLine bytes fails its request
// (when its id comes early enough to be read) or else kills the process.
func (p *execProc) read(out io.Reader, maxLine int, log zerolog.Logger) {
	r := bufio.NewReaderSize(out, 64<<10)
	ready := false
	for {
		line, long, err := readLine(r, maxLine)
		switch {
		case long:
			id := leadingID(line)
			msg := fmt.Sprintf("model process wrote a line over %d bytes (exec.max_line_bytes)", maxLine)
			if !ready || id == "" || !p.fail(id, errors.New(msg)) {
				log.Error().Str("line", snippet(line)).Msg(msg + " that names no pending request: killing the process")
				_ = p.cmd.Process.Kill()
				return
			}
		case !ready && len(bytes.TrimSpace(line)) > 0:
			var hello struct {
				Ready bool `json:"ready"`
				Batch bool `json:"batch"`
			}
			if json.Unmarshal(line, &hello) == nil && hello.Ready {
				ready = true
				p.batch = hello.Batch
				close(p.ready)
			} else {
				log.Info().Str("stdout", snippet(line)).Msg("model process output before its ready line")
			}
		case len(bytes.TrimSpace(line)) > 0:
			p.deliver(line, log)
		}
		if err != nil {
			return
		}
	}
}

// readLine reads one line of at most max bytes. A longer line is consumed to
// its end and its first max bytes returned with long set.
func readLine(r *bufio.Reader, max int) (line []byte, long bool, err error) {
	for {
		frag, err := r.ReadSlice('\n')
		if len(line)+len(frag) > max {
			long = true
			if room := max - len(line); room > 0 {
				line = append(line, frag[:room]...)
			}
		} else {
			line = append(line, frag...)
		}
		if err != bufio.ErrBufferFull {
			return line, long, err
		}
	}
}

// leadingID returns the "id" of a JSON object whose text may be cut off,
// when it comes before the cut; "" otherwise.
func leadingID(prefix []byte) string {
	dec := json.NewDecoder(bytes.NewReader(prefix))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return ""
	}
	for {
		tok, err := dec.Token()
		key, ok := tok.(string)
		if err != nil || !ok {
			return ""
		}
		if key == "id" {
			if tok, err := dec.Token(); err == nil {
				if s, ok := tok.(string); ok {
					return s
				}
			}
			return ""
		}
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return ""
		}
	}
}

// fail ends the pending request id with err; false when no such request.
func (p *execProc) fail(id string, err error) bool {
	p.mu.Lock()
	ch, ok := p.pend[id]
	delete(p.pend, id)
	p.mu.Unlock()
	if ok {
		ch <- execResult{err: err}
	}
	return ok
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
	e.mu.Lock()
	p, closed := e.proc, e.closed
	e.mu.Unlock()
	if closed {
		return nil, errors.New("model executor is closed")
	}
	if p == nil {
		// Not announced while not ready: a dispatch sent before the node
		// withdrew the model fails at once, to be retried elsewhere.
		return nil, e.Ready(ctx)
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

// RunBatch sends the tasks to a process that declared batches as one line,
// {"batch": [request, ...]}, each request as Run's with its own id, and
// waits for every answer (one line per request, as for single requests).
// A process that did not declare batches gets one request per task.
func (e *Exec) RunBatch(ctx context.Context, ts []Task) ([]Result, error) {
	e.mu.Lock()
	p, closed := e.proc, e.closed
	e.mu.Unlock()
	if closed {
		return nil, errors.New("model executor is closed")
	}
	if p == nil {
		return nil, e.Ready(ctx)
	}
	if !p.batch {
		return runEach(ctx, ts, e.Run), nil
	}
	rs := make([]Result, len(ts))
	reqs := make([]json.RawMessage, 0, len(ts))
	ids := make([]string, len(ts))
	chans := make([]chan execResult, len(ts))
	for i, t := range ts {
		id := strconv.FormatUint(e.seq.Add(1), 10)
		line, err := json.Marshal(execRequest{ID: id, TaskID: t.ID, Type: t.Type, Model: t.Model, Attempt: t.Attempt, Payload: t.Payload})
		if err != nil { // this task alone: its payload is not JSON
			rs[i].Err = &TaskError{Msg: "payload is not valid JSON", Err: err}
			continue
		}
		ids[i], chans[i] = id, make(chan execResult, 1)
		reqs = append(reqs, line)
	}
	if len(reqs) == 0 {
		return rs, nil
	}
	line, err := json.Marshal(struct {
		Batch []json.RawMessage `json:"batch"`
	}{reqs})
	if err != nil {
		return nil, fmt.Errorf("encode batch: %w", err)
	}
	forget := func() {
		p.mu.Lock()
		for _, id := range ids {
			if id != "" {
				delete(p.pend, id)
			}
		}
		p.mu.Unlock()
	}
	p.mu.Lock()
	if p.dead {
		p.mu.Unlock()
		return nil, fmt.Errorf("%w: restarting", ErrProcessExited)
	}
	for i, id := range ids {
		if id != "" {
			p.pend[id] = chans[i]
		}
	}
	p.mu.Unlock()
	p.wmu.Lock()
	_, err = p.in.Write(append(line, '\n'))
	p.wmu.Unlock()
	if err != nil {
		forget()
		return nil, fmt.Errorf("%w: write request: %v", ErrProcessExited, err)
	}
	for i, ch := range chans {
		if ch == nil {
			continue
		}
		select {
		case r := <-ch:
			rs[i] = Result{Output: r.out, Err: r.err}
		case <-ctx.Done():
			forget()
			return nil, ctx.Err()
		}
	}
	return rs, nil
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

// EnvAllow are the worker's variables an exec model inherits; everything
// else (MLSCHED_* paths to credentials, cloud keys, tokens) stays with the
// worker. The models file's env adds to them (docs/security.md).
var EnvAllow = []string{"PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "PYTHONPATH", "VIRTUAL_ENV"}

// ModelEnv is an exec model's explicit environment: the allowed variables
// of environ, then the model's own entries (which win).
func ModelEnv(environ, model []string) []string {
	out := make([]string, 0, len(EnvAllow)+len(model))
	for _, kv := range environ {
		k, _, _ := strings.Cut(kv, "=")
		if slices.Contains(EnvAllow, k) {
			out = append(out, kv)
		}
	}
	return append(out, model...)
}

package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/worker/model"
)

// echoModel is deployments/models/echo_model.py.
func echoModel(t testing.TB) model.Spec {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 is not installed")
	}
	_, file, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(file), "..", "..", "deployments", "models", "echo_model.py")
	return model.Spec{Name: "py-echo", Types: []string{"t"}, Executor: model.ExecutorExec,
		Exec: &model.ExecSpec{Command: []string{"python3", script}}}
}

func newEcho(t testing.TB) *Exec {
	t.Helper()
	return newExecModel(t, echoModel(t))
}

func newExecModel(t testing.TB, s model.Spec) *Exec {
	t.Helper()
	ex, err := New(s, Options{Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ex.Close() })
	waitReady(t, ex.(*Exec))
	return ex.(*Exec)
}

// waitReady waits until the process has printed its ready line.
func waitReady(t testing.TB, ex *Exec) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for ex.Ready(context.Background()) != nil {
		if time.Now().After(deadline) {
			t.Fatalf("model never ready: %v", ex.Ready(context.Background()))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func run(t testing.TB, ex Executor, id, payload string) (json.RawMessage, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return ex.Run(ctx, Task{ID: id, Type: "t", Model: "py-echo", Attempt: 1, Payload: json.RawMessage(payload)})
}

func TestExecEchoAndErrors(t *testing.T) {
	t.Parallel()
	ex := newEcho(t)
	out, err := run(t, ex, "a", `{"text":"hi","n":[1,2]}`)
	if err != nil || string(out) != `{"text": "hi", "n": [1, 2]}` {
		t.Fatalf("echo: %s %v", out, err)
	}
	_, err = run(t, ex, "b", `{"fail":"gpu fell off"}`)
	if err == nil || IsTaskError(err) || err.Error() != "gpu fell off" {
		t.Fatalf("model error: %v", err)
	}
	_, err = run(t, ex, "c", `{"bad":"not an image"}`)
	if !IsTaskError(err) || err.Error() != "not an image" {
		t.Fatalf("task error: %v", err)
	}
}

func TestExecMultiplexesConcurrentRequests(t *testing.T) {
	t.Parallel()
	ex := newEcho(t)
	var wg sync.WaitGroup
	errs := make(chan error, 50)
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := run(t, ex, fmt.Sprint(i), fmt.Sprint(i))
			if err != nil || string(out) != fmt.Sprint(i) {
				errs <- fmt.Errorf("request %d: got %s, %v", i, out, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// A request that kills the process fails as a model error; the process is
// restarted and serves the next request.
func TestExecRestartsADeadProcess(t *testing.T) {
	t.Parallel()
	ex := newEcho(t)
	if _, err := run(t, ex, "warm", `1`); err != nil {
		t.Fatal(err)
	}
	_, err := run(t, ex, "kill", `{"exit":3}`)
	if !errors.Is(err, ErrProcessExited) || IsTaskError(err) {
		t.Fatalf("in-flight request of a dead process: %v, want ErrProcessExited", err)
	}
	// Until the new process is ready, requests fail at once as model errors.
	if err := ex.Ready(context.Background()); err != nil {
		if _, rerr := run(t, ex, "early", `1`); !errors.Is(rerr, ErrNotReady) || IsTaskError(rerr) {
			t.Errorf("request while restarting: %v, want ErrNotReady", rerr)
		}
	}
	waitReady(t, ex)
	out, err := run(t, ex, "again", `"back"`)
	if err != nil || string(out) != `"back"` {
		t.Fatalf("after restart: %s %v", out, err)
	}
	if n := ex.Starts(); n != 2 {
		t.Fatalf("process started %d times, want 2", n)
	}
}

func TestExecTimeoutAndClose(t *testing.T) {
	t.Parallel()
	spec := model.Spec{Name: "mute", Types: []string{"t"}, Executor: model.ExecutorExec,
		Exec: &model.ExecSpec{Command: []string{"sh", "-c", `echo '{"ready":true}'; cat >/dev/null`}}} // never answers
	ex := newExecModel(t, spec)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := ex.Run(ctx, Task{ID: "x", Payload: json.RawMessage(`1`)}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Run: %v, want a deadline error", err)
	}
	if err := ex.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := ex.Run(context.Background(), Task{ID: "y"}); err == nil {
		t.Fatal("Run after Close succeeded")
	}
}

func TestExecMissingProgramIsAModelFailure(t *testing.T) {
	t.Parallel()
	spec := model.Spec{Name: "ghost", Types: []string{"t"}, Executor: model.ExecutorExec,
		Exec: &model.ExecSpec{Command: []string{"/nonexistent/model-binary"}}}
	ex, err := New(spec, Options{Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	defer ex.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := ex.Run(ctx, Task{ID: "x"}); !errors.Is(err, ErrNotReady) || IsTaskError(err) {
		t.Fatalf("Run: %v, want ErrNotReady, a model error", err)
	}
	waitReadyError(t, ex.(*Exec), "/nonexistent/model-binary")
}

// Until the process prints its ready line the model is not ready and
// requests fail at once; a process that never does is killed and restarted.
func TestExecReadyHandshake(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	flag := filepath.Join(dir, "go")
	spec := model.Spec{Name: "loader", Types: []string{"t"}, Executor: model.ExecutorExec,
		Exec: &model.ExecSpec{Command: []string{"sh", "-c",
			`echo loading weights; while [ ! -e "$1" ]; do sleep 0.01; done; echo '{"ready":true}'; ` +
				`while read -r l; do echo '{"id":"'$(echo "$l" | sed 's/.*"id":"\([0-9]*\)".*/\1/')'","output":1}'; done`, "sh", flag}}}
	ex, err := New(spec, Options{Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	defer ex.Close()
	e := ex.(*Exec)
	if err := e.Ready(context.Background()); !errors.Is(err, ErrNotReady) {
		t.Fatalf("Ready while loading: %v, want ErrNotReady", err)
	}
	if _, err := run(t, ex, "early", `1`); !errors.Is(err, ErrNotReady) || IsTaskError(err) {
		t.Fatalf("request while loading: %v, want ErrNotReady", err)
	}
	if err := os.WriteFile(flag, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	waitReady(t, e)
	if out, err := run(t, ex, "x", `1`); err != nil || string(out) != "1" {
		t.Fatalf("after ready: %s %v", out, err)
	}

	mute := newExecSpecNoReady()
	ex2, err := New(mute, Options{Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	defer ex2.Close()
	deadline := time.Now().Add(20 * time.Second)
	for ex2.(*Exec).Starts() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("a process without a ready line was not restarted")
		}
		time.Sleep(10 * time.Millisecond)
	}
	waitReadyError(t, ex2.(*Exec), "no ready line within")
}

// waitReadyError waits until Ready's error names want.
func waitReadyError(t *testing.T, ex *Exec, want string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := ex.Ready(context.Background())
		if err != nil && strings.Contains(err.Error(), want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Ready: %v, want an error naming %q", err, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func newExecSpecNoReady() model.Spec {
	return model.Spec{Name: "mute", Types: []string{"t"}, Executor: model.ExecutorExec,
		Exec: &model.ExecSpec{Command: []string{"sh", "-c", "cat >/dev/null"}, ReadyTimeout: model.Duration(50 * time.Millisecond)}}
}

// An answer over exec.max_line_bytes fails its request as a model error and
// the process keeps serving; a long line naming no request kills it.
func TestExecMaxLineSize(t *testing.T) {
	t.Parallel()
	s := echoModel(t)
	s.Exec.MaxLineBytes = 4096
	ex := newExecModel(t, s)
	_, err := run(t, ex, "big", `{"big":100000}`)
	if err == nil || IsTaskError(err) || !strings.Contains(err.Error(), "over 4096 bytes") {
		t.Fatalf("long answer: %v, want a model error naming the bound", err)
	}
	if out, err := run(t, ex, "small", `{"big":10}`); err != nil || string(out) != `"xxxxxxxxxx"` {
		t.Fatalf("next answer: %s %v", out, err)
	}
	if ex.Starts() != 1 {
		t.Fatalf("%d starts, want 1", ex.Starts())
	}

	rogue := model.Spec{Name: "rogue", Types: []string{"t"}, Executor: model.ExecutorExec,
		Exec: &model.ExecSpec{MaxLineBytes: 1024, Command: []string{"sh", "-c",
			`echo '{"ready":true}'; read -r l; head -c 5000 /dev/zero | tr '\0' x; echo; cat >/dev/null`}}}
	rex := newExecModel(t, rogue)
	if _, err := run(t, rex, "r", `1`); !errors.Is(err, ErrProcessExited) {
		t.Fatalf("long line naming no request: %v, want ErrProcessExited", err)
	}
}

func TestLeadingID(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		`{"id":"7","output":"xxxx`:                "7",
		`{"output":{"a":[1,2]},"id":"8","x":"yy`:  "8",
		`{"output":"xxxxxxxxxxxxxxxxxxxxxxxxxxxx`: "",
		`["id"`:    "",
		`{"id":5}`: "",
	} {
		if got := leadingID([]byte(in)); got != want {
			t.Errorf("leadingID(%s) = %q, want %q", in, got, want)
		}
	}
}

func BenchmarkExecEcho(b *testing.B) {
	ex := newEcho(b)
	payload := json.RawMessage(`{"text":"hello"}`)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := ex.Run(context.Background(), Task{ID: "b", Payload: payload}); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// An exec model gets an explicit environment: the allow-list and its own
// entries, never the worker's secrets.
func TestExecModelEnvironmentIsExplicit(t *testing.T) {
	t.Setenv("MLSCHED_NATS_PASSWORD_FILE", "/run/secrets/nats-pw")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "aws-secret-4711")
	dump := filepath.Join(t.TempDir(), "env")
	spec := model.Spec{Name: "envdump", Types: []string{"t"}, Executor: model.ExecutorExec,
		Exec: &model.ExecSpec{Command: []string{"sh", "-c", `env > "$1"; echo '{"ready":true}'; cat >/dev/null`, "sh", dump},
			Env: []string{"MODEL_FLAG=on"}}}
	newExecModel(t, spec)
	b, err := os.ReadFile(dump)
	if err != nil {
		t.Fatal(err)
	}
	env := string(b)
	for _, bad := range []string{"MLSCHED_", "aws-secret-4711"} {
		if strings.Contains(env, bad) {
			t.Errorf("the model sees %q:\n%s", bad, env)
		}
	}
	for _, want := range []string{"MODEL_FLAG=on", "PATH="} {
		if !strings.Contains(env, want) {
			t.Errorf("the model lacks %q:\n%s", want, env)
		}
	}
}

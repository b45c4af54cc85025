package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
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
	ex, err := New(echoModel(t), Options{Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ex.Close() })
	return ex.(*Exec)
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
		Exec: &model.ExecSpec{Command: []string{"sh", "-c", "cat >/dev/null"}}} // never answers
	ex, err := New(spec, Options{Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
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
	if _, err := ex.Run(ctx, Task{ID: "x"}); err == nil || IsTaskError(err) {
		t.Fatalf("Run: %v, want a non-task error", err)
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

package worker

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/worker/executor"
	"github.com/mlsched/mlsched/worker/model"
)

// A node hosting the shipped python exec model and an HTTP model server:
// outcomes are classified end to end, and a model process that dies is
// restarted.
func TestNodeWithExecAndHTTPModels(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 is not installed")
	}
	_, file, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(file), "..", "deployments", "models", "echo_model.py")
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		switch {
		case strings.Contains(string(b), "reject"):
			http.Error(w, "cannot read input", http.StatusBadRequest)
		case strings.Contains(string(b), "crash"):
			http.Error(w, "overloaded", http.StatusServiceUnavailable)
		default:
			w.Write([]byte(`{"len":` + strconv.Itoa(len(b)) + `}`))
		}
	}))
	defer web.Close()

	h := newHarness(t, "n-ex")
	cfg := h.config()
	cfg.Concurrency = 1 // keeps the exec requests in order around the crash
	r := h.start(cfg, WithModels([]ModelSpec{
		{Name: "py", Types: []string{"t"}, Executor: model.ExecutorExec, Exec: &model.ExecSpec{Command: []string{"python3", script}}},
		{Name: "web", Types: []string{"t"}, Executor: model.ExecutorHTTP, HTTP: &model.HTTPSpec{URL: web.URL}},
	}))
	steps := []struct {
		id, model, payload string
		status             protocol.OutcomeStatus
		out                string
	}{
		{"e1", "py", `{"a":1}`, protocol.OutcomeSuccess, `{"a":1}`},
		{"e2", "py", `{"bad":"no"}`, protocol.OutcomeTaskError, ""},
		{"e3", "py", `{"fail":"oom"}`, protocol.OutcomeModelError, ""},
		{"e4", "py", `{"exit":1}`, protocol.OutcomeModelError, ""},
		{"e5", "py", `"alive"`, protocol.OutcomeSuccess, `"alive"`},
		{"h1", "web", `"12345"`, protocol.OutcomeSuccess, `{"len":7}`},
		{"h2", "web", `"reject"`, protocol.OutcomeTaskError, ""},
		{"h3", "web", `"crash"`, protocol.OutcomeModelError, ""},
	}
	h.waitAnnounced("py", true, 20*time.Second) // after its ready line
	for _, s := range steps {
		if s.id == "e5" { // e4 killed the process: wait for the new one to be ready
			waitFor(t, 20*time.Second, "py restarted and ready", func() bool {
				g := r.w.models["py"].exec.(*gate)
				return g.Executor.(*executor.Exec).Starts() >= 2 && g.ready.Load()
			})
		}
		h.dispatch(s.id, s.model, dispatchOpts{payload: s.payload})
		o := h.next(20 * time.Second)
		if o.TaskID != s.id || o.Status != s.status || (s.out != "" && string(o.Output) != s.out) {
			t.Errorf("%s: got %s %q output %s error %q; want %q %s", s.id, o.TaskID, o.Status, o.Output, o.Error, s.status, s.out)
		}
	}
}

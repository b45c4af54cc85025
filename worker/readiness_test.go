package worker

import (
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/shared/logtest"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/worker/executor"
	"github.com/mlsched/mlsched/worker/model"
)

// An OIP model is announced only while its server's health and model ready
// endpoints answer 200: withdrawn when it turns unready, announced again
// when ready. A task that reaches the node meanwhile fails at once as a
// model error. A 429 with Retry-After withdraws the model for that long.
func TestReadinessWithdrawsAndReannounces(t *testing.T) {
	t.Parallel()
	var ready, throttle, malformed atomic.Bool
	var infers atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v2/health/ready", func(w http.ResponseWriter, r *http.Request) {})
	mux.HandleFunc("GET /v2/models/m/ready", func(w http.ResponseWriter, r *http.Request) {
		if !ready.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	mux.HandleFunc("POST /v2/models/m/infer", func(w http.ResponseWriter, r *http.Request) {
		infers.Add(1)
		if malformed.Load() {
			w.Write([]byte(`{"outputs":[{"name":"y","shape":[1,3],"datatype":"INT64","data":[3]}]}`))
			return
		}
		if throttle.Load() {
			w.Header().Set("Retry-After", "1")
			http.Error(w, "busy", http.StatusTooManyRequests)
			return
		}
		w.Write([]byte(`{"outputs":[{"name":"y","shape":[1],"datatype":"INT64","data":[3]}]}`))
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()

	h := newHarness(t, "n-ready")
	cfg := h.config()
	cfg.ReadyInterval = 50 * time.Millisecond
	h.start(cfg, WithModels([]ModelSpec{
		goModel("always", "echo"),
		{Name: "m", Types: []string{"t"}, Executor: model.ExecutorHTTP, HTTP: &model.HTTPSpec{URL: srv.URL, Mode: model.HTTPOIP,
			Inputs: []model.TensorSpec{{Name: "x", Datatype: "FP32", Shape: []int64{1, -1}}}}},
	}))
	h.waitAnnounced("always", true, 10*time.Second)
	if got := h.announced(); strings.Join(got, ",") != "always" {
		t.Fatalf("announced %v before the model server is ready", got)
	}
	if u := h.heartbeat().Unready; len(u) != 1 || u[0].Name != "m" || !strings.Contains(u[0].Reason, "/v2/models/m/ready: 503") {
		t.Fatalf("unready models in the heartbeat: %+v", u)
	}
	h.dispatch("early", "m", dispatchOpts{payload: `[1,2]`})
	if o := h.next(10 * time.Second); o.Status != protocol.OutcomeModelError || !strings.Contains(o.Error, "model not ready") ||
		!strings.Contains(o.Error, "/v2/models/m/ready: 503") {
		t.Fatalf("task while unready: %s %q, want a model error naming the ready endpoint", o.Status, o.Error)
	}
	if n := infers.Load(); n != 0 {
		t.Fatalf("%d inference requests reached an unready server", n)
	}

	ready.Store(true)
	h.waitAnnounced("m", true, 10*time.Second)
	h.dispatch("ok", "m", dispatchOpts{payload: `[1,2]`})
	if o := h.next(10 * time.Second); o.Status != protocol.OutcomeSuccess || string(o.Output) != `{"y":3}` {
		t.Fatalf("ready: %s %s %q", o.Status, o.Output, o.Error)
	}

	// A malformed inference response: a model error saying what is wrong.
	malformed.Store(true)
	h.dispatch("bad-response", "m", dispatchOpts{payload: `[1,2]`})
	if o := h.next(10 * time.Second); o.Status != protocol.OutcomeModelError ||
		!strings.Contains(o.Error, "malformed inference response: outputs[0] (y): 1 elements, shape [1 3] wants 3") {
		t.Fatalf("malformed response: %s %q", o.Status, o.Error)
	}
	malformed.Store(false)

	ready.Store(false)
	h.waitAnnounced("m", false, 10*time.Second)
	ready.Store(true)
	h.waitAnnounced("m", true, 10*time.Second)

	// 429 + Retry-After: 1 → withdrawn at once, back after about a second.
	throttle.Store(true)
	h.dispatch("busy", "m", dispatchOpts{payload: `[1,2]`})
	if o := h.next(10 * time.Second); o.Status != protocol.OutcomeModelError || !strings.Contains(o.Error, "429") {
		t.Fatalf("429: %s %q, want a model error", o.Status, o.Error)
	}
	h.waitAnnounced("m", false, 5*time.Second)
	throttle.Store(false)
	h.waitAnnounced("m", true, 10*time.Second)
	if !strings.Contains(strings.Join(h.announced(), ","), "always") {
		t.Fatal("the other model was withdrawn too")
	}
}

// An exec model is announced as soon as its process says ready, and again
// after a crash, without waiting for the periodic check.
func TestExecModelAnnouncedWhenReady(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 is not installed")
	}
	_, file, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(file), "..", "deployments", "models", "echo_model.py")
	h := newHarness(t, "n-exec-ready")
	cfg := h.config()
	cfg.ReadyInterval = time.Hour // only the process's own signals can announce it
	r := h.start(cfg, WithModels([]ModelSpec{
		{Name: "py", Types: []string{"t"}, Executor: model.ExecutorExec, Exec: &model.ExecSpec{Command: []string{"python3", script}}},
	}))
	h.waitAnnounced("py", true, 20*time.Second)
	h.dispatch("crash", "py", dispatchOpts{payload: `{"exit":1}`})
	if o := h.next(20 * time.Second); o.Status != protocol.OutcomeModelError || !strings.Contains(o.Error, "model process exited") {
		t.Fatalf("crash: %s %q", o.Status, o.Error)
	}
	waitFor(t, 20*time.Second, "py restarted and ready", func() bool {
		g := r.w.models["py"].exec.(*gate)
		return g.Executor.(*executor.Exec).Starts() >= 2 && g.ready.Load()
	})
	h.waitAnnounced("py", true, 5*time.Second)
	h.dispatch("after", "py", dispatchOpts{payload: `"alive"`})
	if o := h.next(20 * time.Second); o.Status != protocol.OutcomeSuccess || string(o.Output) != `"alive"` {
		t.Fatalf("after the restart: %s %s %q", o.Status, o.Output, o.Error)
	}
}

// A model unready from the start is visible at once (issue 22: the start
// log said "models=5" and nothing else): logged at start naming it, in the
// "worker started" line, and /readyz is degraded naming it.
func TestUnreadyAtStartIsLoggedAndDegraded(t *testing.T) {
	t.Parallel()
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer down.Close()
	var logs logtest.Buffer
	h := newHarness(t, "n-unready")
	cfg := h.config()
	r := h.start(cfg, WithLogger(zerolog.New(&logs)), WithModels([]ModelSpec{
		goModel("always", "echo"),
		{Name: "remote", Types: []string{"classify"}, Executor: model.ExecutorHTTP,
			HTTP: &model.HTTPSpec{URL: down.URL, Mode: model.HTTPPassthrough, ReadyURL: down.URL + "/healthz"}},
	}))
	h.waitAnnounced("always", true, 10*time.Second)
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), `"message":"worker started"`) {
		if time.Now().After(deadline) {
			t.Fatalf("no start log; logs:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond) // polling interval
	}
	out := logs.String()
	if !strings.Contains(out, `"model":"remote"`) || !strings.Contains(out, "model not ready at start") {
		t.Errorf("the unready model is not logged at start:\n%s", out)
	}
	if !strings.Contains(out, `"unready":["remote"]`) {
		t.Errorf("the start line does not name the unready model:\n%s", out)
	}
	st := r.w.Ready(t.Context())
	if !strings.Contains(st.Degraded, "remote") {
		t.Errorf("readiness degraded %q does not name the unready model", st.Degraded)
	}
}

package worker

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/worker/model"
)

// An OIP model is announced only while its server's health and model ready
// endpoints answer 200: withdrawn when it turns unready, announced again
// when ready. A task that reaches the node meanwhile fails at once as a
// model error. A 429 with Retry-After withdraws the model for that long.
func TestReadinessWithdrawsAndReannounces(t *testing.T) {
	t.Parallel()
	var ready, throttle atomic.Bool
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

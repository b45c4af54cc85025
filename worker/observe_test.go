package worker

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mlsched/mlsched/worker/model"
)

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// The node's listener serves /healthz, /readyz (ready only while consuming)
// and /metrics with the executions it handled.
func TestWorkerMetricsAndReadiness(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "obs-1")
	cfg := h.config()
	cfg.HTTPAddr = "127.0.0.1:0"
	r := h.start(cfg, WithModels([]ModelSpec{goModel("m", "echo")}))
	addr := r.w.HTTPAddr()
	if addr == nil {
		t.Fatal("no HTTP listener")
	}
	base := "http://" + addr.String()
	waitFor(t, 10*time.Second, "ready", func() bool {
		code, _ := httpGet(t, base+"/readyz")
		return code == 200
	})
	if _, body := httpGet(t, base+"/readyz"); body != "ready\nnats: ok\nstreams: ok\nmodels: ok\n" {
		t.Errorf("/readyz body %q", body)
	}
	h.dispatch("a", "m", dispatchOpts{})
	h.dispatch("b", "m", dispatchOpts{})
	h.dispatch("c", "nope", dispatchOpts{})
	h.collect(3, 10*time.Second)
	var body string
	waitFor(t, 10*time.Second, "metrics", func() bool {
		_, body = httpGet(t, base+"/metrics")
		return strings.Contains(body, `mlsched_worker_executions_total{model="m",outcome="success"} 2`) &&
			strings.Contains(body, `mlsched_worker_executions_total{model="nope",outcome="model_error"} 1`) &&
			strings.Contains(body, `mlsched_worker_execution_duration_seconds_count{model="m"} 2`) &&
			strings.Contains(body, "mlsched_worker_inflight 0") && strings.Contains(body, "mlsched_worker_capacity 4")
	})
	if strings.Contains(body, `execution_duration_seconds_count{model="nope"}`) {
		t.Error("a model that did not run has a duration")
	}
	if promtool, err := exec.LookPath("promtool"); err == nil {
		cmd := exec.CommandContext(context.Background(), promtool, "check", "metrics")
		cmd.Stdin = strings.NewReader(body)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			t.Errorf("promtool check metrics: %v\n%s", err, out.String())
		}
	} else {
		t.Log("promtool not installed: its check is skipped (make test installs it as root)")
	}
	if code, _ := httpGet(t, base+"/nope"); code != 404 {
		t.Errorf("unknown path = %d", code)
	}
	if err := r.Stop(t); err != nil {
		t.Fatal(err)
	}
	if _, err := http.Get(base + "/healthz"); err == nil {
		t.Error("listener still up after Run returned")
	}
}

func TestWorkerBadHTTPAddr(t *testing.T) {
	t.Parallel()
	_, err := New(Config{NodeID: "n", HTTPAddr: "127.0.0.1"}, WithModels([]ModelSpec{goModel("m", "echo")}))
	if err == nil || !strings.Contains(err.Error(), "MLSCHED_HTTP_ADDR") {
		t.Fatalf("New with a bad address: %v", err)
	}
}

// A node whose only model's server is not ready is not ready, and says why;
// it becomes ready with the model.
func TestWorkerReadinessFollowsModels(t *testing.T) {
	t.Parallel()
	var up atomic.Bool
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v2/health/ready", func(http.ResponseWriter, *http.Request) {})
	mux.HandleFunc("GET /v2/models/m/ready", func(w http.ResponseWriter, _ *http.Request) {
		if !up.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	h := newHarness(t, "obs-2")
	cfg := h.config()
	cfg.HTTPAddr, cfg.ReadyInterval = "127.0.0.1:0", 50*time.Millisecond
	r := h.start(cfg, WithModels([]ModelSpec{{Name: "m", Types: []string{"t"}, Executor: model.ExecutorHTTP,
		HTTP: &model.HTTPSpec{URL: srv.URL, Mode: model.HTTPOIP}}}))
	base := "http://" + r.w.HTTPAddr().String()
	waitFor(t, 10*time.Second, "not ready naming the model", func() bool {
		code, body := httpGet(t, base+"/readyz")
		return code == 503 && strings.Contains(body, "models: error: no model is ready: m (") && strings.Contains(body, "503")
	})
	up.Store(true)
	waitFor(t, 10*time.Second, "ready with the model", func() bool {
		code, body := httpGet(t, base+"/readyz")
		return code == 200 && strings.Contains(body, "models: ok")
	})
}

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/mlsched/mlsched/e2e/harness"
	"github.com/mlsched/mlsched/shared/client"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/worker/digits"
)

// Dynamic batching on real processes: a worker hosts the scikit-learn
// digits classifier twice, over OIP v2 (deployments/models/digits_server.py)
// and as an exec model, each with batch {max_size: 32}; a dispatcher routes
// to it. Each model gets bursts of 32 held-out images with one bad image
// (a pixel of 99) in each. The test checks one result per task, that each
// bad task failed alone as a task error (the OIP server refuses the whole
// batch: the worker re-runs it task by task; the exec process answers each
// request on its own), that the others succeeded with over 90% right, and
// from the worker's metrics that the calls really were batches.
func TestBatchingRealInference(t *testing.T) {
	requireBinaries(t, "dispatcher", "worker")
	t.Parallel()
	py := sklearnPython(t)
	script := repoPath(t, "deployments/models/digits_server.py")
	c := harness.New(t)
	c.StartNATS()
	port, err := harness.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	srv := c.Process("digits-server", py, []string{script, "--port", strconv.Itoa(port), "--models", "logreg"}, nil)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	url := "http://127.0.0.1:" + strconv.Itoa(port)
	harness.Eventually(t, 3*time.Minute, "digits server live", func() error {
		if !srv.Running() {
			t.Fatalf("digits server exited: %v\n%s", srv.ExitErr(), srv.Logs())
		}
		resp, err := http.Get(url + "/v2/health/live")
		if err != nil {
			return err
		}
		resp.Body.Close()
		return nil
	})
	models := "models:\n" +
		fmt.Sprintf("  - {name: digits-oip, types: [digits], executor: http, timeout: 20s, batch: {max_size: 32, max_delay: 20ms},\n"+
			"     http: {url: %q, mode: oip, model: digits-logreg, inputs: [{name: pixels, datatype: FP32, shape: [1, 64]}]}}\n", url) +
		fmt.Sprintf("  - {name: digits-exec, types: [digits], executor: exec, timeout: 20s, batch: {max_size: 32, max_delay: 20ms},\n"+
			"     exec: {command: [%q, %q, --exec, --models, logreg]}}\n", py, script)
	path := filepath.Join(c.Dir, "batch.yaml")
	if err := os.WriteFile(path, []byte(models), 0o644); err != nil {
		t.Fatal(err)
	}
	c.StartDispatcher(harness.DispatcherOptions{})
	w := c.StartWorker(harness.WorkerOptions{NodeID: "batch-1", ModelsFile: path, Concurrency: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	harness.Eventually(t, 3*time.Minute, "both models announced with their batch size", func() error {
		hb, err := c.Heartbeat(ctx, "batch-1")
		if err != nil {
			return err
		}
		n := 0
		for _, m := range hb.Models {
			if m.BatchMaxSize == 32 {
				n++
			}
		}
		if n != 2 {
			return fmt.Errorf("announced %+v", hb.Models)
		}
		return nil
	})

	all, err := digits.Dataset()
	if err != nil {
		t.Fatal(err)
	}
	_, images := digits.Split(all)
	_, js := c.Conn()
	cl := client.New(js)
	const bursts, size = 3, 32
	type sent struct {
		label int
		bad   bool
	}
	want := map[string]sent{}
	var ids []string
	for _, m := range []string{"digits-oip", "digits-exec"} {
		for b := range bursts {
			tasks := make([]protocol.Task, size)
			for i := range tasks {
				img := images[(b*size+i)%len(images)]
				px := append([]float64(nil), img.Pixels[:]...)
				bad := i == 7
				if bad {
					px[10] = 99
				}
				payload, _ := json.Marshal(map[string]any{"pixels": px})
				id := fmt.Sprintf("%s-%d-%d", m, b, i)
				tasks[i] = protocol.Task{ID: id, Type: "digits", Payload: payload, Models: []string{m}}
				want[id] = sent{img.Label, bad}
				ids = append(ids, id)
			}
			for _, task := range tasks {
				if _, err := cl.Submit(ctx, task); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	results := map[string]*protocol.Result{}
	if err := cl.WaitAll(ctx, ids, func(r *protocol.Result) { results[r.ID] = r }); err != nil {
		t.Fatalf("results: %v (%d of %d)", err, len(results), len(ids))
	}
	right, good := 0, 0
	for _, id := range ids {
		r, s := results[id], want[id]
		if r == nil {
			t.Fatalf("%s: no result", id)
		}
		if s.bad {
			if r.Status != protocol.StatusFailed || r.ErrorCode != protocol.CodeTaskError || r.Attempts != 1 {
				t.Errorf("%s (bad pixel): %s %s after %d attempts (%s), want failed alone as a task error", id, r.Status, r.ErrorCode, r.Attempts, r.Error)
			}
			continue
		}
		if r.Status != protocol.StatusSucceeded {
			t.Errorf("%s: %s %s (%s), want succeeded: a bad task in its batch fails alone", id, r.Status, r.ErrorCode, r.Error)
			continue
		}
		good++
		var out struct {
			Label int `json:"label"`
		}
		if err := json.Unmarshal(r.Output, &out); err != nil {
			t.Errorf("%s: output %s: %v", id, r.Output, err)
		}
		if out.Label == s.label {
			right++
		}
	}
	if good > 0 && float64(right)/float64(good) < 0.9 {
		t.Errorf("%d of %d right, want over 90%%", right, good)
	}
	// The calls were batches: fewer calls than tasks for each model.
	base, err := w.HTTPURL()
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, m := range []string{"digits-oip", "digits-exec"} {
		count := metricValue(t, string(body), `mlsched_worker_batch_size_count{model="`+m+`"}`)
		sum := metricValue(t, string(body), `mlsched_worker_batch_size_sum{model="`+m+`"}`)
		if count <= 0 || sum/count < 2 {
			t.Errorf("%s: %g calls for %g tasks, want batches (mean size of 2 or more)", m, count, sum)
		}
		t.Logf("%s: %g calls, %g tasks, mean batch %.1f", m, count, sum, sum/count)
	}
}

// metricValue reads one sample of a Prometheus text exposition.
func metricValue(t *testing.T, body, series string) float64 {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no %s in the metrics", series)
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

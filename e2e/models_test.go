package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mlsched/mlsched/e2e/harness"
	"github.com/mlsched/mlsched/shared/client"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/worker/digits"
)

// sklearnPython returns a Python 3 that can import scikit-learn, or skips.
// `python3` on PATH may be a pyenv one without it; Debian's python3-sklearn
// installs into /usr/bin/python3, so that one is tried first.
func sklearnPython(t *testing.T) string {
	t.Helper()
	for _, py := range []string{"/usr/bin/python3", "python3"} {
		path, err := exec.LookPath(py)
		if err != nil {
			continue
		}
		if exec.Command(path, "-c", "import sklearn.datasets, sklearn.ensemble, sklearn.linear_model, sklearn.neighbors").Run() == nil {
			return path
		}
	}
	t.Skip("no python3 that can import scikit-learn: `make test` installs Debian's python3-sklearn with apt-get when run " +
		"as root; otherwise install it (apt-get install python3-sklearn) to run the real-inference test")
	return ""
}

// Real models behind real model servers: deployments/models/digits_server.py
// serves scikit-learn digits classifiers over OIP v2 (two server processes)
// and as an exec model; two workers host them; a producer submits held-out
// digit images. On the second server, after five requests each (pinned
// warm-up tasks), one model starts answering 500, one 429 with Retry-After,
// and one turns unready. The test checks that every task gets one successful result (the failures were
// retried elsewhere), that the predictions are right more than 90% of the
// time, and that each failing model lost its traffic within seconds.
func TestRealInference(t *testing.T) {
	requireBinaries(t, "dispatcher", "worker")
	t.Parallel()
	py := sklearnPython(t)
	script := repoPath(t, "deployments/models/digits_server.py")
	c := harness.New(t)
	c.StartNATS()

	// The model servers: "healthy" and "faulty" (each fault after 10 of
	// that model's requests).
	const faultAfter = 5
	// Training takes a second or two, but much longer on a loaded machine:
	// wait for both servers, started together, up to 3 minutes.
	type modelServer struct {
		p   *harness.Process
		url string
	}
	server := func(name string, args ...string) modelServer {
		port, err := harness.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		p := c.Process(name, py, append([]string{script, "--port", strconv.Itoa(port)}, args...), nil)
		if err := p.Start(); err != nil {
			t.Fatal(err)
		}
		return modelServer{p, "http://127.0.0.1:" + strconv.Itoa(port)}
	}
	n := strconv.Itoa(faultAfter)
	servers := []modelServer{
		server("digits-healthy", "--models", "logreg,forest"),
		server("digits-faulty", "--retry-after", "2",
			"--model-fault", "forest:500:"+n, "--model-fault", "knn:429:"+n, "--model-fault", "logreg:unready:"+n),
	}
	for _, s := range servers {
		harness.Eventually(t, 3*time.Minute, s.p.Name+" live", func() error {
			if !s.p.Running() {
				t.Fatalf("%s exited: %v\n%s", s.p.Name, s.p.ExitErr(), s.p.Logs())
			}
			resp, err := http.Get(s.url + "/v2/health/live")
			if err != nil {
				return err
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("live: %s", resp.Status)
			}
			return nil
		})
	}
	healthy, faulty := servers[0].url, servers[1].url

	oip := func(name, url, serverModel, version string) string {
		extra := ""
		if serverModel != "" {
			extra += ", model: " + serverModel
		}
		if version != "" {
			extra += `, version: "` + version + `"`
		}
		return fmt.Sprintf("  - {name: %s, types: [digits], executor: http, timeout: 20s,\n"+
			"     http: {url: %q, mode: oip%s, inputs: [{name: pixels, datatype: FP32, shape: [1, 64]}]}}\n", name, url, extra)
	}
	files := map[string]string{
		"node-1": "models:\n" + oip("digits-logreg", healthy, "", "") + oip("digits-forest", healthy, "", "1") +
			oip("forest-5xx", faulty, "digits-forest", ""),
		"node-2": "models:\n" +
			fmt.Sprintf("  - {name: digits-knn-exec, types: [digits], executor: exec, timeout: 20s,\n"+
				"     exec: {command: [%q, %q, --exec, --models, knn]}}\n", py, script) +
			oip("knn-429", faulty, "digits-knn", "") + oip("logreg-unready", faulty, "digits-logreg", "1"),
	}
	healthyModels := []string{"digits-logreg", "digits-forest", "digits-knn-exec"}
	faultyModels := []string{"forest-5xx", "knn-429", "logreg-unready"}

	c.StartDispatcher(harness.DispatcherOptions{Policy: "thompson", Env: map[string]string{
		"MLSCHED_SNAPSHOT_INTERVAL": "100ms",
	}})
	for _, node := range []string{"node-1", "node-2"} {
		path := filepath.Join(c.Dir, node+".yaml")
		if err := os.WriteFile(path, []byte(files[node]), 0o644); err != nil {
			t.Fatal(err)
		}
		c.StartWorker(harness.WorkerOptions{NodeID: node, ModelsFile: path, Concurrency: 8,
			Env: map[string]string{"MLSCHED_READY_INTERVAL": "250ms"}})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// Every model is announced once ready (the exec model after training).
	harness.Eventually(t, 3*time.Minute, "all six models announced", func() error {
		var got []string
		for _, node := range []string{"node-1", "node-2"} {
			hb, err := c.Heartbeat(ctx, node)
			if err != nil {
				return err
			}
			for _, m := range hb.Models {
				got = append(got, m.Name)
			}
		}
		if len(got) != 6 {
			return fmt.Errorf("announced %v", got)
		}
		return nil
	})

	// The producer: held-out images (never seen in training), 40 per second.
	all, err := digits.Dataset()
	if err != nil {
		t.Fatal(err)
	}
	_, images := digits.Split(all)
	_, js := c.Conn()
	cl := client.New(js)
	images = append(images, images[:150]...) // 600 tasks, 15 s
	ids := make([]string, len(images))
	submit := func(i int, only []string) {
		payload, _ := json.Marshal(map[string]any{"pixels": images[i].Pixels})
		ids[i] = fmt.Sprintf("digit-%d", i)
		task := protocol.Task{ID: ids[i], Type: "digits", Payload: payload, MaxAttempts: 5, Models: only}
		if _, err := cl.Submit(ctx, task); err != nil {
			t.Fatal(err)
		}
	}
	results := map[string]*protocol.Result{}
	var mu sync.Mutex
	collect := func(ids []string) {
		if err := cl.WaitAll(ctx, ids, func(r *protocol.Result) {
			mu.Lock()
			defer mu.Unlock()
			results[r.ID] = r
		}); err != nil {
			t.Fatalf("results: %v (%d of %d)", err, len(results), len(ids))
		}
	}
	// Warm-up: the first faultAfter requests of each faulty model, one task
	// at a time pinned to it (allow-list), so that every fault starts as the
	// steady traffic begins.
	next := 0
	for _, m := range faultyModels {
		for range faultAfter {
			submit(next, []string{m})
			collect(ids[next : next+1])
			next++
		}
	}
	warm := next
	tick := time.NewTicker(time.Second / 40)
	defer tick.Stop()
	for ; next < len(images); next++ {
		<-tick.C
		submit(next, nil)
	}
	collect(ids[warm:])

	// Nothing lost: one successful result per task, failures retried elsewhere.
	right, retried := 0, 0
	attempts := map[string]int{}
	for i, id := range ids {
		r := results[id]
		if r == nil {
			t.Fatalf("task %s has no result", id)
		}
		if r.Status != protocol.StatusSucceeded {
			t.Errorf("task %s: %s after %d attempts: %s (%s)", id, r.Status, r.Attempts, r.Error, r.ErrorCode)
			continue
		}
		if !slices.Contains(healthyModels, r.Model) && !slices.Contains(faultyModels, r.Model) {
			t.Errorf("task %s succeeded on unknown model %q", id, r.Model)
		}
		var out struct {
			Label *int `json:"label"`
		}
		if err := json.Unmarshal(r.Output, &out); err != nil || out.Label == nil {
			t.Errorf("task %s: output %s has no label", id, r.Output)
			continue
		}
		if *out.Label == images[i].Label {
			right++
		}
		if r.Attempts > 1 {
			retried++
		}
		for _, a := range r.History {
			attempts[a.Model]++
		}
	}
	accuracy := float64(right) / float64(len(ids))
	t.Logf("%d tasks, accuracy %.1f%%, %d retried; attempts per model %v", len(ids), 100*accuracy, retried, attempts)
	if accuracy <= 0.9 {
		t.Errorf("accuracy %.1f%%, want > 90%%", 100*accuracy)
	}

	// Each failing model lost its traffic within seconds of its fault's
	// start: the end of its last attempt before the fault (the unready one
	// is withdrawn before it fails anything).
	const settle = 5 * time.Second
	for _, m := range faultyModels {
		var ends []time.Time
		for _, r := range results {
			for _, a := range r.History {
				if a.Model == m {
					ends = append(ends, r.FinishedAt)
				}
			}
		}
		slices.SortFunc(ends, func(a, b time.Time) int { return a.Compare(b) })
		if len(ends) < faultAfter {
			t.Errorf("model %s got %d attempts: its fault (after %d) never started", m, len(ends), faultAfter)
			continue
		}
		faultAt := ends[faultAfter-1]
		total, on := 0, 0
		for _, r := range results {
			if r.FinishedAt.After(faultAt.Add(settle)) {
				for _, a := range r.History {
					total++
					if a.Model == m {
						on++
					}
				}
			}
		}
		t.Logf("%s: fault from %s; %d attempts in all, %d of the %d attempts later than %v after the fault",
			m, faultAt.Format("15:04:05.000"), len(ends), on, total, settle)
		if total < 40 {
			t.Errorf("%s: only %d attempts %v after its fault: the run is too short to judge", m, total, settle)
		} else if share := float64(on) / float64(total); share > 0.1 {
			t.Errorf("%s: %.1f%% of the attempts %v after its fault still went to it, want < 10%%", m, 100*share, settle)
		}
	}
	// The unready model is withdrawn from its node's heartbeat.
	if hb, err := c.Heartbeat(ctx, "node-2"); err != nil {
		t.Error(err)
	} else {
		var names []string
		for _, m := range hb.Models {
			names = append(names, m.Name)
		}
		if slices.Contains(names, "logreg-unready") || !slices.Contains(names, "digits-knn-exec") {
			t.Errorf("node-2 announces %v: want digits-knn-exec and not logreg-unready", strings.Join(names, ", "))
		}
		found := false
		for _, u := range hb.Unready {
			found = found || (u.Name == "logreg-unready" && strings.Contains(u.Reason, "/v2/models/digits-logreg/versions/1/ready: 503"))
		}
		if !found {
			t.Errorf("node-2's heartbeat does not say why logreg-unready is withdrawn: %+v", hb.Unready)
		}
	}
}

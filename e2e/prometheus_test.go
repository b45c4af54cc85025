package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mlsched/mlsched/e2e/harness"
	"github.com/mlsched/mlsched/shared/client"
	"github.com/mlsched/mlsched/shared/protocol"
)

// promSample is one series of an instant-query answer.
type promSample struct {
	Metric map[string]string
	Value  float64
}

// promQuery runs an instant PromQL query through Prometheus's HTTP API.
func promQuery(ctx context.Context, base, q string) ([]promSample, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/v1/query?query="+url.QueryEscape(q), nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var body struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string `json:"resultType"`
			Result     []struct {
				Metric map[string]string `json:"metric"`
				Value  [2]any            `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, err
	}
	if body.Status != "success" {
		return nil, fmt.Errorf("query %q: %s", q, body.Error)
	}
	var out []promSample
	for _, r := range body.Data.Result {
		s, _ := r.Value[1].(string)
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return nil, fmt.Errorf("query %q: value %v", q, r.Value)
		}
		out = append(out, promSample{Metric: r.Metric, Value: v})
	}
	return out, nil
}

// A real Prometheus server (Debian's package) scrapes a running cluster (a
// dispatcher and two workers, as processes) every second; PromQL through
// its HTTP API returns the tasks that flowed, per model success ratios in
// range, live targets, and the worker executions adding up to the
// dispatcher's attempts.
func TestPrometheusScrapesCluster(t *testing.T) {
	prom, err := exec.LookPath("prometheus")
	if err != nil {
		t.Skip("prometheus is not installed (Debian package prometheus; make test installs it when run as root)")
	}
	requireBinaries(t, "dispatcher", "worker")
	t.Parallel()
	c := harness.New(t)
	c.StartNATS()
	c.StartRedis()
	d := c.StartDispatcher(harness.DispatcherOptions{})
	w1 := c.StartWorker(harness.WorkerOptions{NodeID: "node-1", ModelsFile: "testdata/node-1.yaml", SimSeed: 1})
	w2 := c.StartWorker(harness.WorkerOptions{NodeID: "node-2", ModelsFile: "testdata/node-2.yaml", SimSeed: 2})
	target := func(p *harness.Process) string {
		u, err := p.HTTPURL()
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimPrefix(u, "http://")
	}
	t.Logf("targets: dispatcher %s, workers %s %s", target(d.Process), target(w1.Process), target(w2.Process))
	dir := t.TempDir()
	rulesFile, err := filepath.Abs("../deployments/prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf(`global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files: [%q]
scrape_configs:
  - job_name: mlsched-dispatcher
    static_configs: [{targets: [%q]}]
  - job_name: mlsched-worker
    static_configs: [{targets: [%q, %q]}]
`, rulesFile, target(d.Process), target(w1.Process), target(w2.Process))
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	port, err := harness.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	p := c.Process("prometheus", prom, []string{"--config.file=" + filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path=" + filepath.Join(dir, "data"), "--web.listen-address=127.0.0.1:" + strconv.Itoa(port)}, nil)
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	_, js := c.Conn()
	cl := client.New(js)
	const n = 200
	ids := make([]string, n)
	for i := range n {
		typ := "classify"
		if i%2 == 1 {
			typ = "embed"
		}
		ids[i] = fmt.Sprintf("prom-%d", i)
		if _, err := cl.Submit(ctx, protocol.Task{ID: ids[i], Type: typ, Payload: json.RawMessage(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := cl.WaitAll(ctx, ids, func(*protocol.Result) {}); err != nil {
		t.Fatal(err)
	}

	query := func(q string) []promSample {
		s, err := promQuery(ctx, base, q)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	harness.Eventually(t, time.Minute, "Prometheus to scrape every result", func() error {
		s, err := promQuery(ctx, base, `sum(mlsched_results_total)`)
		if err != nil {
			return err
		}
		if len(s) != 1 || s[0].Value != n {
			return fmt.Errorf("sum(mlsched_results_total) = %+v, want %d", s, n)
		}
		return nil
	})
	harness.Eventually(t, 30*time.Second, "every target scraped and up", func() error {
		s, err := promQuery(ctx, base, `up == 1`)
		if err != nil {
			return err
		}
		if len(s) != 3 {
			return fmt.Errorf("up == 1: %+v, want 3 targets", s)
		}
		return nil
	})
	for _, typ := range []string{"classify", "embed"} {
		s := query(fmt.Sprintf(`sum(mlsched_tasks_received_total{type=%q})`, typ))
		if len(s) != 1 || s[0].Value != n/2 {
			t.Errorf("tasks received of type %s: %+v, want %d", typ, s, n/2)
		}
	}
	ratios := query(`mlsched_model_success_ratio`)
	if len(ratios) < 2 {
		t.Errorf("mlsched_model_success_ratio: %+v, want a series per model used", ratios)
	}
	for _, r := range ratios {
		if r.Value < 0 || r.Value > 1 || r.Metric["model"] == "" {
			t.Errorf("implausible success ratio %+v", r)
		}
		if r.Metric["model"] == "m-fail00" && r.Value != 1 {
			t.Errorf("m-fail00 never fails but its success ratio is %v", r.Value)
		}
	}
	// Every attempt the dispatcher counted was executed by a worker.
	harness.Eventually(t, 30*time.Second, "worker executions to match the attempts", func() error {
		a, err := promQuery(ctx, base, `sum(mlsched_attempts_total)`)
		if err != nil {
			return err
		}
		e, err := promQuery(ctx, base, `sum(mlsched_worker_executions_total)`)
		if err != nil {
			return err
		}
		if len(a) != 1 || len(e) != 1 || a[0].Value != e[0].Value || a[0].Value < n {
			return fmt.Errorf("attempts %+v, executions %+v", a, e)
		}
		return nil
	})
	if s := query(`histogram_quantile(0.95, sum by (le) (mlsched_task_duration_seconds_bucket))`); len(s) != 1 ||
		!(s[0].Value > 0 && s[0].Value < 30) {
		t.Errorf("p95 submit-to-result: %+v, want a positive duration under 30s; buckets %+v", s,
			query(`mlsched_task_duration_seconds_count`))
	}
	if s := query(`mlsched_stats_degraded`); len(s) != 1 || s[0].Value != 0 {
		t.Errorf("mlsched_stats_degraded: %+v", s)
	}
	// The shipped rules load and evaluate: a healthy cluster fires nothing
	// but, perhaps, the low success ratio of the models built to fail.
	if s := query(`ALERTS{alertname=~"MlschedBreakerOpen|MlschedStatsDegraded|MlschedDispatcherDown"}`); len(s) != 0 {
		t.Errorf("alerts on a healthy cluster: %+v", s)
	}
	rules := query(`count(count by (alertname) (ALERTS)) or vector(0)`)
	t.Logf("alerts firing or pending: %v", rules)
}

package dispatcher_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/mlsched/mlsched/dispatcher"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/redistest"
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

// scrape parses the replica's /metrics.
func scrape(t *testing.T, base string) (map[string]*dto.MetricFamily, string) {
	t.Helper()
	code, body := httpGet(t, base+"/metrics")
	if code != 200 {
		t.Fatalf("/metrics = %d: %s", code, body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parse /metrics: %v\n%s", err, body)
	}
	return fams, body
}

// value returns the value of the series of name whose labels include want
// ("k=v" pairs), and whether it exists. Histograms give their sample count.
func value(fams map[string]*dto.MetricFamily, name string, want ...string) (float64, bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
next:
	for _, m := range f.Metric {
		have := map[string]string{}
		for _, l := range m.Label {
			have[l.GetName()] = l.GetValue()
		}
		for _, kv := range want {
			k, v, _ := strings.Cut(kv, "=")
			if have[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount()), true
		}
	}
	return 0, false
}

func baseURL(t *testing.T, d *dispatcher.Dispatcher) string {
	t.Helper()
	a := d.HTTPAddr()
	if a == nil {
		t.Fatal("no HTTP listener")
	}
	return "http://" + a.String()
}

// The replica's /metrics reports the tasks that flowed, with bounded labels,
// in a format promtool accepts; /readyz follows Redis in and out of degraded
// mode; unknown paths are 404.
func TestMetricsAndReadiness(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t)
	e := newEnv(t, func(c *dispatcher.Config) { c.RedisURL = "redis://" + rs.Addr + "/0" })
	e.startNode("n1", []string{"echo"}, map[string]behavior{"m1": succeed})
	// One decision per task only if the node is in the routing table when
	// the tasks come: otherwise each waits for it and is decided again
	// (make test once counted 10 decisions for 5 tasks).
	e.waitTableKnows("n1")
	base := baseURL(t, e.d)
	const n = 5
	const high = 2 // of the n, priority 5: band high
	for i := range n {
		task := protocol.Task{ID: fmt.Sprintf("ok-%d", i), Type: "echo"}
		if i < high {
			task.Priority = 5
		}
		e.submit(task)
	}
	e.publish("mlsched.tasks.echo", []byte("not json"), "")
	e.publish("mlsched.tasks.echo", []byte{0xff, 0xfe, '{'}, "")
	for i := range n {
		e.result(fmt.Sprintf("ok-%d", i))
	}

	var fams map[string]*dto.MetricFamily
	var body string
	e.waitFor("metrics of the flowed tasks", func() bool {
		fams, body = scrape(t, base)
		ok, _ := value(fams, "mlsched_results_total", "type=echo", "status=succeeded")
		dl, _ := value(fams, "mlsched_dead_letters_total", "kind=invalid")
		ratio, hasRatio := value(fams, "mlsched_model_success_ratio", "model=m1")
		return ok == n && dl == 2 && hasRatio && ratio == 1
	})
	for _, c := range []struct {
		name   string
		labels []string
		min    float64
		max    float64
	}{
		{"mlsched_tasks_received_total", []string{"type=echo"}, n, n},
		{"mlsched_tasks_received_total", []string{"type=invalid"}, 2, 2},
		{"mlsched_attempts_total", []string{"model=m1", "node=n1", "outcome=success"}, n, n},
		{"mlsched_decision_duration_seconds", nil, n, n},
		{"mlsched_task_duration_seconds", []string{"type=echo"}, n, n},
		{"mlsched_breaker_open", []string{"model=m1"}, 0, 0},
		{"mlsched_stats_degraded", nil, 0, 0},
		{"mlsched_node_inflight", []string{"node=n1"}, 0, 1e9},
		{"mlsched_nodes", nil, 1, 1},
		{"mlsched_dead_letters_total", []string{"kind=exhausted"}, 0, 0},
		{"mlsched_dispatcher_events_total", []string{"event=dispatched"}, n, n},
		{"mlsched_dispatcher_events_total", []string{"event=inversions"}, 0, 0},
		{"mlsched_dispatcher_events_total", []string{"event=expired"}, 0, 0},
		{"mlsched_quota_degraded", nil, 0, 0},
		{"mlsched_flow_admitted_total", []string{"band=high"}, high, high},
		{"mlsched_flow_admitted_total", []string{"band=normal"}, n - high, n - high},
		{"mlsched_flow_admitted_total", []string{"band=low"}, 0, 0},
		{"mlsched_flow_wait_seconds", []string{"band=high"}, high, high},
		{"mlsched_flow_wait_seconds", []string{"band=normal"}, n - high, n - high},
		{"mlsched_flow_wait_seconds", []string{"band=low"}, 0, 0},
		{"go_goroutines", nil, 1, 1e9},
	} {
		v, ok := value(fams, c.name, c.labels...)
		if !ok || v < c.min || v > c.max {
			t.Errorf("%s%v = %v (present %v), want %v..%v", c.name, c.labels, v, ok, c.min, c.max)
		}
	}
	e.waitFor("backlog gauge", func() bool {
		fams, _ = scrape(t, base)
		v, ok := value(fams, "mlsched_backlog_tasks", "type=echo")
		return ok && v == 0
	})
	// the streams' sizes and bounds (sampled at start, then every 10s)
	e.waitFor("stream gauges", func() bool {
		fams, _ = scrape(t, base)
		max, ok1 := value(fams, "mlsched_stream_max_messages", "stream=MLSCHED_RESULTS")
		maxB, ok2 := value(fams, "mlsched_stream_max_bytes", "stream=MLSCHED_TASKS")
		_, ok3 := value(fams, "mlsched_stream_bytes", "stream=MLSCHED_DLQ")
		return ok1 && ok2 && ok3 && max == 1_000_000 && maxB == 128<<20
	})
	for _, f := range fams {
		for _, m := range f.Metric {
			for _, l := range m.Label {
				if strings.Contains(l.GetValue(), "ok-") {
					t.Errorf("%s has a task id in label %s=%q", f.GetName(), l.GetName(), l.GetValue())
				}
			}
		}
	}
	t.Run("promtool check metrics", func(t *testing.T) { promtoolCheckMetrics(t, body) })

	if code, body := httpGet(t, base+"/readyz"); code != 200 || !strings.Contains(body, "redis: ok") {
		t.Errorf("/readyz = %d %q", code, body)
	}
	if code, _ := httpGet(t, base+"/healthz"); code != 200 {
		t.Errorf("/healthz = %d", code)
	}
	if code, _ := httpGet(t, base+"/no-such-page"); code != 404 {
		t.Errorf("unknown path = %d, want 404", code)
	}

	rs.Stop()
	e.waitFor("readiness reporting degraded mode", func() bool {
		code, body := httpGet(t, base+"/readyz")
		return code == 503 && strings.Contains(body, "degraded: statistics store unreachable") &&
			strings.Contains(body, "redis: error:") && strings.Contains(body, "nats: ok")
	})
	fams, _ = scrape(t, base)
	if v, _ := value(fams, "mlsched_stats_degraded"); v != 1 {
		t.Errorf("mlsched_stats_degraded = %v in degraded mode", v)
	}
	rs.Restart(t)
	e.waitFor("readiness after Redis is back", func() bool {
		code, _ := httpGet(t, base+"/readyz")
		return code == 200
	})
}

// promtoolCheckMetrics runs `promtool check metrics` (Debian's prometheus
// package) on a scrape: naming conventions, help texts, units.
func promtoolCheckMetrics(t *testing.T, scrape string) {
	t.Helper()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not installed (Debian package prometheus; make test installs it when run as root)")
	}
	cmd := exec.CommandContext(context.Background(), promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(scrape)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Errorf("promtool check metrics: %v\n%s", err, out.String())
	}
}

// A bad MLSCHED_HTTP_ADDR is refused with an error naming it.
func TestBadHTTPAddr(t *testing.T) {
	t.Parallel()
	for _, addr := range []string{"9090", "localhost:http", "host:70000"} {
		c := dispatcher.DefaultConfig()
		c.HTTPAddr = addr
		if _, err := dispatcher.New(c); err == nil || !strings.Contains(err.Error(), "MLSCHED_HTTP_ADDR") {
			t.Errorf("HTTPAddr %q: %v, want an error naming MLSCHED_HTTP_ADDR", addr, err)
		}
	}
}

// waitTableKnows waits until the routing table the dispatcher decides on
// lists node: the registry has it, and a snapshot refresh begun after that
// has completed (the table is stored after its snapshot, so the refresh
// after it must have begun too).
func (e *env) waitTableKnows(node string) {
	e.t.Helper()
	var seen time.Time
	e.waitFor("the registry to know "+node, func() bool {
		for _, hb := range e.d.Report().Nodes {
			if hb.Node == node {
				seen = time.Now()
				return true
			}
		}
		return false
	})
	var next time.Time
	e.waitFor("a snapshot refresh after the node was known", func() bool {
		next = e.d.Report().SnapshotAt
		return next.After(seen)
	})
	e.waitFor("the refresh after it", func() bool { return e.d.Report().SnapshotAt.After(next) })
}

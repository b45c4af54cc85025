package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mlsched/mlsched/shared/natstest"
	"github.com/mlsched/mlsched/shared/protocol"
)

// respond answers stats requests with body, as a dispatcher replica would.
func respond(t *testing.T, srv *natstest.Server, body []byte) {
	t.Helper()
	sub, err := srv.NC.Subscribe(protocol.SubjectAdminStats, func(m *nats.Msg) { _ = m.Respond(body) })
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
}

var sampleReport = protocol.StatsReport{
	Dispatcher: "disp-a", Policies: map[string]string{"*": "reliability", "ocr": "latency"}, Store: "redis",
	Degraded: true, DegradedReason: "redis: connection refused", SnapshotAt: time.Now().Add(-2 * time.Second),
	Window: 5 * time.Minute, Buffered: 12, Dropped: 3,
	Models: []protocol.ModelReport{
		{Name: "tesseract", Dispatched: 900, Successes: 880, SuccessRate: 0.9777, P50Ms: 42, P95Ms: 1250, InFlight: 7, Breaker: "closed", TrafficShare: 0.75},
		{Name: "flaky", Dispatched: 300, SuccessRate: 0.4, P50Ms: 0.25, P95Ms: 120, Breaker: "open", TrafficShare: 0.25},
	},
	Nodes: []protocol.Heartbeat{{Node: "n1", Models: []protocol.ModelInfo{{Name: "tesseract", CostPerTask: 2, CostPerUnit: 0.5}}}, {Node: "n2", Unready: []protocol.UnreadyModel{
		{Name: "remote", Types: []string{"classify"}, Reason: "GET http://127.0.0.1:9000/healthz: connection refused"}}}},
	Counters: map[string]int64{"suppressed": 4, "late": 1, "panic": 0},
	Held:     5, HeldBy: []protocol.HeldCount{{Band: "high", Tenant: "fraud", Held: 1}, {Band: "normal", Tenant: "bulk", Held: 4}},
	EndedBy: []protocol.EndedCount{{Band: "low", Code: protocol.CodeShed, Tasks: 17}, {Band: "normal", Code: protocol.CodeExpired, Tasks: 3}},
	QueueTargets: []protocol.QueueTargetReport{
		{Model: "m10", Node: "n1", ServiceMs: 42, Samples: 880, TargetMs: 126, Mode: "auto"},
		{Model: "m500", Node: "n2", ServiceMs: 3, Samples: 4, TargetMs: 1000, Mode: "floor"}},
	Rollouts: []protocol.RolloutReport{{Family: "fraud", Model: "fraud@v8", State: "running", Step: 1, Steps: []float64{0.05, 0.25, 0.5, 1},
		Share: 0.25, New: protocol.RolloutCounts{Successes: 90, Failures: 2}, Incumbent: protocol.RolloutCounts{Successes: 300, Failures: 3},
		LLR: -0.4, Verdict: "continue"}},
	QuotaDegraded: "Redis does not answer",
	Budgets: []protocol.BudgetReport{{Scope: "tenant", Name: "acme", Limit: 100, Period: time.Hour, Action: "refuse", Spent: 85,
		Ends: time.Now().Add(90 * time.Second)}},
	Cost: &protocol.CostReport{ByType: map[string]float64{"ocr": 85}, ByModel: map[string]float64{"tesseract": 85},
		ByTenant: map[string]float64{"acme": 85}},
}

func TestStatsTable(t *testing.T) {
	t.Parallel()
	srv := natstest.New(t)
	body, _ := json.Marshal(sampleReport)
	respond(t, srv, body)
	code, out, errs := cli(t, srv.URL, "", "stats")
	if code != exitOK {
		t.Fatalf("code %d, stderr %q", code, errs)
	}
	for _, want := range []string{
		"dispatcher disp-a", "store=redis", "mode=DEGRADED (redis: connection refused)", "buffered=12", "dropped=3",
		"nodes=2", "policies=*:reliability,ocr:latency", "window=5m0s",
		"unready remote on n2: GET http://127.0.0.1:9000/healthz: connection refused",
		"MODEL", "BREAKER", "TIMEOUTS", "LATE", "tesseract", "97.8%", "since start: late=1 panic=0 suppressed=4", "42.0ms", "1.25s", "0.250ms", "75.0%", "open", "40.0%",
		"held by band/tenant: high/fraud=1 normal/bulk=4", "quotas DEGRADED: Redis does not answer",
		"flow control by band:", "QUOTA_EXCEEDED",
		"queue target by model and node (MLSCHED_QUEUE_TARGET):",
		"declared cost per attempt: tesseract=2+0.5/unit", "cost since start by type: ocr=85", "cost since start by tenant: acme=85",
		"budgets (every replica's spending, this period):", "tenant:acme  85     100    85%   1h0m0s",
		"rollout fraud -> fraud@v8: running, step 2/4, share 25.0%, new 90 ok/2 failed/0 timeouts, incumbent 300/3/0, llr -0.40 (continue)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	lines := strings.Split(out, "\n")
	var flaky, tess int
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), "flaky") {
			flaky = i
		}
		if strings.HasPrefix(strings.TrimSpace(l), "tesseract") {
			tess = i
		}
	}
	if flaky == 0 || flaky > tess {
		t.Errorf("models are not sorted by name:\n%s", out)
	}
	if !strings.Contains(lines[tess], "900") || !strings.Contains(lines[tess], "closed") || !strings.Contains(lines[tess], " 7 ") {
		t.Errorf("tesseract row %q", lines[tess])
	}

	bands := map[string][]string{}
	for _, l := range lines {
		if f := strings.Fields(l); len(f) == 6 && (f[0] == "high" || f[0] == "normal" || f[0] == "low") {
			bands[f[0]] = f[1:]
		}
	}
	// band: held, held by tenant, shed, expired, quota_exceeded
	if strings.Join(bands["high"], " ") != "1 fraud=1 0 0 0" || strings.Join(bands["normal"], " ") != "4 bulk=4 0 3 0" ||
		strings.Join(bands["low"], " ") != "0 - 17 0 0" {
		t.Errorf("flow control rows %v:\n%s", bands, out)
	}

	// per (model, node): service time, samples, target, mode
	targets := map[string]string{}
	for _, l := range lines {
		if f := strings.Fields(l); len(f) == 6 && (f[5] == "auto" || f[5] == "floor") {
			targets[f[0]+"/"+f[1]] = strings.Join(f[2:], " ")
		}
	}
	if targets["m10/n1"] != "42.0ms 880 126ms auto" || targets["m500/n2"] != "3.0ms 4 1.00s floor" {
		t.Errorf("queue target rows %v:\n%s", targets, out)
	}

	code, out, _ = cli(t, srv.URL, "", "stats", "-json")
	if code != exitOK || strings.TrimSpace(out) != string(body) {
		t.Errorf("-json: code %d, out %q", code, out)
	}
}

func TestStatsHealthyAndEmpty(t *testing.T) {
	t.Parallel()
	srv := natstest.New(t)
	body, _ := json.Marshal(protocol.StatsReport{Dispatcher: "solo", Store: "memory"})
	respond(t, srv, body)
	code, out, _ := cli(t, srv.URL, "", "stats")
	if code != exitOK || !strings.Contains(out, "mode=normal") || !strings.Contains(out, "snapshot never") || !strings.Contains(out, "no model statistics yet") {
		t.Fatalf("code %d, out:\n%s", code, out)
	}
}

func TestStatsNoDispatcherOrBadReply(t *testing.T) {
	t.Parallel()
	srv := natstest.New(t)
	code, _, errs := cli(t, srv.URL, "", "stats")
	if code != exitFailed || !strings.Contains(errs, "no dispatcher") {
		t.Fatalf("no responder: code %d, stderr %q", code, errs)
	}
	respond(t, srv, []byte("<html>oops</html>"))
	code, out, _ := cli(t, srv.URL, "", "stats")
	if code != exitOK || !strings.Contains(out, "malformed stats report") || !strings.Contains(out, "oops") {
		t.Fatalf("bad reply: code %d, out %q", code, out)
	}
}

func TestStatsAllReplicas(t *testing.T) {
	t.Parallel()
	srv := natstest.New(t)
	for _, name := range []string{"r1", "r2"} {
		body, _ := json.Marshal(protocol.StatsReport{Dispatcher: name})
		respond(t, srv, body)
	}
	code, out, errs := cli(t, srv.URL, "", "stats", "-all", "-gather", "300ms", "-json")
	if code != exitOK || strings.Count(out, "\n") != 2 || !strings.Contains(out, `"r1"`) || !strings.Contains(out, `"r2"`) {
		t.Fatalf("code %d, out %q, err %q", code, out, errs)
	}
}

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/mlsched/mlsched/e2e/harness"
	"github.com/mlsched/mlsched/shared/protocol"
)

// The operator CLI against a running cluster of two dispatcher replicas
// sharing Redis and one worker: submit and wait, list nodes, and collect
// every replica's statistics.
func TestCLI(t *testing.T) {
	t.Parallel()
	requireBinaries(t, "dispatcher", "worker", "mlsched")
	c := harness.New(t)
	c.StartNATS()
	c.StartRedis()
	c.StartDispatcher(harness.DispatcherOptions{})
	c.StartDispatcher(harness.DispatcherOptions{})
	c.StartWorker(harness.WorkerOptions{NodeID: "cli-node", ModelsFile: "testdata/node-1.yaml", SimSeed: 3})

	out, errOut, code := runCLI(t, c, "submit", "-type", "classify", "-id", "cli-1", "-payload", `{"x":1}`, "-wait", "-wait-timeout", "45s")
	if code != 0 {
		t.Fatalf("submit -wait exited %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	var res protocol.Result
	if err := json.Unmarshal([]byte(firstLine(out)), &res); err != nil {
		t.Fatalf("submit -wait: first line is not a result: %v\n%s", err, out)
	}
	if res.ID != "cli-1" || res.Status != protocol.StatusSucceeded || res.Node != "cli-node" {
		t.Fatalf("result %+v, want cli-1 succeeded on cli-node", res)
	}

	out, errOut, code = runCLI(t, c, "nodes", "-json")
	if code != 0 {
		t.Fatalf("nodes exited %d: %s", code, errOut)
	}
	var node struct {
		Key       string             `json:"key"`
		Heartbeat protocol.Heartbeat `json:"heartbeat"`
	}
	err := json.Unmarshal([]byte(firstLine(out)), &node)
	if err != nil || node.Key != "cli-node" || node.Heartbeat.Node != "cli-node" || len(node.Heartbeat.Models) != 2 ||
		strings.Count(strings.TrimSpace(out), "\n") != 0 {
		t.Fatalf("nodes -json = %q (%v), want one line for cli-node", out, err)
	}

	out, errOut, code = runCLI(t, c, "stats", "-json", "-all", "-gather", "2s")
	if code != 0 {
		t.Fatalf("stats exited %d: %s", code, errOut)
	}
	names := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var r protocol.StatsReport
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("stats -json line %q: %v", line, err)
		}
		if r.Store != "redis" {
			t.Errorf("%s uses store %q, want redis", r.Dispatcher, r.Store)
		}
		names[r.Dispatcher] = true
	}
	if !names["dispatcher-1"] || !names["dispatcher-2"] || len(names) != 2 {
		t.Fatalf("stats -all answered by %v, want dispatcher-1 and dispatcher-2", names)
	}

	// top merges every replica's view: both replicas, the models the
	// finished task was decided among, the node and its load, the backlog.
	out, errOut, code = runCLI(t, c, "top", "-n", "2", "-interval", "200ms")
	if code != 0 {
		t.Fatalf("top exited %d: %s", code, errOut)
	}
	for _, want := range []string{"2 dispatcher(s)", "1 node(s)", "MODEL", "m-fail00", "m-fail10", "cli-node", "backlog: nothing waiting", "results=1", "DISPATCHER", "dispatcher-1", "dispatcher-2"} {
		if !strings.Contains(out, want) {
			t.Errorf("top output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "\x1b[") || strings.Count(out, "mlsched top ") != 2 {
		t.Errorf("top to a pipe: want 2 plain frames, got:\n%q", out)
	}

	// cancel: a finished task and an unknown one are refused with their codes.
	if _, errOut, code = runCLI(t, c, "cancel", "cli-1"); code != 5 || !strings.Contains(errOut, "already finished") {
		t.Errorf("cancel of a finished task: exit %d, stderr %q", code, errOut)
	}
	if _, errOut, code = runCLI(t, c, "cancel", "no-such-task"); code != 4 || !strings.Contains(errOut, "no task no-such-task") {
		t.Errorf("cancel of an unknown task: exit %d, stderr %q", code, errOut)
	}
}

func runCLI(t *testing.T, c *harness.Cluster, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	start := time.Now()
	defer func() {
		t.Logf("mlsched %s: exit %d in %v", strings.Join(args, " "), code, time.Since(start).Round(time.Millisecond))
	}()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, harness.Binary(t, "mlsched"), args...)
	cmd.Env = append(os.Environ(), "MLSCHED_NATS_URL="+c.NATS.URL, "MLSCHED_LOG_LEVEL=warn")
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatalf("mlsched %v: %v", args, err)
	}
	return o.String(), e.String(), code
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

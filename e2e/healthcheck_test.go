package e2e

import (
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mlsched/mlsched/e2e/harness"
)

// `dispatcher healthcheck` and `worker healthcheck`, the container health
// checks, exit 0 against a ready process's listener and 1 (with the reason)
// against one that does not answer.
func TestHealthcheckCommand(t *testing.T) {
	requireBinaries(t, "dispatcher", "worker")
	t.Parallel()
	c := harness.New(t)
	c.StartNATS()
	d := c.StartDispatcher(harness.DispatcherOptions{})
	w := c.StartWorker(harness.WorkerOptions{NodeID: "node-1", ModelsFile: "testdata/node-1.yaml"})
	free, err := harness.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []struct {
		bin  string
		proc *harness.Process
	}{{"dispatcher", d.Process}, {"worker", w.Process}} {
		u, err := p.proc.HTTPURL()
		if err != nil {
			t.Fatal(err)
		}
		addr := strings.TrimPrefix(u, "http://")
		harness.Eventually(t, 20*time.Second, p.bin+" ready", func() error {
			cmd := exec.Command(harness.Binary(t, p.bin), "healthcheck")
			cmd.Env = []string{"MLSCHED_HTTP_ADDR=" + addr}
			out, err := cmd.CombinedOutput()
			if err != nil {
				return &exitErr{err, string(out)}
			}
			return nil
		})
		cmd := exec.Command(harness.Binary(t, p.bin), "healthcheck", "/healthz")
		cmd.Env = []string{"MLSCHED_HTTP_ADDR=127.0.0.1:" + strconv.Itoa(free)}
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "healthcheck") {
			t.Errorf("%s healthcheck against a closed port: %v %q, want exit 1 with the reason", p.bin, err, out)
		}
	}
}

type exitErr struct {
	err error
	out string
}

func (e *exitErr) Error() string { return e.err.Error() + ": " + e.out }

package executor

import (
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/worker/model"
)

// Close right after New, while the process may still be starting, must not
// leave the process running or hang.
func TestExecCloseWhileStarting(t *testing.T) {
	t.Parallel()
	spec := model.Spec{Name: "slow-start", Types: []string{"t"}, Executor: model.ExecutorExec,
		Exec: &model.ExecSpec{Command: []string{"sh", "-c", "cat >/dev/null"}}}
	for range 20 {
		ex, err := New(spec, Options{Log: zerolog.Nop()})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { ex.Close(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("Close hung")
		}
	}
}

package harness

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/mlsched/mlsched/shared/freeport"
)

// ReadyTimeout bounds every readiness wait. It is generous because the tests
// share a small machine and run with -race.
const ReadyTimeout = 60 * time.Second

// pollInterval is how often a condition is re-checked.
const pollInterval = 25 * time.Millisecond

// WaitFor calls cond until it returns nil or ctx ends; it then returns the
// last error of cond.
func WaitFor(ctx context.Context, cond func() error) error {
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		err := cond()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-tick.C:
		}
	}
}

// Eventually fails the test unless cond returns nil within timeout.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := WaitFor(ctx, cond); err != nil {
		t.Fatalf("%s: not within %v: %v", what, timeout, err)
	}
}

// FreePort returns a TCP port that stays this test process's until it exits
// (freeport.Take: below the kernel's ephemeral range, locked against the
// other test processes of the run).
func FreePort() (int, error) { return freeport.Take() }

// Package e2e holds mlsched's end-to-end tests: real nats-server,
// redis-server, dispatcher and worker processes driven through the producer
// SDK (see package harness).
package e2e

import (
	"os"
	"testing"

	"github.com/mlsched/mlsched/e2e/bench/relay"
	"github.com/mlsched/mlsched/e2e/harness"
)

func TestMain(m *testing.M) {
	// The benchmark test (bench_auth_test.go) starts this binary as its
	// relay process, as mlsched-bench starts itself.
	if len(os.Args) > 1 && os.Args[1] == "relay" {
		os.Exit(relay.Main(os.Args[2:]))
	}
	harness.Main(m)
}

// requireBinaries builds the given binaries before any process starts. It
// skips while their sources are not in the checkout yet (they are written in
// parallel with these tests); once they exist a build failure fails the test.
func requireBinaries(t *testing.T, names ...string) {
	t.Helper()
	for _, n := range names {
		if !harness.Available(n) {
			t.Skipf("%s is not in the checkout yet", n)
		}
	}
	for _, n := range names {
		harness.Binary(t, n)
	}
}

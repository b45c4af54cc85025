package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/mlsched/mlsched/e2e/harness"
)

func TestMain(m *testing.M) { harness.Main(m) } // removes a nats-server it built

// The probe against a real nats-server (sync_interval always): every stream
// count, and the group commit, gets a rate, every publish is acknowledged (a refused one fails the
// run), and the table has a row per stream count.
func TestProbeMeasuresEveryStreamCount(t *testing.T) {
	var out bytes.Buffer
	medians, err := run(&out, harness.Binary(t, "nats-server"), 200, 1, 300)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"1", "2", "4", "8", "1, group commit"} {
		if medians[k] <= 0 {
			t.Errorf("%s streams: %v msgs/s, want a positive rate", k, medians[k])
		}
		if !strings.Contains(out.String(), "\n| "+k+" | ") {
			t.Errorf("no table row for %s streams in:\n%s", k, out.String())
		}
	}
}

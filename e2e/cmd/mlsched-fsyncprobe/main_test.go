package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/mlsched/mlsched/e2e/harness"
)

func TestMain(m *testing.M) { harness.Main(m) } // removes a nats-server it built

// The probe against a real nats-server (sync_interval always): every stream
// count gets a rate, every publish is acknowledged (a refused one fails the
// run), and the table has a row per stream count.
func TestProbeMeasuresEveryStreamCount(t *testing.T) {
	var out bytes.Buffer
	medians, err := run(&out, harness.Binary(t, "nats-server"), 200, 1, 300)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []int{1, 2, 4, 8} {
		if medians[k] <= 0 {
			t.Errorf("%d streams: %v msgs/s, want a positive rate", k, medians[k])
		}
		if !strings.Contains(out.String(), "\n| "+string(rune('0'+k))+" | ") {
			t.Errorf("no table row for %d streams in:\n%s", k, out.String())
		}
	}
}

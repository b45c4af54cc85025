package e2e

import (
	"os"
	"testing"
	"time"

	"github.com/mlsched/mlsched/e2e/soak"
)

// TestSoakShort is `make soak` in about a minute: real nats-server,
// redis-server, dispatcher and two workers at a modest rate, with a results
// bound (MLSCHED_RESULTS_MAX_MSGS) the run passes three times over, so the
// stream is seen at its plateau. It fails only on a lost task, a duplicate
// result, or a stream holding more than its configured bound; the slopes
// and latencies are logged, never asserted (the machine is shared).
func TestSoakShort(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the soak runs a minute")
	}
	requireBinaries(t, "dispatcher", "worker", "nats-server")
	o := soak.Options{
		Rate: 250, Duration: 60 * time.Second, Warmup: 20 * time.Second, Drain: 60 * time.Second,
		DispatcherEnv: map[string]string{"MLSCHED_RESULTS_MAX_MSGS": "5000"},
		Dir:           t.TempDir(),
		Log:           t.Logf,
	}
	if v := os.Getenv("MLSCHED_SOAK_RATE"); v != "" {
		t.Logf("MLSCHED_SOAK_RATE is for make soak; the short soak runs at %d/s", o.Rate)
	}
	rep, err := soak.Run(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	for n, p := range rep.Procs {
		t.Logf("%-16s RSS start %.1f peak %.1f end %.1f MiB, slope after warm-up %.2f MiB/10m", n, p.StartMiB, p.PeakMiB, p.EndMiB, p.SlopeMiBPer10m)
	}
	for n, s := range rep.Streams {
		t.Logf("%-24s peak %d msgs / %d B (bounds %d / %d)", n, s.PeakMsgs, s.PeakBytes, s.MaxMsgs, s.MaxBytes)
	}
	for _, m := range rep.Minutes {
		t.Logf("minute %d: %d results, p50 %.1f ms, p99 %.1f ms", m.Minute, m.Results, m.P50ms, m.P99ms)
	}
	t.Logf("sent %d (%.0f/s), results %d, lost %d, duplicates %d", rep.Sent, rep.AchievedRate, rep.Results, rep.Lost, rep.Duplicates)
	if rs := rep.Streams["MLSCHED_RESULTS"]; rs.PeakMsgs < 5000 && rep.Sent > 6000 {
		t.Errorf("the results stream peaked at %d of its 5000 bound after %d tasks: was the bound applied?", rs.PeakMsgs, rep.Sent)
	}
	if err := rep.Check(); err != nil {
		t.Fatal(err)
	}
}

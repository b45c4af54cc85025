// Command mlsched-soak runs mlsched at a steady rate for a long time against
// real processes and reports whether every process and store stays on a
// plateau (package e2e/soak; `make soak`).
//
//	mlsched-soak -bin bin -rate 2000 -duration 30m -json .soak/soak.json
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/mlsched/mlsched/e2e/harness"
	"github.com/mlsched/mlsched/e2e/soak"
)

type kvFlag map[string]string

func (k kvFlag) String() string { return fmt.Sprint(map[string]string(k)) }
func (k kvFlag) Set(s string) error {
	key, v, ok := strings.Cut(s, "=")
	if !ok {
		return fmt.Errorf("%q is not KEY=VALUE", s)
	}
	k[key] = v
	return nil
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("mlsched-soak", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o soak.Options
	bin := fs.String("bin", "", "directory of prebuilt dispatcher, worker and nats-server binaries (empty: build them)")
	fs.IntVar(&o.Rate, "rate", 0, "tasks per second (0: calibrate: 60% of what this machine completes unpaced, rounded down to 50)")
	fs.DurationVar(&o.Duration, "duration", 30*time.Minute, "how long to offer the rate")
	fs.DurationVar(&o.Warmup, "warmup", 0, "excluded from the slopes (default a sixth of -duration)")
	fs.DurationVar(&o.Drain, "drain", time.Minute, "a task without result when none came for this long is lost")
	fs.IntVar(&o.Workers, "workers", 2, "worker processes")
	fs.IntVar(&o.ClusterNodes, "cluster-nodes", 0, "0: one nats-server; n: a cluster of n servers with R3 streams")
	fs.StringVar(&o.SyncInterval, "sync", "always", "nats-server jetstream sync_interval")
	fs.IntVar(&o.Payload, "payload", 64, "task payload bytes (echoed into the result)")
	jsonPath := fs.String("json", "", "write the full report (with the per-second samples) here")
	fs.StringVar(&o.Dir, "dir", "", "keep the processes' files and logs here (default: a temporary directory, removed)")
	fs.StringVar(&o.HeapProfile, "heap", "", "write nats-server's heap profile here at the end (one server)")
	resultsOnly := fs.String("results-only", "", "instead: store results alone on a bare nats-server in one design and report its RSS: old (24h, no bound), count (-results-max-msgs, 24h), shards (16 subjects, 24h)")
	resultsMax := fs.Int64("results-max-msgs", 100000, "the count design's bound")
	denv, wenv := kvFlag{}, kvFlag{}
	fs.Var(denv, "dispatcher-env", "KEY=VALUE for the dispatcher (repeatable), e.g. MLSCHED_RESULTS_MAX_MSGS=2000000")
	fs.Var(wenv, "worker-env", "KEY=VALUE for the workers (repeatable)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	o.DispatcherEnv, o.WorkerEnv = denv, wenv
	if *bin != "" {
		abs, err := filepath.Abs(*bin)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 2
		}
		os.Setenv(harness.EnvBin, abs)
	}
	o.Log = func(format string, a ...any) {
		fmt.Fprintf(stderr, time.Now().UTC().Format("15:04:05 ")+format+"\n", a...)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *resultsOnly != "" {
		return runResults(ctx, *resultsOnly, *resultsMax, o, *jsonPath, stdout, stderr)
	}
	rep, err := soak.Run(ctx, o)
	if err != nil {
		fmt.Fprintln(stderr, "soak:", err)
		return 1
	}
	Print(stdout, rep)
	if *jsonPath != "" {
		if err := os.MkdirAll(filepath.Dir(*jsonPath), 0o755); err == nil {
			data, _ := json.MarshalIndent(rep, "", " ")
			if err := os.WriteFile(*jsonPath, data, 0o644); err != nil {
				fmt.Fprintln(stderr, err)
			}
		}
	}
	if err := rep.Check(); err != nil {
		fmt.Fprintln(stdout, "FAIL:", err)
		return 1
	}
	fmt.Fprintln(stdout, "PASS: 0 lost, 0 duplicates, every stream within its bounds")
	return 0
}

// Print writes the report's tables.
func Print(w io.Writer, r *soak.Report) {
	o := r.Options
	fmt.Fprintf(w, "soak: %d tasks/s offered for %v (achieved %.0f/s), %d workers, cluster nodes %d, sync_interval %s\n",
		o.Rate, o.Duration, r.AchievedRate, o.Workers, o.ClusterNodes, o.SyncInterval)
	if r.Calibrated > 0 {
		fmt.Fprintf(w, "calibrated: %.0f tasks/s completed unpaced\n", r.Calibrated)
	}
	fmt.Fprintf(w, "sent %d, results %d (succeeded %d, failed %d), lost %d, duplicates %d, publish retries %d; last result %v after the last submission\n",
		r.Sent, r.Results, r.Succeeded, r.Failed, r.Lost, r.Duplicates, r.PublishErrors, r.DrainTime.Round(time.Millisecond))
	fmt.Fprintf(w, "\n%-22s %9s %9s %9s %9s %14s %14s\n", "process RSS (MiB)", "start", "warm", "peak", "end", "slope/10m", "last half/10m")
	for _, n := range sortedKeys(r.Procs) {
		p := r.Procs[n]
		fmt.Fprintf(w, "%-22s %9.1f %9.1f %9.1f %9.1f %14.2f %14.2f\n", n, p.StartMiB, p.WarmMiB, p.PeakMiB, p.EndMiB, p.SlopeMiBPer10m, p.SlopeLastHalf10m)
	}
	fmt.Fprintf(w, "\n%-26s %10s %10s %10s %12s %12s %12s %5s\n", "stream", "peak msgs", "max msgs", "end msgs", "peak MiB", "max MiB", "end MiB", "over")
	for _, n := range sortedKeys(r.Streams) {
		s := r.Streams[n]
		fmt.Fprintf(w, "%-26s %10d %10s %10d %12.1f %12s %12.1f %5v\n", n, s.PeakMsgs, bound(s.MaxMsgs, 1), s.EndMsgs,
			float64(s.PeakBytes)/(1<<20), bound(s.MaxBytes, 1<<20), float64(s.EndBytes)/(1<<20), s.Over)
	}
	fmt.Fprintf(w, "\n%-7s %9s %9s %9s %9s %9s\n", "minute", "results", "p50 ms", "p90 ms", "p99 ms", "max ms")
	for _, m := range r.Minutes {
		fmt.Fprintf(w, "%-7d %9d %9.1f %9.1f %9.1f %9.1f\n", m.Minute, m.Results, m.P50ms, m.P90ms, m.P99ms, m.MaxMs)
	}
	fmt.Fprintln(w, "\nload:")
	for _, l := range r.Load {
		fmt.Fprintln(w, "  "+l)
	}
}

func bound(v int64, unit float64) string {
	if v <= 0 {
		return "-"
	}
	if unit == 1 {
		return fmt.Sprint(v)
	}
	return fmt.Sprintf("%.1f", float64(v)/unit)
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

func runResults(ctx context.Context, name string, maxMsgs int64, o soak.Options, jsonPath string, stdout, stderr io.Writer) int {
	d := soak.ResultsDesign{Name: name, MaxAge: 24 * time.Hour}
	switch name {
	case "old":
	case "count":
		d.MaxMsgs = maxMsgs
	case "shards":
		d.Shards = 16
	default:
		fmt.Fprintf(stderr, "-results-only %q: want old, count or shards\n", name)
		return 2
	}
	if o.Rate <= 0 {
		o.Rate = 1000
	}
	rep, err := soak.RunResults(ctx, d, o.Rate, o.Duration, o.HeapProfile, o.Log)
	if err != nil {
		fmt.Fprintln(stderr, "soak:", err)
		return 1
	}
	fmt.Fprintf(stdout, "results-only %s (max_msgs %d, shards %d): %d/s for %v, %d stored; stream end %d msgs, %.1f MiB\n",
		name, d.MaxMsgs, d.Shards, rep.Rate, rep.Duration, rep.Sent, rep.EndMsgs, float64(rep.EndBytes)/(1<<20))
	fmt.Fprintf(stdout, "nats-server RSS MiB: start %.1f, peak %.1f, end %.1f, slope over the last half %.2f MiB/10m\n",
		rep.StartMiB, rep.PeakMiB, rep.EndMiB, rep.SlopeLastHalf10m)
	for _, s := range rep.Samples {
		if int(s[0])%30 == 0 {
			fmt.Fprintf(stdout, "  t=%4.0fs rss=%6.1f MiB msgs=%8.0f\n", s[0], s[1]/(1<<20), s[2])
		}
	}
	if jsonPath != "" {
		data, _ := json.MarshalIndent(rep, "", " ")
		_ = os.WriteFile(jsonPath, data, 0o644)
	}
	return 0
}

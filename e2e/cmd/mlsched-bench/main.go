// Command mlsched-bench measures mlsched end to end against a pass-through
// relay on the same JetStream streams, in one run (`make bench`). It starts
// its own nats-server (file storage, sync_interval always) and
// redis-server on free loopback ports, prints a table and writes JSON.
//
//	mlsched-bench [flags]       run the benchmark (see -h)
//	mlsched-bench relay ...     the relay process it starts (internal)
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/mlsched/mlsched/e2e/bench"
	"github.com/mlsched/mlsched/e2e/bench/relay"
	"github.com/mlsched/mlsched/e2e/harness"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "relay" {
		os.Exit(relay.Main(os.Args[2:]))
	}
	os.Exit(benchMain(os.Args[1:]))
}

func benchMain(args []string) int {
	fs := flag.NewFlagSet("mlsched-bench", flag.ContinueOnError)
	var o bench.Options
	fs.IntVar(&o.Tasks, "tasks", 20000, "tasks in the throughput phase")
	fs.IntVar(&o.LatencyTasks, "latency-tasks", 10000, "tasks in the fixed-rate latency phase (0: as -tasks)")
	fs.IntVar(&o.Warmup, "warmup", 1000, "unmeasured warm-up tasks (-1: none)")
	fs.IntVar(&o.Payload, "payload", 256, "payload bytes per task")
	fs.IntVar(&o.Nodes, "nodes", 4, "worker nodes (relay: sinks)")
	fs.IntVar(&o.Models, "models", 4, "no-op models per node")
	fs.StringVar(&o.Policy, "policy", "reliability", "dispatcher policy")
	fs.IntVar(&o.Rate, "rate", 2000, "offered load of the latency phase, tasks/s (the issue-13 latency targets are at 2000/s in fast mode)")
	fs.IntVar(&o.Concurrency, "concurrency", 64, "worker concurrency and sink MaxAckPending")
	fs.StringVar(&o.SyncInterval, "nats-sync", "", "run one mode with this nats-server jetstream sync_interval instead of -modes (always = production, 2m = the server's default)")
	modes := fs.String("modes", "durable,fast", "modes to run, each relay vs mlsched: durable (sync_interval always) and fast (the server's default, 2m)")
	clusterNodes := fs.Int("cluster-nodes", 3, "also run every mode on a cluster of this many nats-server processes with streams of as many replicas (0: one server only)")
	fs.BoolVar(&o.Trace, "trace", false, "time every hop with core-NATS observers of the dispatch, outcome and result subjects (adds server load)")
	dispEnv := fs.String("dispatcher-env", "", "extra dispatcher variables, KEY=VALUE,... (e.g. MLSCHED_MAX_IN_FLIGHT=4096)")
	workerEnv := fs.String("worker-env", "", "extra worker variables, KEY=VALUE,... (e.g. MLSCHED_LOG_LEVEL=warn)")
	scenarios := fs.String("scenarios", "relay,mlsched", "scenarios to run, in order: relay, mlsched, mlsched-observed (mlsched while dashboards and scrapers watch), digits and digits-batch (the scikit-learn digits model over OIP v2 without and with batching), relay-auth, mlsched-auth (with authorization), river (River on Postgres 15, fsync on, one server only), asynq (asynq on redis-server without persistence, one server only)")
	auth := fs.Bool("auth", false, "also run relay and mlsched with authorization (nats-server including the auth.conf of `mlsched auth init`, every process on its role's nkey), each right after its open run, and report the cost as ratios")
	fs.IntVar(&o.Observers, "observers", 8, "mlsched-observed: dashboard event streams held open (half never read) and /metrics scrapers")
	fs.DurationVar(&o.ScrapeInterval, "scrape-interval", time.Second, "mlsched-observed: each scraper's period")
	jsonPath := fs.String("json", ".bench/bench-results.json", "JSON report path (empty: none)")
	rounds := fs.Int("rounds", 1, "run each mode and topology this many times (relay then mlsched each time) and add the median of every figure and ratio to the summary")
	profile := fs.Bool("profile", false, "profile the dispatcher's and one worker's CPU over the mlsched measured phases (back-to-back 20s windows, merged; the worker's next to -profile-out, .worker before the extension), and in every scenario the bench driver's and, on one server, nats-server's (.<scenario>.driver and .<scenario>.nats)")
	fs.StringVar(&o.ProfilePath, "profile-out", ".bench/dispatcher.cpu.pprof", "where -profile saves the profile")
	fs.IntVar(&o.ProfileSeconds, "profile-seconds", 20, "length of one -profile window")
	fs.StringVar(&o.TraceFile, "trace-file", "", "replay this request log's arrivals against mlsched instead of the throughput and latency phases (a CSV such as ../shared/traces/azure-llm-2023-code.csv); prints p50/p99 of the whole trace and of its busiest and quietest minutes")
	fs.Float64Var(&o.TraceSpeed, "trace-speed", 20, "-trace-file: replay this many times faster than recorded")
	fs.StringVar(&o.TraceTimeColumn, "trace-time-column", "TIMESTAMP", "-trace-file: the arrival time column (2006-01-02 15:04:05.9999999, or seconds)")
	fs.StringVar(&o.TraceSizeColumn, "trace-size-column", "ContextTokens", "-trace-file: the column each task's size comes from (empty: none)")
	fs.IntVar(&o.TraceTasks, "trace-tasks", 0, "-trace-file: replay only the first so many rows (0: all)")
	fs.IntVar(&o.Dispatchers, "dispatchers", 1, "dispatcher replicas mlsched runs")
	deadlines := fs.String("deadlines", "", "give every task a deadline_ms drawn uniformly in LO,HI (e.g. 20,2000; empty: the default deadline); each failed task is then explained (where its time went, why it was late: the JSON's late, the summary's deadline table)")
	bin := fs.String("bin", "", "directory of prebuilt dispatcher, worker and nats-server binaries (empty: build them)")
	dir := fs.String("dir", "", "keep the servers' stores and process logs here (empty: a temporary directory, removed)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if !*profile {
		o.ProfilePath = ""
	}
	if *deadlines != "" {
		lo, hi, ok := strings.Cut(*deadlines, ",")
		a, err1 := strconv.Atoi(lo)
		b, err2 := strconv.Atoi(hi)
		if !ok || err1 != nil || err2 != nil || a < 1 || b < a {
			fmt.Fprintf(os.Stderr, "mlsched-bench: -deadlines %q: want LO,HI milliseconds, 1 <= LO <= HI\n", *deadlines)
			return 2
		}
		o.Deadlines = [2]int{a, b}
	}
	o.Scenarios = strings.Split(*scenarios, ",")
	if *auth {
		o.Scenarios = withAuth(o.Scenarios)
	}
	var err error
	if o.DispatcherEnv, err = parseEnv(*dispEnv); err != nil {
		fmt.Fprintln(os.Stderr, "mlsched-bench: -dispatcher-env:", err)
		return 2
	}
	if o.WorkerEnv, err = parseEnv(*workerEnv); err != nil {
		fmt.Fprintln(os.Stderr, "mlsched-bench: -worker-env:", err)
		return 2
	}
	o.Dir = *dir
	o.Progress = os.Stderr
	if *bin != "" {
		abs, err := filepath.Abs(*bin)
		if err != nil {
			fmt.Fprintln(os.Stderr, "mlsched-bench:", err)
			return 2
		}
		os.Setenv(harness.EnvBin, abs)
	}
	defer harness.RemoveBuilds()
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "mlsched-bench:", err)
		return 1
	}
	o.RelayCommand = []string{self, "relay"}
	for _, p := range []string{*jsonPath, o.ProfilePath} {
		if p != "" {
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				fmt.Fprintln(os.Stderr, "mlsched-bench:", err)
				return 1
			}
		}
	}

	var ms []bench.Mode
	if o.SyncInterval != "" {
		ms = []bench.Mode{bench.ModeOf(o.SyncInterval)}
	} else {
		for _, m := range strings.Split(*modes, ",") {
			switch strings.TrimSpace(m) {
			case bench.ModeDurable.Name:
				ms = append(ms, bench.ModeDurable)
			case bench.ModeFast.Name:
				ms = append(ms, bench.ModeFast)
			default:
				fmt.Fprintf(os.Stderr, "mlsched-bench: -modes: unknown mode %q (want durable or fast)\n", m)
				return 2
			}
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	suite, runErr := bench.RunSuite(ctx, o, ms, *clusterNodes, *rounds)
	suite.Command = "mlsched-bench " + strings.Join(args, " ")
	for _, rep := range suite.Reports {
		rep.Command = suite.Command
		fmt.Printf("\n==================== mode %s ====================\n", bench.ModeOf(rep.Options.SyncInterval).Name)
		if err := rep.WriteTable(os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "mlsched-bench:", err)
			return 1
		}
	}
	if err := suite.WriteSummary(os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "mlsched-bench:", err)
		return 1
	}
	if *jsonPath != "" {
		if err := suite.WriteJSON(*jsonPath); err != nil {
			fmt.Fprintln(os.Stderr, "mlsched-bench:", err)
			return 1
		}
		fmt.Fprintf(os.Stderr, "wrote %s\n", *jsonPath)
	}
	if runErr != nil {
		fmt.Fprintln(os.Stderr, "mlsched-bench:", runErr)
		return 1
	}
	return 0
}

// withAuth adds, right after relay and mlsched, their authorization
// counterparts (unless listed already), so each pair runs back to back.
func withAuth(scenarios []string) []string {
	var out []string
	for _, s := range scenarios {
		out = append(out, s)
		var a string
		switch s {
		case bench.ScenarioRelay:
			a = bench.ScenarioRelayAuth
		case bench.ScenarioMlsched:
			a = bench.ScenarioMlschedAuth
		}
		if a != "" && !slices.Contains(scenarios, a) {
			out = append(out, a)
		}
	}
	return out
}

// parseEnv parses KEY=VALUE,KEY=VALUE.
func parseEnv(s string) (map[string]string, error) {
	if s == "" {
		return nil, nil
	}
	m := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%q is not KEY=VALUE", kv)
		}
		m[k] = v
	}
	return m, nil
}

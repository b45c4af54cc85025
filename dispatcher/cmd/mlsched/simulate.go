package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/mlsched/mlsched/dispatcher/internal/policy"
	"github.com/mlsched/mlsched/dispatcher/internal/simulate"
)

// runSimulate runs `mlsched simulate`: a scenario replayed on a simulated
// clock against the real policy engine, one run per policy, with the
// oracle as the yardstick.
func runSimulate(args []string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return simulateTo(ctx, args, os.Stdout, os.Stderr)
}

// simulateTo is runSimulate with its streams, for tests.
func simulateTo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("mlsched simulate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	scenario := fs.String("scenario", "stationary", "built-in scenario name ("+strings.Join(simulate.Builtin(), ", ")+") or a scenario JSON file")
	pol := fs.String("policy", "all", "policy to run: "+strings.Join(simulate.Policies(), ", ")+", "+strings.Join(simulate.CostPolicies(), ", ")+", a comma-separated list, or all (the oracle always runs; all adds "+strings.Join(simulate.CostPolicies(), " and ")+" when a model declares a cost)")
	tasks := fs.Int("tasks", 0, "number of tasks (default: the scenario's)")
	seed := fs.Uint64("seed", 1, "seed of every random stream; the same seed gives the same output")
	runs := fs.Int("runs", 1, "average over this many seeds (seed, seed+1, ...); recovery is their median")
	format := fs.String("format", "table", "output format: table, csv or json")
	svg := fs.String("svg", "", "also write an SVG plot of the rolling first-attempt success rate to this file")
	list := fs.Bool("list", false, "list the built-in scenarios and exit")
	show := fs.Bool("show", false, "print the scenario's JSON (a built-in one is a format example) and exit")
	minSamples := fs.Int("min-samples", 0, "policy MinSamples: outcomes below which a model is explored (default: the policy default, 20)")
	explore := fs.Float64("explore-share", 0, "policy ExploreShare: share of decisions given to under-sampled models (default: the policy default, 0.05)")
	latWeight := fs.Float64("latency-weight", 0, "policy LatencyWeight of thompson (default 0)")
	minSuccess := fs.Float64("min-success", 0, "cost policy: the success bar of every type, in (0, 1) (default: the scenario's min_success, else 0.99)")
	ownBlocks := fs.Bool("own-deadline-blocks", false, "flow control: a held task saturated only by its own deadline holds back its type for the rest of the hold's pass (the dispatcher's rule before issue 20's fix, to measure it; default: as the dispatcher does now)")
	byFinish := fs.Bool("fair-by-finish-tag", false, "flow control: inside a priority the hold serves the smallest finish tag first (the dispatcher's order before issue 20's fix, to measure it; default: the smallest start tag, as the dispatcher does now)")
	window := fs.Duration("window", 0, "statistics window (default: the scenario's); -window 5m -bucket 10s is the dispatcher's default")
	bucket := fs.Duration("bucket", 0, "bucket of the statistics window set by -window (default: a tenth of it)")
	pipes := fs.Float64("pipelines", 0, "make this share of the tasks, in (0, 1], pipelines of 2-3 steps of different types (the scenario needs 3 task types; default: the scenario's pipelines, if any)")
	logTo := fs.String("log", "", "also write the request log (one CSV row per attempt, the columns -fit reads) of the first policy's run at -seed to this file")
	ff := addFitFlags(fs)
	fs.Usage = func() {
		fmt.Fprint(stderr, `usage: mlsched simulate [-scenario NAME|FILE] [-policy NAME|all] [-tasks N] [-seed S] [-runs N] [-pipelines SHARE]
                        [-format table|csv|json] [-svg FILE] [-log FILE] [-list] [-show]
       mlsched simulate -fit LOG.csv [-o SCENARIO.json] [-col-time NAME ...] [-nodes N] [-slots S]

Replays a scenario on a simulated clock against the real policy engine and
in-memory statistics store, once per policy, and compares each with an oracle
that knows the true failure probabilities. With -fit, writes a scenario (and
its arrivals' trace beside it) fitted to a request log instead. See
docs/simulator.md.

Flags:
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "mlsched simulate: unexpected argument %q\n", fs.Arg(0))
		return errUsage
	}
	if ff.log != "" {
		return runFit(fs, ff, stdout, stderr)
	}
	bad := func(format string, a ...any) error {
		fmt.Fprintf(stderr, "mlsched simulate: "+format+"\n", a...)
		return errUsage
	}
	if *list {
		for _, name := range simulate.Builtin() {
			sc, err := simulate.Load(name)
			if err != nil {
				return err
			}
			fmt.Fprintf(stdout, "%-17s %s\n", name, sc.Description)
		}
		return nil
	}
	if *show {
		if b, err := simulate.BuiltinJSON(*scenario); err == nil {
			_, err = stdout.Write(b)
			return err
		}
		b, err := os.ReadFile(*scenario)
		if err != nil {
			return bad("%v", err)
		}
		_, err = stdout.Write(b)
		return err
	}
	if !slices.Contains([]string{simulate.FormatTable, simulate.FormatCSV, simulate.FormatJSON}, *format) {
		return bad("unknown -format %q (want table, csv or json)", *format)
	}
	if *tasks < 0 {
		return bad("-tasks %d is negative", *tasks)
	}
	if *runs < 1 || *runs > 1000 {
		return bad("-runs %d is outside 1..1000", *runs)
	}
	if *window < 0 || (*window > 0 && *window < 10*time.Millisecond) {
		return bad("-window %v: want at least 10ms", *window)
	}
	if *bucket != 0 && (*window == 0 || *bucket < time.Millisecond || *bucket > *window) {
		return bad("-bucket %v: want it with -window, between 1ms and the window", *bucket)
	}
	var policies []string
	if *pol != "all" {
		for _, p := range strings.Split(*pol, ",") {
			p = strings.TrimSpace(p)
			if known := append(simulate.Policies(), simulate.CostPolicies()...); !slices.Contains(known, p) {
				return bad("unknown policy %q (want %s or all)", p, strings.Join(known, ", "))
			}
			policies = append(policies, p)
		}
	}
	sc, err := simulate.Load(*scenario)
	switch {
	case errors.Is(err, simulate.ErrUnknownScenario), errors.Is(err, simulate.ErrInvalidScenario):
		return bad("%v", err)
	case err != nil:
		return err
	}
	if *pipes != 0 {
		if err := sc.SetPipelines(*pipes); err != nil {
			return bad("-pipelines %g: %v", *pipes, err)
		}
	}
	if *window > 0 {
		b := *bucket
		if b == 0 {
			b = *window / 10
		}
		sc.Window = simulate.WindowSpec{Size: simulate.Duration(*window), Bucket: simulate.Duration(b)}
	}
	opt := simulate.Options{Tasks: *tasks, Seed: *seed, Runs: *runs, Policies: policies, OwnDeadlineBlocks: *ownBlocks, FairByFinishTag: *byFinish,
		Engine: policy.Config{MinSamples: *minSamples, ExploreShare: *explore, LatencyWeight: *latWeight}}
	if *minSuccess != 0 {
		opt.Engine.MinSuccess = map[string]float64{"*": *minSuccess}
	}
	if _, err := policy.NewEngine(opt.Engine); err != nil {
		return bad("%v", err)
	}
	if *logTo != "" {
		if err := writeRunLog(ctx, sc, opt, *logTo, stderr); err != nil {
			return err
		}
	}
	start := time.Now()
	rep, err := simulate.Run(ctx, sc, opt)
	switch {
	case errors.Is(err, simulate.ErrInvalidOptions):
		return bad("%v", err)
	case err != nil:
		return err
	}
	if err := rep.Write(stdout, *format); err != nil {
		return err
	}
	if *svg != "" {
		if err := writeSVG(rep, *svg); err != nil {
			return err
		}
	}
	fmt.Fprintf(stderr, "simulated %d tasks x %d policies x %d runs in %v\n", rep.Tasks, len(rep.Results), rep.Runs, time.Since(start).Round(time.Millisecond))
	return nil
}

func writeSVG(rep *simulate.Report, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("svg: %w", err)
	}
	if err := rep.WriteSVG(f); err != nil {
		f.Close()
		return fmt.Errorf("svg: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("svg: %w", err)
	}
	return nil
}

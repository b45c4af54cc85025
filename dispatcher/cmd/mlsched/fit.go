package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/mlsched/mlsched/dispatcher/internal/policy"
	"github.com/mlsched/mlsched/dispatcher/internal/simulate"
)

// fitFlags are `mlsched simulate -fit`'s: a request log in, a scenario
// out, so an operator can ask what each policy would have done with last
// week's requests.
type fitFlags struct {
	log, out                  string
	cols                      simulate.FitColumns
	latencyUnit               time.Duration
	nodes, slots              int
	timeout                   time.Duration
	timeScale, rateMultiplier float64
}

func addFitFlags(fs *flag.FlagSet) *fitFlags {
	f := &fitFlags{}
	d := simulate.DefaultFitColumns
	fs.StringVar(&f.log, "fit", "", "fit a scenario to this request log (CSV, one row per request) and write it (see -o) instead of simulating")
	fs.StringVar(&f.out, "o", "", "with -fit: the scenario file to write (default: the log's name with .scenario.json); its arrivals' trace is written beside it as NAME.trace.csv")
	for _, c := range []struct {
		p         *string
		name, def string
	}{{&f.cols.Time, "time", d.Time}, {&f.cols.Type, "type", d.Type}, {&f.cols.Tenant, "tenant", d.Tenant}, {&f.cols.Model, "model", d.Model},
		{&f.cols.Node, "node", d.Node}, {&f.cols.Attempt, "attempt", d.Attempt}, {&f.cols.Status, "status", d.Status},
		{&f.cols.Latency, "latency", d.Latency}, {&f.cols.Size, "size", d.Size}} {
		fs.StringVar(c.p, "col-"+c.name, c.def, "with -fit: the log's "+c.name+" column (absent from the log: none; \"\": ignore it)")
	}
	fs.DurationVar(&f.latencyUnit, "latency-unit", time.Millisecond, "with -fit: the unit of the latency column (1ms, 1s, 1us)")
	fs.IntVar(&f.nodes, "nodes", 0, "with -fit: this many nodes, each hosting every model (default: the log's node column's nodes, or else 4)")
	fs.IntVar(&f.slots, "slots", 16, "with -fit: each node's capacity (attempts at once)")
	fs.DurationVar(&f.timeout, "timeout", 0, "with -fit: the attempt timeout (default: the median latency of the log's timeouts, or else 5s, at least twice the slowest success)")
	fs.Float64Var(&f.timeScale, "time-scale", 1, "with -fit: multiply the log's times by this (0.1: replay it 10x faster)")
	fs.Float64Var(&f.rateMultiplier, "rate-multiplier", 1, "with -fit: scale the number of arrivals (2: each request twice)")
	return f
}

// runFit fits the log and writes the scenario and its trace.
func runFit(fs *flag.FlagSet, f *fitFlags, stdout, stderr io.Writer) error {
	bad := func(format string, a ...any) error {
		fmt.Fprintf(stderr, "mlsched simulate -fit: "+format+"\n", a...)
		return errUsage
	}
	var explicit []string
	names := map[string]string{"col-time": "Time", "col-type": "Type", "col-tenant": "Tenant", "col-model": "Model", "col-node": "Node",
		"col-attempt": "Attempt", "col-status": "Status", "col-latency": "Latency", "col-size": "Size"}
	fs.Visit(func(fl *flag.Flag) {
		if n, ok := names[fl.Name]; ok && fl.Value.String() != "" {
			explicit = append(explicit, n)
		}
	})
	if f.latencyUnit <= 0 {
		return bad("-latency-unit %v: want a positive unit such as 1ms", f.latencyUnit)
	}
	if f.nodes < 0 || f.slots < 1 {
		return bad("-nodes %d -slots %d: want nodes >= 0 and slots >= 1", f.nodes, f.slots)
	}
	if f.timeout < 0 {
		return bad("-timeout %v is negative", f.timeout)
	}
	out := f.out
	if out == "" {
		out = strings.TrimSuffix(f.log, filepath.Ext(f.log)) + ".scenario.json"
	}
	name := strings.TrimSuffix(strings.TrimSuffix(filepath.Base(out), ".json"), ".scenario")
	in, err := os.Open(f.log)
	if err != nil {
		return bad("%v", err)
	}
	defer in.Close()
	res, err := simulate.Fit(in, simulate.FitOptions{Columns: f.cols, Explicit: explicit, LatencyUnit: f.latencyUnit, Name: name,
		Nodes: f.nodes, Slots: f.slots, Timeout: f.timeout, TimeScale: f.timeScale, RateMultiplier: f.rateMultiplier})
	if errors.Is(err, simulate.ErrFit) {
		return bad("%s: %v", f.log, err)
	}
	if err != nil {
		return err
	}
	if res.Trace != nil {
		if err := os.WriteFile(filepath.Join(filepath.Dir(out), res.TraceFile), res.Trace, 0o644); err != nil {
			return fmt.Errorf("write the trace: %w", err)
		}
	}
	if err := os.WriteFile(out, res.Scenario, 0o644); err != nil {
		return fmt.Errorf("write the scenario: %w", err)
	}
	if err := res.WriteFitTable(stdout); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s", out)
	if res.Trace != nil {
		fmt.Fprintf(stdout, " and %s", filepath.Join(filepath.Dir(out), res.TraceFile))
	}
	fmt.Fprintf(stdout, "; run it with: mlsched simulate -scenario %s\n", out)
	return nil
}

// writeRunLog writes the request log of the first policy's run.
func writeRunLog(ctx context.Context, sc *simulate.Scenario, opt simulate.Options, path string, stderr io.Writer) error {
	pol := policy.Reliability
	if len(opt.Policies) > 0 {
		pol = opt.Policies[0]
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("log: %w", err)
	}
	n, err := simulate.WriteLog(ctx, sc, opt, pol, f)
	if cerr := f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("log: %w", cerr)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "wrote %d attempts of policy %s, seed %d, to %s\n", n, pol, opt.Seed, path)
	return nil
}

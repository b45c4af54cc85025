package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/mlsched/mlsched/dispatcher/rollout"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

const rolloutUsage = `rollout start FAMILY@VERSION [-steps 1,5,25,50,100] [-min-tasks 300] [-max-drop 1pp] [-split 90/10] [-f FILE]
       rollout status|history [FAMILY]
       rollout pause|resume|promote|abort FAMILY`

// runRollout declares and steers model rollouts (docs/rollouts.md): their
// records live in the MLSCHED_ROLLOUTS bucket, which every dispatcher
// replica watches and obeys.
func runRollout(ctx context.Context, a *app, args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprintln(a.stderr, "usage: mlsched "+rolloutUsage)
		if len(args) == 0 {
			return errUsage
		}
		return flag.ErrHelp
	}
	sub, rest := args[0], args[1:]
	// the family (or model) may come before the flags, as in the manual
	var target string
	if len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
		target, rest = rest[0], rest[1:]
	}
	switch sub {
	case "start":
		return rolloutStart(ctx, a, target, rest)
	case "status", "history":
		fs := a.newFlags("rollout "+sub, "rollout "+sub+" [FAMILY] [-json]")
		raw := fs.Bool("json", false, "print the stored records as JSON lines")
		if err := a.parseAndConnect(fs, rest); err != nil {
			return err
		}
		if target == "" {
			target = fs.Arg(0)
		}
		return rolloutShow(ctx, a, sub, protocol.ModelFamily(target), *raw)
	case string(rollout.Pause), string(rollout.Resume), string(rollout.Promote), string(rollout.Abort):
		fs := a.newFlags("rollout "+sub, "rollout "+sub+" FAMILY")
		if err := a.parseAndConnect(fs, rest); err != nil {
			return err
		}
		if target == "" {
			target = fs.Arg(0)
		}
		if target == "" {
			fmt.Fprintf(a.stderr, "mlsched rollout %s: name the family (or family@version)\n", sub)
			return errUsage
		}
		store, err := a.rolloutStore(ctx)
		if err != nil {
			return err
		}
		cx, cancel := a.reqCtx(ctx)
		defer cancel()
		r, err := store.Update(cx, protocol.ModelFamily(target), func(r *rollout.Rollout) (*rollout.Rollout, error) {
			if r == nil {
				return nil, fmt.Errorf("%w for family %q", rollout.ErrNotFound, protocol.ModelFamily(target))
			}
			if v := protocol.ModelVersion(target); v != "" && r.Model != target {
				return nil, fmt.Errorf("the rollout of %s is of %s, not %s", r.Family(), r.Model, target)
			}
			return r, r.Apply(rollout.Command(sub), time.Now())
		})
		if err != nil {
			return err
		}
		printRollout(a, r)
		return nil
	}
	fmt.Fprintf(a.stderr, "mlsched rollout: unknown subcommand %q\nusage: mlsched %s\n", sub, rolloutUsage)
	return errUsage
}

func rolloutStart(ctx context.Context, a *app, model string, args []string) error {
	fs := a.newFlags("rollout start", "rollout start FAMILY@VERSION [flags]")
	steps := fs.String("steps", rollout.FormatSteps(rollout.DefaultSteps), "shares of the family's tasks, in percent, step by step")
	minTasks := fs.Int64("min-tasks", rollout.DefaultMinTasks, "first-attempt outcomes of the new version a step needs before promotion")
	maxDrop := fs.String("max-drop", "1pp", "largest drop of first-attempt success accepted (1pp, or a fraction: 0.01)")
	split := fs.String("split", "", "INCUMBENT/NEW, e.g. 90/10: a pinned split, never promoted (an A/B comparison)")
	file := fs.String("f", "", "a rollout file (JSON: model, steps, min_tasks, max_drop as a fraction, alpha, beta, timeout_margin, split); flags given override it")
	if err := parse(fs, args); err != nil {
		return err
	}
	if model == "" {
		model = fs.Arg(0)
	}
	var spec rollout.Spec
	if *file != "" {
		data, err := os.ReadFile(*file)
		if err != nil {
			return err
		}
		dec := json.NewDecoder(strings.NewReader(string(data)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&spec); err != nil {
			fmt.Fprintf(a.stderr, "mlsched rollout start: %s: %v\n", *file, err)
			return errUsage
		}
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if model != "" {
		spec.Model = model
	}
	var err error
	if set["steps"] || *file == "" {
		if spec.Steps, err = rollout.ParseSteps(*steps); err != nil {
			return usageErr(a, err)
		}
	}
	if set["min-tasks"] || *file == "" {
		spec.MinTasks = *minTasks
	}
	if set["max-drop"] || *file == "" {
		if spec.MaxDrop, err = rollout.ParseDrop(*maxDrop); err != nil {
			return usageErr(a, err)
		}
	}
	if *split != "" {
		if spec.Split, err = rollout.ParseSplit(*split); err != nil {
			return usageErr(a, err)
		}
	}
	if spec.Model == "" {
		fmt.Fprintln(a.stderr, "mlsched rollout start: name the new version, FAMILY@VERSION (e.g. fraud@v8)")
		return errUsage
	}
	// a bad spec is a usage error before any connection
	if err := spec.WithDefaults().Validate(); err != nil {
		return usageErr(a, err)
	}
	if err := a.connect(); err != nil {
		return err
	}
	store, err := a.rolloutStore(ctx)
	if err != nil {
		return err
	}
	cx, cancel := a.reqCtx(ctx)
	defer cancel()
	r, err := store.Update(cx, spec.Family(), func(prev *rollout.Rollout) (*rollout.Rollout, error) {
		return rollout.Start(spec, prev, time.Now())
	})
	if err != nil {
		return err
	}
	printRollout(a, r)
	return nil
}

func usageErr(a *app, err error) error {
	fmt.Fprintln(a.stderr, "mlsched rollout:", err)
	return errUsage
}

func (a *app) rolloutStore(ctx context.Context) (rollout.Store, error) {
	cx, cancel := a.reqCtx(ctx)
	defer cancel()
	kv, err := topology.EnsureRolloutsBucket(cx, a.js, a.topology())
	return rollout.Store{KV: kv}, err
}

func rolloutShow(ctx context.Context, a *app, what, family string, raw bool) error {
	store, err := a.rolloutStore(ctx)
	if err != nil {
		return err
	}
	cx, cancel := a.reqCtx(ctx)
	defer cancel()
	var rs []*rollout.Rollout
	if family != "" {
		r, _, err := store.Get(cx, family)
		if err != nil {
			return err
		}
		rs = []*rollout.Rollout{r}
	} else if rs, err = store.List(cx); err != nil {
		return err
	}
	if raw {
		for _, r := range rs {
			writeJSON(a.stdout, r)
		}
		return nil
	}
	if len(rs) == 0 {
		fmt.Fprintln(a.stdout, "no rollouts")
		return nil
	}
	for _, r := range rs {
		if what == "history" {
			printHistory(a, r)
		} else {
			printRollout(a, r)
		}
	}
	return nil
}

func printRollout(a *app, r *rollout.Rollout) {
	ev := r.Reading()
	kind := "steps " + rollout.FormatSteps(r.Steps)
	if r.Split > 0 {
		kind = fmt.Sprintf("pinned split %g/%g", 100-r.Split, r.Split)
	}
	fmt.Fprintf(a.stdout, "%s: %s, step %d/%d at %g%% (%s, min-tasks %d, max-drop %s), since %s\n",
		r.Model, r.State, r.Step+1, len(r.Steps), 100*r.Share(), kind, r.MinTasks, rollout.FormatDrop(r.MaxDrop),
		r.StepSince.UTC().Format(time.RFC3339))
	fmt.Fprintf(a.stdout, "  new       %6d tasks, %5d failed (%.2f%%, %d timeouts)\n", r.New.N(), r.New.Failures, 100*r.New.FailureRate(), r.New.Timeouts)
	fmt.Fprintf(a.stdout, "  incumbent %6d tasks, %5d failed (%.2f%%, %d timeouts)\n", r.Incumbent.N(), r.Incumbent.Failures, 100*r.Incumbent.FailureRate(), r.Incumbent.Timeouts)
	fmt.Fprintf(a.stdout, "  test: LLR %.2f (promote at <= %.2f with %d tasks, roll back at >= %.2f): %s\n", ev.LLR, ev.Lower, r.MinTasks, ev.Upper, ev.Verdict)
	if r.Evidence != nil && r.State == rollout.RolledBack {
		x := r.Evidence
		fmt.Fprintf(a.stdout, "  rolled back on: new %d/%d failed (%.2f%%), incumbent %d/%d (%.2f%%), LLR %.2f\n",
			x.New.Failures, x.New.N(), 100*x.NewRate, x.Incumbent.Failures, x.Incumbent.N(), 100*x.IncRate, x.LLR)
	}
}

func printHistory(a *app, r *rollout.Rollout) {
	tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "AT\tMODEL\tFROM\tTO\tSHARE\tBY\tREASON")
	for _, e := range r.History {
		from := string(e.From)
		if from == "" {
			from = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%g%%\t%s\t%s\n", e.At.UTC().Format(time.RFC3339), e.Model, from, e.To, e.Share, e.By, e.Reason)
	}
	_ = tw.Flush()
}

package simulate

import (
	"cmp"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"text/tabwriter"
	"time"
)

// Report is the outcome of running a scenario under several policies.
type Report struct {
	Scenario    string `json:"scenario"`
	Description string `json:"description,omitempty"`
	Seed        uint64 `json:"seed"`
	Tasks       int    `json:"tasks"`
	// Runs is the number of seeds averaged (Seed, Seed+1, ...).
	Runs        int      `json:"runs"`
	MaxAttempts int      `json:"max_attempts"`
	ChangeAtS   *float64 `json:"change_at_s,omitempty"`
	// RecoveryWindow and RecoveryPoints define Result.RecoveryTasks.
	RecoveryWindow int      `json:"recovery_window"`
	RecoveryPoints float64  `json:"recovery_points"`
	Results        []Result `json:"results"`
}

// Result is one policy's figures.
type Result struct {
	Policy string `json:"policy"`
	// FirstSuccess is the share of tasks whose first attempt succeeded.
	FirstSuccess float64 `json:"first_attempt_success"`
	// FinalSuccess is the share of tasks that succeeded within the
	// scenario's max attempts.
	FinalSuccess float64 `json:"final_success"`
	FailedFirst  int     `json:"failed_first_attempts"`
	// QueueFailedFirst counts the first attempts that expired in a node's
	// queue or missed their deadline there (part of FailedFirst).
	QueueFailedFirst int `json:"queue_failed_first_attempts"`
	// ExtraFailedFirst is FailedFirst minus the oracle run's (realised).
	ExtraFailedFirst int `json:"extra_failed_first_vs_oracle"`
	// Regret is the expected number of failed first attempts beyond the
	// oracle's: the sum over tasks of the true failure probability of the
	// chosen (model, node) when it was chosen, minus that of the oracle
	// run's choice for the same task. An attempt that expired in a queue or
	// missed its deadline there counts as a certain failure, so burying a
	// model under more work than it can finish shows as regret. It is free
	// of the draws' noise otherwise.
	Regret float64 `json:"regret_failed_first"`
	// RegretPoints is Regret per task in percentage points.
	RegretPoints float64 `json:"regret_pp"`
	// Latency from submission to the final outcome.
	MeanLatencyMs float64 `json:"mean_latency_ms"`
	P95LatencyMs  float64 `json:"p95_latency_ms"`
	MeanAttempts  float64 `json:"mean_attempts"`
	// RecoveryTasks (scenarios with change_at): how many tasks after the
	// change until the rolling mean, over RecoveryWindow tasks submitted
	// after it, of the expected first-attempt success is within
	// RecoveryPoints of the oracle's; -1 if never.
	RecoveryTasks *int `json:"recovery_tasks,omitempty"`
	// Recoveries are the RecoveryTasks of each run when several seeds are
	// averaged (RecoveryTasks is then their median, -1 counting as never).
	Recoveries []int `json:"recoveries,omitempty"`
	// Timeline splits the run by submission time, to show when the regret
	// was incurred (first run only when several seeds are averaged).
	Timeline []Segment `json:"timeline,omitempty"`
	// Curve is the rolling first-attempt success rate over time, for plots.
	Curve []Point `json:"-"`
	// Rollouts are what the scenario's rollout did, one per run.
	Rollouts []*RolloutResult `json:"rollouts,omitempty"`
	// FlowControl has the figures per flow (priority and tenant) of a
	// scenario with arrival.flows (flow.go); inversions and late starts
	// are summed over the runs, the rest averaged.
	FlowControl *FlowSummary `json:"flow_control,omitempty"`
	// CostPerSuccess (scenarios where a model declares a cost) is what
	// every attempt that started cost, failed ones included, per task
	// that succeeded in the end.
	CostPerSuccess *float64 `json:"cost_per_success,omitempty"`
	// FirstShares (scenarios where a model declares a cost) is each
	// model's share of the first attempts of the tasks submitted after
	// warm-up: one statistics window, or the first tenth of the tasks if
	// that is shorter.
	FirstShares map[string]float64 `json:"first_attempt_shares,omitempty"`
	// Pipelines has the figures of the pipeline tasks of a scenario with
	// pipelines (pipeline.go), averaged over the runs.
	Pipelines *PipelineSummary `json:"pipelines,omitempty"`
}

// Segment is the figures of the tasks submitted in [FromS, ToS).
type Segment struct {
	FromS        float64 `json:"from_s"`
	ToS          float64 `json:"to_s"`
	Tasks        int     `json:"tasks"`
	FirstSuccess float64 `json:"first_attempt_success"`
	RegretPoints float64 `json:"regret_pp"`
}

// Point is one sample of a rolling success rate.
type Point struct {
	AtS     float64 // simulated seconds since the start
	Success float64 // 0..1
}

// Run simulates sc under each policy of opt.Policies, and the oracle.
func Run(ctx context.Context, sc *Scenario, opt Options) (*Report, error) {
	opt = opt.withDefaults(sc)
	if opt.Tasks > MaxTasks || opt.Runs > 1000 {
		return nil, fmt.Errorf("%w: %d tasks (at most %d), %d runs (at most 1000)", ErrInvalidOptions, opt.Tasks, MaxTasks, opt.Runs)
	}
	// Table rebuilds dominate a sparse run: bound them.
	rate := sc.Arrival.Rate
	if sc.trace != nil { // the trace's mean rate over the run
		rate = float64(opt.Tasks) / max(sc.trace.arrivalAt(opt.Tasks-1).Seconds(), 1e-3)
	}
	if refreshes := float64(opt.Tasks) / rate / sc.Refresh.D().Seconds(); refreshes > maxRefreshes {
		return nil, fmt.Errorf("%w: %d tasks at %g/s would rebuild the table about %.3g times every %v (at most %g): raise refresh or the rate, or run fewer tasks",
			ErrInvalidOptions, opt.Tasks, rate, refreshes, sc.Refresh.D(), float64(maxRefreshes))
	}
	names := slices.Clone(opt.Policies)
	for _, p := range names {
		if !knownPolicy(p) {
			return nil, fmt.Errorf("%w %q (want one of %v or all)", ErrUnknownPolicy, p, append(Policies(), CostPolicies()...))
		}
	}
	if !slices.Contains(names, Oracle) {
		names = append(names, Oracle)
	}
	rep := &Report{Scenario: sc.Name, Description: sc.Description, Seed: opt.Seed, Tasks: opt.Tasks, MaxAttempts: sc.MaxAttempts,
		RecoveryWindow: opt.RecoveryWindow, RecoveryPoints: opt.RecoveryPoints}
	if sc.ChangeAt != nil {
		v := sc.ChangeAt.D().Seconds()
		rep.ChangeAtS = &v
	}
	order := append([]string{Oracle}, slices.DeleteFunc(slices.Clone(names), func(s string) bool { return s == Oracle })...)
	per := map[string][]Result{}
	for i := range opt.Runs {
		o := opt
		o.Seed = opt.Seed + uint64(i)
		runs := map[string][]taskResult{}
		ros := map[string]*RolloutResult{}
		inversions, shedInversions := map[string]int{}, map[string]int{}
		for _, name := range order {
			s, err := newSim(sc, o, name)
			if err != nil {
				return nil, err
			}
			if err := s.run(ctx, o.Tasks); err != nil {
				return nil, fmt.Errorf("policy %s, seed %d: %w", name, o.Seed, err)
			}
			runs[name] = s.tasks
			if s.fc != nil {
				inversions[name], shedInversions[name] = s.fc.inversions, s.fc.shedInversions
			}
			if s.ro != nil {
				ros[name] = s.ro.result(s)
			}
		}
		oracleFailed := countFailedFirst(runs[Oracle])
		// Regret is measured against what the oracle's run got for the
		// same task (the arrivals are the same in every run).
		for _, ts := range runs {
			for j := range ts {
				ts[j].pBest = runs[Oracle][j].pFirst
			}
		}
		for _, name := range names {
			r := summarize(name, runs[name], sc, o)
			r.ExtraFailedFirst = r.FailedFirst - oracleFailed
			if ro := ros[name]; ro != nil {
				r.Rollouts = []*RolloutResult{ro}
			}
			if r.Pipelines != nil {
				r.Pipelines.VsOracle = (r.Pipelines.Success - summarizePipelines(runs[Oracle]).Success) * 100
			}
			if len(sc.Arrival.Flows) > 0 {
				r.FlowControl = summarizeFlows(sc, runs[name], inversions[name])
				r.FlowControl.ShedInversions = shedInversions[name]
				oracleFlows := summarizeFlows(sc, runs[Oracle], 0)
				for k := range r.FlowControl.Flows {
					r.FlowControl.Flows[k].VsOracle = (r.FlowControl.Flows[k].Success - oracleFlows.Flows[k].Success) * 100
				}
			}
			per[name] = append(per[name], r)
		}
	}
	rep.Runs = opt.Runs
	for _, name := range names {
		rep.Results = append(rep.Results, aggregate(per[name]))
	}
	return rep, nil
}

// aggregate averages the runs of one policy over seeds; recovery is the
// median (a run that never recovers counts as the longest), and the curve
// is the first run's.
func aggregate(rs []Result) Result {
	if len(rs) == 1 {
		return rs[0]
	}
	out := Result{Policy: rs[0].Policy, Curve: rs[0].Curve, Timeline: rs[0].Timeline, FlowControl: aggregateFlows(rs),
		Pipelines: aggregatePipelines(rs)}
	for _, r := range rs {
		out.Rollouts = append(out.Rollouts, r.Rollouts...)
	}
	n := float64(len(rs))
	var failed, extra, qfailed float64
	for _, r := range rs {
		qfailed += float64(r.QueueFailedFirst) / n
		out.FirstSuccess += r.FirstSuccess / n
		out.FinalSuccess += r.FinalSuccess / n
		failed += float64(r.FailedFirst) / n
		extra += float64(r.ExtraFailedFirst) / n
		out.Regret += r.Regret / n
		out.RegretPoints += r.RegretPoints / n
		out.MeanLatencyMs += r.MeanLatencyMs / n
		out.P95LatencyMs += r.P95LatencyMs / n
		out.MeanAttempts += r.MeanAttempts / n
		if r.RecoveryTasks != nil {
			out.Recoveries = append(out.Recoveries, *r.RecoveryTasks)
		}
		if r.CostPerSuccess != nil {
			if out.CostPerSuccess == nil {
				out.CostPerSuccess = new(float64)
			}
			*out.CostPerSuccess += *r.CostPerSuccess / n
		}
		for m, v := range r.FirstShares {
			if out.FirstShares == nil {
				out.FirstShares = map[string]float64{}
			}
			out.FirstShares[m] += v / n
		}
	}
	out.FailedFirst, out.ExtraFailedFirst = int(math.Round(failed)), int(math.Round(extra))
	out.QueueFailedFirst = int(math.Round(qfailed))
	if len(out.Recoveries) > 0 {
		sorted := slices.Clone(out.Recoveries)
		slices.SortFunc(sorted, func(a, b int) int {
			if a < 0 {
				a = math.MaxInt
			}
			if b < 0 {
				b = math.MaxInt
			}
			return cmp.Compare(a, b)
		})
		med := sorted[(len(sorted)-1)/2]
		out.RecoveryTasks = &med
	}
	return out
}

func countFailedFirst(ts []taskResult) int {
	n := 0
	for _, t := range ts {
		if !t.firstOK {
			n++
		}
	}
	return n
}

func summarize(name string, ts []taskResult, sc *Scenario, opt Options) Result {
	r := Result{Policy: name}
	n := float64(len(ts))
	lats := make([]time.Duration, 0, len(ts))
	var latSum time.Duration
	var attempts, ok, first int
	for _, t := range ts {
		if t.firstOK {
			first++
		}
		if t.succeeded {
			ok++
		}
		if t.queueFailed {
			r.QueueFailedFirst++
		}
		attempts += t.attempts
		r.Regret += t.pFirst - t.pBest
		lats = append(lats, t.latency)
		latSum += t.latency
	}
	r.FirstSuccess = float64(first) / n
	r.FinalSuccess = float64(ok) / n
	r.FailedFirst = len(ts) - first
	r.RegretPoints = r.Regret / n * 100
	r.MeanAttempts = float64(attempts) / n
	r.MeanLatencyMs = float64(latSum) / n / float64(time.Millisecond)
	slices.Sort(lats)
	r.P95LatencyMs = float64(lats[int(math.Ceil(0.95*n))-1]) / float64(time.Millisecond)
	if sc.ChangeAt != nil {
		v := recovery(ts, sc.ChangeAt.D(), opt.RecoveryWindow, opt.RecoveryPoints/100)
		r.RecoveryTasks = &v
	}
	r.Curve = curve(ts)
	r.Timeline = timeline(ts, opt.Segment)
	if sc.Pipelines != nil {
		r.Pipelines = summarizePipelines(ts)
	}
	if sc.costed() {
		c := costPerSuccess(ts)
		r.CostPerSuccess = &c
		r.FirstShares = firstShares(ts, sc.Window.Size.D())
	}
	return r
}

// timeline cuts the tasks into segments of submission time.
func timeline(ts []taskResult, seg time.Duration) []Segment {
	var out []Segment
	var ok int
	var regret float64
	for _, t := range ts {
		k := int(t.submit / seg)
		if len(out) == 0 || out[len(out)-1].FromS != (time.Duration(k)*seg).Seconds() {
			out = append(out, Segment{FromS: (time.Duration(k) * seg).Seconds(), ToS: (time.Duration(k+1) * seg).Seconds()})
			ok, regret = 0, 0
		}
		g := &out[len(out)-1]
		g.Tasks++
		if t.firstOK {
			ok++
		}
		regret += t.pFirst - t.pBest
		g.FirstSuccess = float64(ok) / float64(g.Tasks)
		g.RegretPoints = regret / float64(g.Tasks) * 100
	}
	return out
}

// recovery counts the tasks submitted after the change until the mean gap
// in expected first-attempt success to the oracle, over the last w of them,
// is at most tol; -1 if it never is.
func recovery(ts []taskResult, change time.Duration, w int, tol float64) int {
	var gaps []float64
	for _, t := range ts {
		if t.submit >= change {
			gaps = append(gaps, t.pFirst-t.pBest)
		}
	}
	var sum float64
	for i, g := range gaps {
		sum += g
		if i >= w {
			sum -= gaps[i-w]
		}
		if i+1 >= w && sum/float64(w) <= tol+1e-12 {
			return i + 1
		}
	}
	return -1
}

// curveWindow is the rolling window of the curves, in tasks.
func curveWindow(tasks int) int { return min(tasks, max(50, tasks/50)) }

// curve samples the rolling first-attempt success rate over about 300
// points; the window is 2% of the tasks (at least 50).
func curve(ts []taskResult) []Point {
	w := curveWindow(len(ts))
	step := max(1, len(ts)/300)
	var pts []Point
	ok := 0
	for i, t := range ts {
		if t.firstOK {
			ok++
		}
		if i >= w && ts[i-w].firstOK {
			ok--
		}
		if i+1 >= w && ((i+1-w)%step == 0 || i == len(ts)-1) {
			pts = append(pts, Point{AtS: t.submit.Seconds(), Success: float64(ok) / float64(w)})
		}
	}
	return pts
}

// Formats of Write.
const (
	FormatTable = "table"
	FormatCSV   = "csv"
	FormatJSON  = "json"
)

// Write writes the report as a table, CSV or JSON.
func (r *Report) Write(w io.Writer, format string) error {
	switch format {
	case FormatTable, "":
		return r.WriteTable(w)
	case FormatCSV:
		return r.WriteCSV(w)
	case FormatJSON:
		return r.WriteJSON(w)
	}
	return fmt.Errorf("unknown format %q (want table, csv or json)", format)
}

var header = []string{"policy", "first_success_pct", "final_success_pct", "failed_first", "queue_failed_first", "extra_failed_first_vs_oracle", "regret_failed_first", "regret_pp", "mean_latency_ms", "p95_latency_ms", "mean_attempts", "recovery_tasks"}

func (r *Result) row(prec int) []string {
	f := func(v float64, p int) string { return strconv.FormatFloat(v, 'f', p, 64) }
	rec := ""
	if r.RecoveryTasks != nil {
		rec = strconv.Itoa(*r.RecoveryTasks)
	}
	return []string{r.Policy, f(r.FirstSuccess*100, prec), f(r.FinalSuccess*100, prec), strconv.Itoa(r.FailedFirst),
		strconv.Itoa(r.QueueFailedFirst), strconv.Itoa(r.ExtraFailedFirst), f(r.Regret, 1), f(r.RegretPoints, prec), f(r.MeanLatencyMs, 1), f(r.P95LatencyMs, 1),
		f(r.MeanAttempts, 3), rec}
}

// WriteTable writes an aligned text table with a one-line heading.
func (r *Report) WriteTable(w io.Writer) error {
	head := fmt.Sprintf("scenario %s, %d tasks, seed %d, max attempts %d", r.Scenario, r.Tasks, r.Seed, r.MaxAttempts)
	if r.Runs > 1 {
		head = fmt.Sprintf("scenario %s, %d tasks, mean of %d runs (seeds %d..%d), max attempts %d", r.Scenario, r.Tasks, r.Runs, r.Seed, r.Seed+uint64(r.Runs)-1, r.MaxAttempts)
	}
	if r.ChangeAtS != nil {
		head += fmt.Sprintf(", change at %gs (recovery: tasks until within %g pts of the oracle over %d tasks", *r.ChangeAtS, r.RecoveryPoints, r.RecoveryWindow)
		if r.Runs > 1 {
			head += "; median of the runs"
		}
		head += ")"
	}
	if _, err := fmt.Fprintln(w, head); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	cols := []string{"policy", "first %", "final %", "failed 1st", "in queue", "vs oracle", "regret", "regret pp", "mean ms", "p95 ms", "attempts", "recovery"}
	line := func(cells []string) {
		for _, c := range cells {
			fmt.Fprint(tw, c, "\t")
		}
		fmt.Fprintln(tw)
	}
	costed := r.costed()
	if costed {
		cols = append(cols, "cost/success")
	}
	line(cols)
	for i := range r.Results {
		row := r.Results[i].row(2)
		if r.ChangeAtS == nil {
			row[len(row)-1] = "-"
		}
		if costed {
			row = append(row, r.Results[i].costCell(3))
		}
		line(row)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if costed {
		if err := r.writeShares(w); err != nil {
			return err
		}
	}
	if err := r.writePipelines(w); err != nil {
		return err
	}
	for i := range r.Results {
		for _, ro := range r.Results[i].Rollouts {
			if _, err := fmt.Fprintf(w, "%s: %s\n", r.Results[i].Policy, ro.line()); err != nil {
				return err
			}
		}
	}
	return r.writeFlows(w)
}

// WriteCSV writes one row per policy with a header row.
func (r *Report) WriteCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	costed := r.costed()
	head := append([]string{"scenario", "seed", "tasks"}, header...)
	if costed {
		head = append(head, "cost_per_success")
	}
	piped := len(r.Results) > 0 && r.Results[0].Pipelines != nil
	if piped {
		head = append(head, "pipelines", "pipeline_success_pct", "pipeline_vs_oracle_pp", "pipeline_no_retry_pct", "plain_success_pct", "pipeline_mean_latency_ms")
	}
	if err := cw.Write(head); err != nil {
		return err
	}
	for i := range r.Results {
		rec := append([]string{r.Scenario, strconv.FormatUint(r.Seed, 10), strconv.Itoa(r.Tasks)}, r.Results[i].row(4)...)
		if costed {
			rec = append(rec, r.Results[i].costCell(6))
		}
		if p := r.Results[i].Pipelines; piped {
			f := func(v float64, prec int) string { return strconv.FormatFloat(v, 'f', prec, 64) }
			rec = append(rec, f(p.Pipelines, 1), f(p.Success*100, 4), f(p.VsOracle, 4), f(p.Clean*100, 4), f(p.PlainSuccess*100, 4), f(p.MeanLatencyMs, 1))
		}
		if err := cw.Write(rec); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// Get returns the result of a policy, or nil.
func (r *Report) Get(policy string) *Result {
	for i := range r.Results {
		if r.Results[i].Policy == policy {
			return &r.Results[i]
		}
	}
	return nil
}

// writePipelines writes, for a scenario with pipelines, a table of each
// policy's figures on them.
func (r *Report) writePipelines(w io.Writer) error {
	if len(r.Results) == 0 || r.Results[0].Pipelines == nil {
		return nil
	}
	if _, err := fmt.Fprintln(w, "pipelines (a pipeline succeeds when every step does; plain %: the other tasks, same run)"); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	f := func(v float64, p int) string { return strconv.FormatFloat(v, 'f', p, 64) }
	fmt.Fprintln(tw, "policy\tpipelines\tsucceeded %\tvs oracle\tno retry %\tplain %\tsteps\tsteps run\tattempts\tmean ms\t")
	for i := range r.Results {
		p := r.Results[i].Pipelines
		fmt.Fprintln(tw, r.Results[i].Policy+"\t"+f(p.Pipelines, 0)+"\t"+f(p.Success*100, 2)+"\t"+f(p.VsOracle, 2)+"\t"+f(p.Clean*100, 2)+"\t"+
			f(p.PlainSuccess*100, 2)+"\t"+f(p.Steps, 2)+"\t"+f(p.StepsRun, 2)+"\t"+f(p.MeanAttempts, 2)+"\t"+f(p.MeanLatencyMs, 1)+"\t")
	}
	return tw.Flush()
}

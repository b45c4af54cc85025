package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
)

// WriteJSON writes the report, indented, to path.
func (r *Report) WriteJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// WriteTable prints the report as text tables.
func (r *Report) WriteTable(w io.Writer) error {
	o := r.Options
	fmt.Fprintf(w, "mlsched-bench %s, %d CPUs (%s), %s %s, load average at start %s\n", r.Date.Format("2006-01-02 15:04 MST"),
		r.Machine.NProc, r.Machine.CPU, r.Machine.Go, r.Machine.OS, r.Machine.LoadAvg)
	if r.Command != "" {
		fmt.Fprintf(w, "command: %s\n", r.Command)
	}
	fmt.Fprintf(w, "storage: %s\n", r.Storage)
	for _, s := range r.Scenarios {
		if tr := s.Trace; tr != nil {
			writeTrace(w, s.Name, tr, o)
		}
	}
	fmt.Fprintf(w, "throughput phase %d tasks, latency phase %d tasks at %d/s, warm-up %d; payload %d B; %d nodes x %d no-op models; policy %s; worker concurrency %d\n\n",
		o.Tasks, o.LatencyTasks, o.Rate, o.Warmup, o.Payload, o.Nodes, o.Models, o.Policy, o.Concurrency)
	for _, e := range []struct {
		who string
		env map[string]string
	}{{"dispatcher", o.DispatcherEnv}, {"workers", o.WorkerEnv}} {
		if len(e.env) > 0 {
			keys := make([]string, 0, len(e.env))
			for k := range e.env {
				keys = append(keys, k+"="+e.env[k])
			}
			slices.Sort(keys)
			fmt.Fprintf(w, "%s environment: %s\n", e.who, strings.Join(keys, " "))
		}
	}

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	row := func(label string, cells ...string) {
		fmt.Fprintf(tw, "%-38s\t%s\t\n", label, strings.Join(cells, "\t"))
	}
	cols := func(f func(s *Scenario) string) []string {
		var c []string
		for i := range r.Scenarios {
			c = append(c, f(&r.Scenarios[i]))
		}
		return c
	}
	head := cols(func(s *Scenario) string { return s.Name })
	ratios := r.ThroughputRatio > 0 || r.P99Ratio > 0
	targets := TargetsFor(o.SyncInterval)
	if ratios {
		head = append(head, "mlsched/relay")
	}
	row("", head...)
	ratio := func(v, target float64, cmp string) []string {
		if !ratios {
			return nil
		}
		if target == 0 {
			return []string{fmt.Sprintf("%.2fx", v)}
		}
		ok := (cmp == ">=" && v >= target) || (cmp == "<=" && v <= target)
		verdict := "met"
		if !ok {
			verdict = "MISSED"
		}
		return []string{fmt.Sprintf("%.2fx (target %s %.2gx: %s)", v, cmp, target, verdict)}
	}
	row("JetStream publishes per task", append(cols(func(s *Scenario) string { return fmt.Sprint(s.PublishesPerTask) }), pad(ratios)...)...)
	row("nats-server msgs in/out per task", append(cols(func(s *Scenario) string {
		if s.ServerMsgs == nil {
			return "-"
		}
		return fmt.Sprintf("%.2f / %.2f", s.ServerMsgs.InMsgs, s.ServerMsgs.OutMsgs)
	}), pad(ratios)...)...)
	row("throughput, tasks/s", append(cols(func(s *Scenario) string { return fmt.Sprintf("%.0f", s.Throughput.Throughput) }),
		ratio(r.ThroughputRatio, targets.ThroughputRatio, ">=")...)...)
	row(fmt.Sprintf("latency at %d/s: offered, tasks/s", o.Rate), append(cols(func(s *Scenario) string { return fmt.Sprintf("%.0f", s.Latency.OfferedRate) }), pad(ratios)...)...)
	lat := func(label string, f func(l Latency) float64, extra []string) {
		row(label, append(cols(func(s *Scenario) string { return fmt.Sprintf("%.2f", f(s.Latency.Latency)) }), extra...)...)
	}
	lat("  p50, ms", func(l Latency) float64 { return l.P50 }, ratio(r.P50Ratio, targets.P50Ratio, "<="))
	lat("  p99, ms", func(l Latency) float64 { return l.P99 }, ratio(r.P99Ratio, targets.P99Ratio, "<="))
	lat("  p99.9, ms", func(l Latency) float64 { return l.P999 }, pad(ratios))
	lat("  max, ms", func(l Latency) float64 { return l.Max }, pad(ratios))
	row("failed tasks", append(cols(func(s *Scenario) string {
		return fmt.Sprint(s.Warmup.Failed + s.Throughput.Failed + s.Latency.Failed)
	}), pad(ratios)...)...)
	if err := tw.Flush(); err != nil {
		return err
	}
	if r.BatchRatio > 0 {
		d, db := r.Scenario(ScenarioDigits), r.Scenario(ScenarioDigitsBatch)
		fmt.Fprintf(w, "%s over %s (batch %s) in this run: throughput %.2fx (%.0f vs %.0f tasks/s); at %.0f/s p50 %.2f vs %.2f ms, p99 %.2f vs %.2f ms\n",
			ScenarioDigitsBatch, ScenarioDigits, digitsBatch, r.BatchRatio, db.Throughput.Throughput, d.Throughput.Throughput,
			db.Latency.OfferedRate, db.Latency.Latency.P50, d.Latency.Latency.P50, db.Latency.Latency.P99, d.Latency.Latency.P99)
	}
	if r.RiverRatio > 0 {
		fmt.Fprintf(w, "%s over %s (River on Postgres, fsync on) in this run: throughput %.2fx\n", ScenarioMlsched, ScenarioRiver, r.RiverRatio)
	}
	if r.AsynqRatio > 0 {
		fmt.Fprintf(w, "%s over %s (asynq on Redis, no persistence) in this run: throughput %.2fx\n", ScenarioMlsched, ScenarioAsynq, r.AsynqRatio)
	}
	if r.ObservedThroughputRatio > 0 {
		fmt.Fprintf(w, "watching the dispatcher (%s over %s in this run): throughput %.2fx, latency-phase p99 %.2fx\n",
			ScenarioObserved, ScenarioMlsched, r.ObservedThroughputRatio, r.ObservedP99Ratio)
	}
	for _, s := range r.Scenarios {
		if ob := s.Observers; ob != nil {
			fmt.Fprintf(w, "%s observers: %d dashboard event streams (%d never read), %d /metrics scrapers every %s: %d scrapes, %d KiB of events read, %d errors\n",
				s.Name, ob.Streams, ob.Stalled, ob.Scrapers, ob.ScrapeInterval, ob.Scrapes, ob.EventBytes>>10, ob.Errors)
		}
	}
	for _, s := range r.Scenarios {
		if s.Latency.Throughput < 0.95*float64(o.Rate) {
			fmt.Fprintf(w, "note: %s is overloaded at %d/s (it completed %.0f tasks/s in that phase): its latencies are mostly queueing\n",
				s.Name, o.Rate, s.Latency.Throughput)
		}
	}

	for _, s := range r.Scenarios {
		if len(s.Latency.Hops) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s latency phase by hop, ms (p50 / p90 / p99):\n", s.Name)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		for _, h := range s.Latency.Hops {
			row("  "+h.Name, fmt.Sprintf("%.2f / %.2f / %.2f", h.Latency.P50, h.Latency.P90, h.Latency.P99))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}

	for _, ph := range []struct {
		title string
		get   func(s *Scenario) Phase
	}{
		{"throughput phase", func(s *Scenario) Phase { return s.Throughput }},
		{"latency phase", func(s *Scenario) Phase { return s.Latency }},
	} {
		fmt.Fprintf(w, "\nCPU seconds in the %s (µs per task):\n", ph.title)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		row("process", cols(func(s *Scenario) string { return s.Name })...)
		totals := make([]float64, len(r.Scenarios))
		for _, name := range r.processes() {
			var c []string
			for i := range r.Scenarios {
				p := ph.get(&r.Scenarios[i])
				v, ok := p.CPU[name]
				if !ok {
					c = append(c, "-")
					continue
				}
				totals[i] += v
				c = append(c, cpuCell(v, p.Tasks))
			}
			row(name, c...)
		}
		var c []string
		for i := range r.Scenarios {
			c = append(c, cpuCell(totals[i], ph.get(&r.Scenarios[i]).Tasks))
		}
		row("total", c...)
		c = c[:0]
		for i := range r.Scenarios {
			p := ph.get(&r.Scenarios[i])
			busy := 0.0
			if p.Seconds > 0 {
				busy = 100 * totals[i] / (p.Seconds * float64(r.Machine.NProc))
			}
			c = append(c, fmt.Sprintf("%.0f%%", busy))
		}
		row(fmt.Sprintf("share of %d CPUs over the phase", r.Machine.NProc), c...)
		if err := tw.Flush(); err != nil {
			return err
		}
	}

	fmt.Fprintf(w, "\nresident memory, MiB (ready / after warm-up / peak / end):\n")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	for _, s := range r.Scenarios {
		names := make([]string, 0, len(s.Memory))
		for k := range s.Memory {
			names = append(names, k)
		}
		slices.Sort(names)
		for _, k := range names {
			m := s.Memory[k]
			row(s.Name+": "+k, fmt.Sprintf("%.1f / %.1f / %.1f / %.1f", m.ReadyMiB, m.StartMiB, m.PeakMiB, m.EndMiB))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, s := range r.Scenarios {
		if len(s.Dispatched) == 0 {
			continue
		}
		names := make([]string, 0, len(s.Dispatched))
		for k := range s.Dispatched {
			names = append(names, k)
		}
		slices.Sort(names)
		fmt.Fprintf(w, "\n%s attempts per model (whole run):", s.Name)
		for _, k := range names {
			fmt.Fprintf(w, " %s %d", k, s.Dispatched[k])
		}
		fmt.Fprintln(w)
	}
	for _, p := range append([]*Profile{r.Profile, r.WorkerProfile}, r.OtherProfiles...) {
		if p == nil {
			continue
		}
		fmt.Fprintf(w, "\n%s CPU profile (%ds covering the measured phases): %s\n", p.Who, p.Seconds, p.Path)
		if p.Top != "" {
			fmt.Fprint(w, p.Top)
		}
	}
	return nil
}

func pad(on bool) []string {
	if on {
		return []string{""}
	}
	return nil
}

func cpuCell(sec float64, tasks int) string {
	if tasks <= 0 {
		return fmt.Sprintf("%.2f", sec)
	}
	return fmt.Sprintf("%.2f (%.0f)", sec, sec*1e6/float64(tasks))
}

// processes lists the CPU groups of every scenario, servers first.
func (r *Report) processes() []string {
	order := []string{"nats-server", "redis-server", "dispatcher", "relay", "bench driver"}
	seen := map[string]bool{}
	var out []string
	add := func(n string) {
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	var rest []string
	for _, s := range r.Scenarios {
		for k := range s.Throughput.CPU {
			if !slices.Contains(order, k) {
				rest = append(rest, k)
			}
		}
	}
	slices.Sort(rest)
	has := func(n string) bool {
		return slices.ContainsFunc(r.Scenarios, func(s Scenario) bool { _, ok := s.Throughput.CPU[n]; return ok })
	}
	for _, n := range order[:3] { // servers and dispatcher, workers, relay, us
		if has(n) {
			add(n)
		}
	}
	for _, n := range rest {
		add(n)
	}
	for _, n := range order[3:] {
		if has(n) {
			add(n)
		}
	}
	return out
}

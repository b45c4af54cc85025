package bench

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// writeDeadlines prints, for a suite run with deadlines, each scenario's
// latency phase per round: its failed tasks by why they were late
// (late.go), by deadline range, and its duplicate results; then, with
// several rounds, the median of each count over the rounds.
func (s *Suite) writeDeadlines(w io.Writer) error {
	type row struct {
		round    int
		scenario string
		p        Phase
	}
	var rows []row
	for _, r := range s.Reports {
		if r.Options.Deadlines[1] <= 0 {
			continue
		}
		for _, sc := range r.Scenarios {
			if sc.Latency.Tasks > 0 && (sc.Name == ScenarioDigits || sc.Name == ScenarioDigitsBatch || sc.Latency.LateBy != nil || sc.Latency.Failed > 0) {
				rows = append(rows, row{max(r.Options.Round, 1), sc.Name, sc.Latency})
			}
		}
	}
	if len(rows) == 0 {
		return nil
	}
	o := s.Reports[0].Options
	fmt.Fprintf(w, "\ndeadlines %d-%d ms, latency phase (%d tasks at %d/s): failed tasks by why they were late and by deadline range\n",
		o.Deadlines[0], o.Deadlines[1], o.LatencyTasks, o.Rate)
	whys := []string{LateBatchWait, LateShortDeadline, LateBeforeNode, LateNodeWait, LateNoDispatch, LateOther}
	ranges := []string{"<100ms", "100-500ms", ">=500ms"}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "scenario\tround\tfailed\t%s\t%s\tduplicate results\trun p50 ms\t\n", strings.Join(whys, "\t"), strings.Join(ranges, "\t"))
	counts := func(p Phase) []float64 {
		c := []float64{float64(p.Failed)}
		for _, k := range whys {
			c = append(c, float64(p.LateBy[k]))
		}
		byRange := map[string]int64{}
		for k, n := range p.FailedBy {
			if i := strings.LastIndexByte(k, ' '); i >= 0 {
				byRange[k[i+1:]] += n
			}
		}
		for _, k := range ranges {
			c = append(c, float64(byRange[k]))
		}
		return append(c, float64(p.Duplicates), p.RunP50Ms)
	}
	line := func(name, round string, c []float64) {
		parts := make([]string, len(c))
		for i, v := range c {
			parts[i] = fmt.Sprintf("%g", v)
			if i == len(c)-1 {
				parts[i] = fmt.Sprintf("%.2f", v)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t\n", name, round, strings.Join(parts, "\t"))
	}
	byScenario := map[string][][]float64{}
	var order []string
	for _, r := range rows {
		c := counts(r.p)
		line(r.scenario, fmt.Sprint(r.round), c)
		if _, ok := byScenario[r.scenario]; !ok {
			order = append(order, r.scenario)
		}
		byScenario[r.scenario] = append(byScenario[r.scenario], c)
	}
	for _, name := range order {
		cs := byScenario[name]
		if len(cs) < 2 {
			continue
		}
		med := make([]float64, len(cs[0]))
		for i := range med {
			v := make([]float64, len(cs))
			for j, c := range cs {
				v[j] = c[i]
			}
			med[i] = median(v)
		}
		line(name, fmt.Sprintf("median of %d", len(cs)), med)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "%q: a node got it with time to run, and only its wait for its batch to fill made it late; %q: its deadline_ms was below its run; %q: what was left at the node did not cover its run (its time went before the node); %q: in time at the node even after any batch wait, it waited there otherwise (a slot, the way to the batcher); %q: no node got it. A run is what the attempt ran (for a timeout at least the median run of its moment), or that median for an attempt not run (the successes within a second, else the phase's run p50). Each late task's account is in the JSON (late).\n",
		LateBatchWait, LateShortDeadline, LateBeforeNode, LateNodeWait, LateNoDispatch)
	return nil
}

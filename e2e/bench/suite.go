package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Mode is a durability setting of the NATS servers.
type Mode struct {
	Name string `json:"name"`
	// SyncInterval is the servers' jetstream sync_interval.
	SyncInterval string `json:"sync_interval"`
}

// The two modes `make bench` compares.
var (
	// ModeDurable fsyncs every write, as production must.
	ModeDurable = Mode{Name: "durable", SyncInterval: "always"}
	// ModeFast is the server's default: an fsync every 2 minutes, so
	// CPU, not the disk, is the limit.
	ModeFast = Mode{Name: "fast", SyncInterval: "2m"}
)

// ModeOf names a sync_interval: durable, fast or "sync <value>".
func ModeOf(syncInterval string) Mode {
	switch syncInterval {
	case "", ModeDurable.SyncInterval:
		return ModeDurable
	case ModeFast.SyncInterval:
		return ModeFast
	}
	return Mode{Name: "sync " + syncInterval, SyncInterval: syncInterval}
}

// Targets are what mlsched should reach against the relay in the same run
// (issue 13); measured and reported, never asserted. A zero field has no
// target.
type Targets struct {
	ThroughputRatio float64 `json:"throughput_ratio_min,omitempty"`
	P50Ratio        float64 `json:"p50_ratio_max,omitempty"`
	P99Ratio        float64 `json:"p99_ratio_max,omitempty"`
	// CPUPerTaskMicros bounds the dispatcher's plus the workers' CPU per
	// task in the throughput phase.
	CPUPerTaskMicros float64 `json:"cpu_per_task_us_max,omitempty"`
}

// TargetsFor returns the targets of a sync_interval: fast mode (CPU-bound)
// has latency targets, durable mode (fsync-bound) a throughput target.
func TargetsFor(syncInterval string) Targets {
	if ModeOf(syncInterval) == ModeDurable {
		return Targets{ThroughputRatio: 0.6, CPUPerTaskMicros: 100}
	}
	return Targets{ThroughputRatio: 0.45, P50Ratio: 2.5, P99Ratio: 3, CPUPerTaskMicros: 100}
}

// Suite is one `make bench`: a Report per mode and topology (one server,
// and a cluster with replicated streams).
type Suite struct {
	Date    time.Time `json:"date"`
	Command string    `json:"command"`
	Machine Machine   `json:"machine"`
	// LoadAvg is /proc/loadavg at the end (Machine has it at the start).
	LoadAvgEnd string    `json:"loadavg_end"`
	Reports    []*Report `json:"reports"`
}

// RunSuite runs o once per mode, on one server and, with clusterNodes > 0,
// on a cluster of that many servers; rounds > 1 repeats each (relay then
// mlsched, again and again) so that the summary can give the median of
// every ratio, which one unlucky run on a shared machine does not move. It
// returns what ran when one fails.
func RunSuite(ctx context.Context, o Options, modes []Mode, clusterNodes, rounds int) (*Suite, error) {
	s := &Suite{Date: time.Now().UTC(), Machine: machine()}
	topologies := []int{0}
	if clusterNodes > 0 {
		topologies = append(topologies, clusterNodes)
	}
	rounds = max(rounds, 1)
	for _, m := range modes {
		for _, n := range topologies {
			for round := 1; round <= rounds; round++ {
				if err := s.runOne(ctx, o, m, n, round, rounds); err != nil {
					return s, err
				}
			}
		}
	}
	s.LoadAvgEnd = machine().LoadAvg
	return s, nil
}

// runOne runs one round of one mode on one topology.
func (s *Suite) runOne(ctx context.Context, o Options, m Mode, n, round, rounds int) error {
	ro := o
	ro.SyncInterval, ro.ClusterNodes, ro.Round = m.SyncInterval, n, round
	slug := fmt.Sprintf("%s-r%d", strings.ReplaceAll(m.Name, " ", "-"), max(1, n)) // e.g. fast-r3
	if rounds > 1 {
		slug += fmt.Sprintf("-round%d", round)
	}
	if o.Dir != "" {
		ro.Dir = filepath.Join(o.Dir, slug)
	}
	if o.ProfilePath != "" {
		ext := filepath.Ext(o.ProfilePath)
		ro.ProfilePath = strings.TrimSuffix(o.ProfilePath, ext) + "." + slug + ext
	}
	fmt.Fprintf(ro.withDefaults().Progress, "=== mode %s (sync_interval %s), %s, round %d of %d\n", m.Name, m.SyncInterval, topologyName(n), round, rounds)
	rep, err := Run(ctx, ro)
	if rep != nil && err == nil {
		s.Reports = append(s.Reports, rep)
	}
	if err != nil {
		return fmt.Errorf("mode %s, %s, round %d: %w", m.Name, topologyName(n), round, err)
	}
	return nil
}

func topologyName(clusterNodes int) string {
	if clusterNodes <= 0 {
		return "1 server R1"
	}
	return fmt.Sprintf("%d servers R%d", clusterNodes, clusterNodes)
}

// WriteJSON writes the suite, indented, to path.
func (s *Suite) WriteJSON(path string) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// SummaryRow is one line of the suite's summary: relay and mlsched side by
// side in one mode and topology.
type SummaryRow struct {
	Mode, Topology                string
	Round                         int // 1-based; 0 in a median row
	Rounds                        int // how many rounds a median row summarises
	RelayTput, MlsTput, TputRatio float64
	RelayP50, MlsP50, P50Ratio    float64
	RelayP99, MlsP99, P99Ratio    float64
	CPUPerTask                    float64 // dispatcher + workers, µs per task, throughput phase
	NATSCPUPerTask, RelayNATSCPU  float64 // nats-server(s), µs per task, throughput phase
	MlsTputVsOneServer            float64 // this topology's mlsched throughput over one server's (same mode)
	RiverTput, RiverRatio         float64 // River on Postgres (scenario river) and mlsched over it; 0 when it did not run
	AsynqTput, AsynqRatio         float64 // asynq on Redis (scenario asynq) and mlsched over it; 0 when it did not run
	Targets                       Targets
	Overloaded                    []string
}

// Summary computes a row per report.
func (s *Suite) Summary() []SummaryRow {
	var rows []SummaryRow
	oneServer := map[string]float64{}
	for _, r := range s.Reports {
		row := SummaryRow{Mode: ModeOf(r.Options.SyncInterval).Name, Topology: topologyName(r.Options.ClusterNodes),
			Targets: TargetsFor(r.Options.SyncInterval), Round: max(r.Options.Round, 1)}
		relay, mls := r.Scenario(ScenarioRelay), r.Scenario(ScenarioMlsched)
		ratio := func(a, b float64) float64 {
			if b <= 0 {
				return 0
			}
			return a / b
		}
		perTask := perTaskCPU
		isNATS := func(k string) bool { return strings.HasPrefix(k, "nats-server") }
		if relay != nil {
			row.RelayTput, row.RelayP50, row.RelayP99 = relay.Throughput.Throughput, relay.Latency.Latency.P50, relay.Latency.Latency.P99
			row.RelayNATSCPU = perTask(relay, isNATS)
		}
		if mls != nil {
			row.MlsTput, row.MlsP50, row.MlsP99 = mls.Throughput.Throughput, mls.Latency.Latency.P50, mls.Latency.Latency.P99
			row.CPUPerTask = perTask(mls, func(k string) bool { return k == "dispatcher" || strings.HasPrefix(k, "workers") })
			row.NATSCPUPerTask = perTask(mls, isNATS)
		}
		if rv := r.Scenario(ScenarioRiver); rv != nil {
			row.RiverTput = rv.Throughput.Throughput
			row.RiverRatio = ratio(row.MlsTput, row.RiverTput)
		}
		if aq := r.Scenario(ScenarioAsynq); aq != nil {
			row.AsynqTput = aq.Throughput.Throughput
			row.AsynqRatio = ratio(row.MlsTput, row.AsynqTput)
		}
		for _, sc := range r.Scenarios {
			if sc.Latency.Throughput < 0.95*float64(r.Options.Rate) {
				row.Overloaded = append(row.Overloaded, sc.Name)
			}
		}
		row.TputRatio, row.P50Ratio, row.P99Ratio = ratio(row.MlsTput, row.RelayTput), ratio(row.MlsP50, row.RelayP50), ratio(row.MlsP99, row.RelayP99)
		key := fmt.Sprintf("%s/%d", row.Mode, row.Round)
		if r.Options.ClusterNodes == 0 {
			oneServer[key] = row.MlsTput
		}
		row.MlsTputVsOneServer = ratio(row.MlsTput, oneServer[key])
		rows = append(rows, row)
	}
	return rows
}

// Medians summarises the rounds of each mode and topology that ran more
// than once: the median of each figure and ratio over the rounds (each
// ratio is taken within its round first, against the relay of the same
// round).
func (s *Suite) Medians() []SummaryRow {
	var order []string
	groups := map[string][]SummaryRow{}
	for _, r := range s.Summary() {
		k := r.Mode + "\x00" + r.Topology
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], r)
	}
	var out []SummaryRow
	for _, k := range order {
		g := groups[k]
		if len(g) < 2 {
			continue
		}
		med := func(f func(SummaryRow) float64) float64 {
			v := make([]float64, len(g))
			for i, r := range g {
				v[i] = f(r)
			}
			return median(v)
		}
		out = append(out, SummaryRow{Mode: g[0].Mode, Topology: g[0].Topology, Rounds: len(g), Targets: g[0].Targets,
			RelayTput: med(func(r SummaryRow) float64 { return r.RelayTput }), MlsTput: med(func(r SummaryRow) float64 { return r.MlsTput }),
			TputRatio: med(func(r SummaryRow) float64 { return r.TputRatio }),
			RelayP50:  med(func(r SummaryRow) float64 { return r.RelayP50 }), MlsP50: med(func(r SummaryRow) float64 { return r.MlsP50 }),
			P50Ratio: med(func(r SummaryRow) float64 { return r.P50Ratio }),
			RelayP99: med(func(r SummaryRow) float64 { return r.RelayP99 }), MlsP99: med(func(r SummaryRow) float64 { return r.MlsP99 }),
			P99Ratio:           med(func(r SummaryRow) float64 { return r.P99Ratio }),
			CPUPerTask:         med(func(r SummaryRow) float64 { return r.CPUPerTask }),
			NATSCPUPerTask:     med(func(r SummaryRow) float64 { return r.NATSCPUPerTask }),
			RelayNATSCPU:       med(func(r SummaryRow) float64 { return r.RelayNATSCPU }),
			MlsTputVsOneServer: med(func(r SummaryRow) float64 { return r.MlsTputVsOneServer }),
			RiverTput:          med(func(r SummaryRow) float64 { return r.RiverTput }),
			RiverRatio:         med(func(r SummaryRow) float64 { return r.RiverRatio }),
			AsynqTput:          med(func(r SummaryRow) float64 { return r.AsynqTput }),
			AsynqRatio:         med(func(r SummaryRow) float64 { return r.AsynqRatio }),
		})
	}
	return out
}

// riverTarget is issue 24's target for mlsched over River: at least as fast
// in durable mode (fsync on both sides); none in fast mode, where
// Postgres still fsyncs and nats-server does not.
func riverTarget(mode string) float64 {
	if mode == ModeDurable.Name {
		return 1
	}
	return 0
}

// asynqTarget is issue 46's target for mlsched over asynq: at least twice
// its throughput in fast mode (neither side fsyncs); none in durable mode,
// where nats-server fsyncs and Redis does not.
func asynqTarget(mode string) float64 {
	if mode == ModeFast.Name {
		return 2
	}
	return 0
}

// median of v (v is reordered).
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	if n := len(v); n%2 == 1 {
		return v[n/2]
	} else {
		return (v[n/2-1] + v[n/2]) / 2
	}
}

// WriteSummary prints the side-by-side table of every mode and topology,
// with the targets' verdicts.
func (s *Suite) WriteSummary(w io.Writer) error {
	fmt.Fprintf(w, "\n==================== summary: relay vs mlsched per mode ====================\n")
	fmt.Fprintf(w, "%d CPUs (%s); load average at start %s, at end %s\n", s.Machine.NProc, s.Machine.CPU, s.Machine.LoadAvg, s.LoadAvgEnd)
	if len(s.Reports) > 0 {
		o := s.Reports[0].Options
		fmt.Fprintf(w, "throughput phase %d tasks; latency at %d/s over %d tasks; %d nodes x %d no-op models, concurrency %d\n",
			o.Tasks, o.Rate, o.LatencyTasks, o.Nodes, o.Models, o.Concurrency)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\tservers\tround\trelay tasks/s\tmlsched tasks/s\tratio\trelay p50 ms\tmlsched p50 ms\tratio\trelay p99 ms\tmlsched p99 ms\tratio\tdisp+workers µs/task\tnats µs/task (relay / mlsched)\tvs 1 server\triver tasks/s\tmlsched/river\tasynq tasks/s\tmlsched/asynq\t")
	verdict := func(v, target float64, atLeast bool) string {
		if target == 0 || v == 0 {
			return fmt.Sprintf("%.2fx", v)
		}
		ok := (atLeast && v >= target) || (!atLeast && v <= target)
		cmp, word := "<=", "met"
		if atLeast {
			cmp = ">="
		}
		if !ok {
			word = "MISSED"
		}
		return fmt.Sprintf("%.2fx (%s%.2g %s)", v, cmp, target, word)
	}
	for _, r := range append(s.Summary(), s.Medians()...) {
		round := fmt.Sprint(r.Round)
		if r.Rounds > 0 {
			round = fmt.Sprintf("median of %d", r.Rounds)
		}
		cpu := fmt.Sprintf("%.0f", r.CPUPerTask)
		if r.Targets.CPUPerTaskMicros > 0 && r.CPUPerTask > 0 {
			word := "met"
			if r.CPUPerTask > r.Targets.CPUPerTaskMicros {
				word = "MISSED"
			}
			cpu += fmt.Sprintf(" (<=%.0f %s)", r.Targets.CPUPerTaskMicros, word)
		}
		vs := "-"
		if r.Topology != topologyName(0) {
			vs = fmt.Sprintf("%.2fx", r.MlsTputVsOneServer)
		}
		river, riverRatio := "-", "-"
		if r.RiverTput > 0 {
			river, riverRatio = fmt.Sprintf("%.0f", r.RiverTput), verdict(r.RiverRatio, riverTarget(r.Mode), true)
		}
		asynqT, asynqRatio := "-", "-"
		if r.AsynqTput > 0 {
			asynqT, asynqRatio = fmt.Sprintf("%.0f", r.AsynqTput), verdict(r.AsynqRatio, asynqTarget(r.Mode), true)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.0f\t%.0f\t%s\t%.2f\t%.2f\t%s\t%.2f\t%.2f\t%s\t%s\t%.0f / %.0f\t%s\t%s\t%s\t%s\t%s\t\n",
			r.Mode, r.Topology, round, r.RelayTput, r.MlsTput, verdict(r.TputRatio, r.Targets.ThroughputRatio, true),
			r.RelayP50, r.MlsP50, verdict(r.P50Ratio, r.Targets.P50Ratio, false),
			r.RelayP99, r.MlsP99, verdict(r.P99Ratio, r.Targets.P99Ratio, false),
			cpu, r.RelayNATSCPU, r.NATSCPUPerTask, vs, river, riverRatio, asynqT, asynqRatio)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range s.Summary() {
		if len(r.Overloaded) > 0 {
			fmt.Fprintf(w, "note: %s, %s: %s overloaded at the latency phase's rate: its latencies are mostly queueing\n",
				r.Mode, r.Topology, strings.Join(r.Overloaded, " and "))
		}
	}
	fmt.Fprintln(w, "targets apply to one server (issue 13); the R3 rows report the cost of replication. Never asserted: the machine may be shared.")
	if len(s.Medians()) > 0 {
		fmt.Fprintln(w, "with several rounds, judge the targets by the median rows: each ratio is taken against the relay of its own round, then the median over the rounds.")
	}
	if err := s.writeDeadlines(w); err != nil {
		return err
	}
	return s.writeAuthCosts(w)
}

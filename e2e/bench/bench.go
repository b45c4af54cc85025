// Package bench measures mlsched end to end against a pass-through relay
// over the same JetStream streams, in one run: throughput, submit-to-result
// latency at a fixed offered load, CPU time per process and dispatcher
// memory. Each scenario gets fresh nats-server (file storage, sync_interval
// always, as in production) and redis-server processes on free loopback
// ports. The mlsched-bench command (e2e/cmd/mlsched-bench, `make bench`)
// drives it.
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/mlsched/mlsched/e2e/harness"
)

// Scenario names.
const (
	ScenarioRelay   = "relay"
	ScenarioMlsched = "mlsched"
)

// Options configure a run. Zero fields get the defaults.
type Options struct {
	// Tasks in the throughput phase (default 20000).
	Tasks int `json:"tasks"`
	// LatencyTasks in the fixed-rate phase (default: Tasks).
	LatencyTasks int `json:"latency_tasks"`
	// Warmup tasks run before anything is measured (default 1000).
	Warmup int `json:"warmup"`
	// Payload is the size in bytes of each task's payload value (default 256).
	Payload int `json:"payload_bytes"`
	// Nodes is the number of worker nodes, or sinks (default 4).
	Nodes int `json:"nodes"`
	// Models hosted by every node, each a no-op go model (default 4).
	Models int `json:"models"`
	// Policy is the dispatcher's MLSCHED_POLICY (default reliability).
	Policy string `json:"policy"`
	// Rate is the offered load of the latency phase in tasks/s (default 5000).
	Rate int `json:"rate"`
	// Concurrency is each worker's MLSCHED_CONCURRENCY and each sink's
	// MaxAckPending (default 64).
	Concurrency int `json:"concurrency"`
	// Trace adds core-NATS observers of the dispatch, outcome and result
	// subjects to time every hop (default off: the copies cost the server).
	Trace bool `json:"trace"`
	// SyncInterval is nats-server's jetstream sync_interval (default
	// "always", as in production: an fsync per write).
	SyncInterval string `json:"sync_interval"`
	// ClusterNodes > 0 runs a cluster of that many nats-server processes
	// (routes on loopback, no proxies) with streams of as many replicas,
	// instead of one server (default 0: one server, R1).
	ClusterNodes int `json:"cluster_nodes,omitempty"`
	// DispatcherEnv and WorkerEnv add MLSCHED_* variables to the
	// dispatcher's and the workers' environment, to measure a setting
	// (default none).
	DispatcherEnv map[string]string `json:"dispatcher_env,omitempty"`
	WorkerEnv     map[string]string `json:"worker_env,omitempty"`
	// Observers is, in the mlsched-observed scenario, the number of
	// dashboard event streams held open (half never read) and of /metrics
	// scrapers running back to back (default 8).
	Observers int `json:"observers,omitempty"`
	// ScrapeInterval is each observer scraper's period (default 1s: a
	// Prometheus scrapes every 15s or so).
	ScrapeInterval time.Duration `json:"scrape_interval_ns,omitempty"`
	// Scenarios to run, in order (default relay then mlsched; relay-auth
	// and mlsched-auth run them with authorization, see ScenarioMlschedAuth).
	Scenarios []string `json:"scenarios"`
	// ProfilePath, when set, receives a CPU profile of the dispatcher over
	// the mlsched scenario's measured phases: back-to-back windows of
	// ProfileSeconds, merged (default: none). The first worker's goes next
	// to it, with ".worker" before the extension; each scenario's bench
	// driver and (on one server) nats-server, with ".<scenario>.driver" and
	// ".<scenario>.nats".
	ProfilePath string `json:"profile_path,omitempty"`
	// Round is which round of a suite this run is (1-based; 0: one run).
	Round int `json:"round,omitempty"`
	// ProfileSeconds is the length of one profile window (default 20).
	ProfileSeconds int `json:"profile_seconds,omitempty"`
	// RelayCommand runs the relay process; "-nats URL -nodes a,b,..."
	// is appended (required for the relay scenario).
	RelayCommand []string `json:"-"`
	// Dir holds the servers' stores and every process log (default: a
	// temporary directory, removed at the end).
	Dir string `json:"-"`
	// TraceFile, when set, replaces the mlsched scenario's throughput and
	// latency phases by a replay of this request log's arrivals (a CSV:
	// TraceTimeColumn, default TIMESTAMP, and TraceSizeColumn, default
	// none), TraceSpeed times faster (default 20), each task carrying its
	// size. The workers then host sim models whose latency grows with size
	// (modelsFile). TraceTasks > 0 keeps the first so many rows.
	TraceFile       string  `json:"trace_file,omitempty"`
	TraceSpeed      float64 `json:"trace_speed,omitempty"`
	TraceTimeColumn string  `json:"trace_time_column,omitempty"`
	TraceSizeColumn string  `json:"trace_size_column,omitempty"`
	TraceTasks      int     `json:"trace_tasks,omitempty"`
	// Deadlines, when its second figure is > 0, gives every task a
	// deadline_ms drawn uniformly in [Deadlines[0], Deadlines[1]] (default
	// none: the dispatcher's default deadline); failed counts the tasks
	// that missed theirs.
	Deadlines [2]int `json:"deadlines_ms,omitempty"`
	// Dispatchers is how many dispatcher replicas mlsched runs (default 1).
	Dispatchers int `json:"dispatchers,omitempty"`
	// Progress receives one line per step (default: discarded).
	Progress io.Writer `json:"-"`
}

// groupCommit is whether the dispatcher and the producer group-commit
// (MLSCHED_GROUP_COMMIT): as an operator would set it, on when nats-server
// fsyncs every write (sync_interval always), off when it syncs lazily, where
// a batch (staged and synced on its own) costs more than it saves;
// DispatcherEnv overrides it.
func (o Options) groupCommit() bool {
	if v, ok := o.DispatcherEnv["MLSCHED_GROUP_COMMIT"]; ok {
		on, err := strconv.ParseBool(v)
		return err == nil && on
	}
	return o.withDefaults().SyncInterval == "always"
}

func (o Options) withDefaults() Options {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&o.Tasks, 20000)
	def(&o.LatencyTasks, o.Tasks)
	if o.Warmup < 0 {
		o.Warmup = 0
	} else if o.Warmup == 0 {
		o.Warmup = 1000
	}
	def(&o.Payload, 256)
	def(&o.Nodes, 4)
	def(&o.Models, 4)
	def(&o.Rate, 5000)
	def(&o.Concurrency, 64)
	def(&o.ProfileSeconds, 20)
	def(&o.Observers, 8)
	def(&o.Dispatchers, 1)
	if o.TraceSpeed <= 0 {
		o.TraceSpeed = 20
	}
	if o.TraceTimeColumn == "" {
		o.TraceTimeColumn = "TIMESTAMP"
	}
	if o.ScrapeInterval <= 0 {
		o.ScrapeInterval = time.Second
	}
	if o.SyncInterval == "" {
		o.SyncInterval = "always"
	}
	if o.Policy == "" {
		o.Policy = "reliability"
	}
	if len(o.Scenarios) == 0 {
		o.Scenarios = []string{ScenarioRelay, ScenarioMlsched}
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	return o
}

// replicas is the stream replica count: the cluster's size, or 1.
func (o Options) replicas() int { return max(1, o.ClusterNodes) }

// ErrUnknownScenario is returned for a scenario name Run does not know.
var ErrUnknownScenario = errors.New("unknown scenario")

// Report is everything one run measured; it is written as JSON.
type Report struct {
	Date    time.Time `json:"date"`
	Machine Machine   `json:"machine"`
	// Command is the command line that produced the report.
	Command string  `json:"command"`
	Options Options `json:"options"`
	// Storage describes the JetStream storage of every stream.
	Storage   string     `json:"storage"`
	Scenarios []Scenario `json:"scenarios"`
	// ThroughputRatio is mlsched's throughput over the relay's (0 when
	// either did not run).
	ThroughputRatio float64 `json:"throughput_ratio,omitempty"`
	// P50Ratio and P99Ratio are mlsched's latency percentiles at the fixed
	// rate over the relay's.
	P50Ratio float64 `json:"p50_ratio,omitempty"`
	P99Ratio float64 `json:"p99_ratio,omitempty"`
	// ObservedThroughputRatio is the throughput of mlsched-observed over
	// mlsched's, and ObservedP99Ratio the same for the latency phase's p99:
	// what dashboards and scrapers cost.
	ObservedThroughputRatio float64 `json:"observed_throughput_ratio,omitempty"`
	ObservedP99Ratio        float64 `json:"observed_p99_ratio,omitempty"`
	// RiverRatio is mlsched's throughput over River's on Postgres, in
	// the same run (issue 24: at least 1 in durable mode).
	RiverRatio float64 `json:"river_throughput_ratio,omitempty"`
	// AsynqRatio is mlsched's throughput over asynq's on Redis without
	// persistence, in the same run (issue 46: at least 2 in fast mode).
	AsynqRatio float64 `json:"asynq_throughput_ratio,omitempty"`
	// BatchRatio is digits-batch's throughput over digits', in this run:
	// what dynamic batching buys on a model with a fixed cost per call.
	BatchRatio float64 `json:"batch_throughput_ratio,omitempty"`
	// AuthCost compares relay-auth and mlsched-auth with relay and mlsched
	// (when both of a pair ran): what authorization costs.
	AuthCost []AuthCost `json:"auth_cost,omitempty"`
	Profile  *Profile   `json:"profile,omitempty"`
	// WorkerProfile is the first worker's CPU profile over the same phases.
	WorkerProfile *Profile `json:"worker_profile,omitempty"`
	// OtherProfiles are each scenario's nats-server (one server only) and
	// bench driver profiles over the same phases, for comparing where the
	// relay's and mlsched's CPU goes.
	OtherProfiles []*Profile `json:"other_profiles,omitempty"`
}

// Machine describes where the run happened.
type Machine struct {
	NProc int    `json:"nproc"`
	CPU   string `json:"cpu"`
	Go    string `json:"go"`
	OS    string `json:"os"`
	// LoadAvg is /proc/loadavg at the start: the machine may be shared.
	LoadAvg string `json:"loadavg"`
}

// Scenario is one system under test.
type Scenario struct {
	Name string `json:"name"`
	// PublishesPerTask is the number of JetStream publishes a task costs.
	PublishesPerTask int   `json:"publishes_per_task"`
	Warmup           Phase `json:"warmup"`
	Throughput       Phase `json:"throughput"`
	Latency          Phase `json:"latency"`
	// Memory of the long-lived processes over the measured phases.
	Memory map[string]Memory `json:"memory"`
	// Observers are the watching clients of the mlsched-observed scenario.
	Observers *ObserverStats `json:"observers,omitempty"`
	// Dispatched counts attempts per model over the whole scenario, from
	// the dispatcher's stats report (mlsched only).
	Dispatched map[string]int64 `json:"dispatched,omitempty"`
	// Trace is the trace replay (Options.TraceFile), instead of the
	// throughput and latency phases.
	Trace *TraceResult `json:"trace,omitempty"`
	// ServerMsgs is nats-server's own count of messages and bytes per task
	// over the throughput phase (one server only).
	ServerMsgs *ServerMsgs `json:"server_msgs,omitempty"`
}

// Phase is one batch of tasks.
type Phase struct {
	Tasks int `json:"tasks"`
	// OfferedRate is the submission rate achieved (tasks/s).
	OfferedRate float64 `json:"offered_rate"`
	// Seconds from the first submission to the last completion.
	Seconds float64 `json:"seconds"`
	// Throughput is Tasks/Seconds.
	Throughput float64 `json:"throughput"`
	Latency    Latency `json:"latency"`
	// Failed counts tasks whose result was not "succeeded".
	Failed int64 `json:"failed"`
	// FailedBy breaks Failed down by the result's error code and its last
	// attempt's status ("expired/expired": the deadline passed on the
	// worker before the model started; "expired/none": before any
	// dispatch), so that a deadline run says where its late tasks waited.
	FailedBy map[string]int64 `json:"failed_by,omitempty"`
	// Duplicates counts results beyond a task's first seen in the phase
	// (every task has exactly one result: 0).
	Duplicates int64 `json:"duplicates"`
	// With deadlines: Late says where each failed task's time went and
	// why it was late (late.go), LateBy counts them by why, and RunP50Ms
	// is the median run (latency less batch wait) of the successes, which
	// stands for the run of a late attempt that did not run.
	Late     []LateTask       `json:"late,omitempty"`
	LateBy   map[string]int64 `json:"late_by,omitempty"`
	RunP50Ms float64          `json:"run_p50_ms,omitempty"`
	// CPU seconds used during the phase, per process (workers summed).
	CPU map[string]float64 `json:"cpu_seconds"`
	// Hops splits the latency by hop (with Options.Trace).
	Hops []Hop `json:"hops,omitempty"`
}

// Hop is the latency between two observation points of a task: when the
// server received a message that carries it (core-NATS observer), or its
// submission and completion.
type Hop struct {
	Name    string  `json:"name"`
	Latency Latency `json:"latency"`
}

// Memory is a process's resident set size once ready (before the warm-up),
// at the start of the measured phases (after the warm-up), at its peak and
// at the end, in MiB.
type Memory struct {
	ReadyMiB float64 `json:"ready_mib"`
	StartMiB float64 `json:"start_mib"`
	PeakMiB  float64 `json:"peak_mib"`
	EndMiB   float64 `json:"end_mib"`
}

// Profile is one process's CPU profile.
type Profile struct {
	// Who names the process: "dispatcher", "worker (node-1)", or a
	// scenario's "nats-server" and "bench driver".
	Who  string `json:"who,omitempty"`
	Path string `json:"path"`
	// Seconds covered: the windows' total, which can exceed the phases.
	Seconds int `json:"seconds"`
	// Top is `go tool pprof -top` output (empty if the tool failed).
	Top string `json:"top,omitempty"`
}

// Run runs the scenarios one after the other, each on fresh servers.
func Run(ctx context.Context, o Options) (*Report, error) {
	o = o.withDefaults()
	for _, s := range o.Scenarios {
		if !slices.Contains([]string{ScenarioRelay, ScenarioMlsched, ScenarioObserved, ScenarioRelayAuth, ScenarioMlschedAuth, ScenarioRiver,
			ScenarioAsynq, ScenarioDigits, ScenarioDigitsBatch}, s) {
			return nil, fmt.Errorf("%w %q (want %s, %s, %s, %s, %s, %s, %s, %s or %s)", ErrUnknownScenario, s,
				ScenarioRelay, ScenarioMlsched, ScenarioObserved, ScenarioRelayAuth, ScenarioMlschedAuth, ScenarioRiver,
				ScenarioAsynq, ScenarioDigits, ScenarioDigitsBatch)
		}
		if base, _ := authScenario(s); base == ScenarioRelay && len(o.RelayCommand) == 0 {
			return nil, errors.New("bench: the relay scenario needs Options.RelayCommand")
		}
	}
	dir := o.Dir
	if dir == "" {
		d, err := os.MkdirTemp("", "mlsched-bench-*")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	rep := &Report{Date: time.Now().UTC(), Machine: machine(), Options: o,
		Storage: "file, nats-server sync_interval: " + o.SyncInterval}
	if o.SyncInterval == "always" {
		rep.Storage += " (an fsync per write, as in production; mlsched's dispatch and outcome streams in memory, MLSCHED_ATTEMPT_STORAGE's default)"
	} else {
		rep.Storage += " (NOT production: acknowledged writes can be lost if the machine dies)"
	}
	if o.ClusterNodes > 0 {
		rep.Storage += fmt.Sprintf("; a %d-server cluster, streams R%d", o.ClusterNodes, o.ClusterNodes)
	} else {
		rep.Storage += "; one server, streams R1"
	}
	for _, name := range o.Scenarios {
		if name == ScenarioRiver && o.ClusterNodes > 0 {
			fmt.Fprintf(o.Progress, "== scenario %s skipped: one Postgres server, compared with one nats-server only\n", name)
			continue
		}
		if name == ScenarioAsynq && o.ClusterNodes > 0 {
			fmt.Fprintf(o.Progress, "== scenario %s skipped: one redis-server, compared with one nats-server only\n", name)
			continue
		}
		fmt.Fprintf(o.Progress, "== scenario %s\n", name)
		var (
			s     Scenario
			profs []*Profile
			err   error
		)
		switch name {
		case ScenarioRiver:
			s, err = runRiver(ctx, o, filepath.Join(dir, name))
		case ScenarioAsynq:
			s, err = runAsynq(ctx, o, filepath.Join(dir, name))
		default:
			s, profs, err = runScenario(ctx, o, name, filepath.Join(dir, name))
		}
		if err != nil {
			return rep, fmt.Errorf("scenario %s: %w", name, err)
		}
		rep.Scenarios = append(rep.Scenarios, s)
		for _, p := range profs {
			switch p.Who {
			case "dispatcher":
				rep.Profile = p
			case "worker (node-1)":
				rep.WorkerProfile = p
			default:
				rep.OtherProfiles = append(rep.OtherProfiles, p)
			}
		}
	}
	if obs := rep.Scenario(ScenarioObserved); obs != nil {
		if mls := rep.Scenario(ScenarioMlsched); mls != nil && mls.Throughput.Throughput > 0 {
			rep.ObservedThroughputRatio = obs.Throughput.Throughput / mls.Throughput.Throughput
			if mls.Latency.Latency.P99 > 0 {
				rep.ObservedP99Ratio = obs.Latency.Latency.P99 / mls.Latency.Latency.P99
			}
		}
	}
	rep.AuthCost = rep.authCosts()
	relay, mls := rep.Scenario(ScenarioRelay), rep.Scenario(ScenarioMlsched)
	if rv := rep.Scenario(ScenarioRiver); rv != nil && mls != nil && rv.Throughput.Throughput > 0 {
		rep.RiverRatio = mls.Throughput.Throughput / rv.Throughput.Throughput
	}
	if aq := rep.Scenario(ScenarioAsynq); aq != nil && mls != nil && aq.Throughput.Throughput > 0 {
		rep.AsynqRatio = mls.Throughput.Throughput / aq.Throughput.Throughput
	}
	if d, db := rep.Scenario(ScenarioDigits), rep.Scenario(ScenarioDigitsBatch); d != nil && db != nil && d.Throughput.Throughput > 0 {
		rep.BatchRatio = db.Throughput.Throughput / d.Throughput.Throughput
	}
	if relay != nil && mls != nil {
		if relay.Throughput.Throughput > 0 {
			rep.ThroughputRatio = mls.Throughput.Throughput / relay.Throughput.Throughput
		}
		if relay.Latency.Latency.P50 > 0 {
			rep.P50Ratio = mls.Latency.Latency.P50 / relay.Latency.Latency.P50
		}
		if relay.Latency.Latency.P99 > 0 {
			rep.P99Ratio = mls.Latency.Latency.P99 / relay.Latency.Latency.P99
		}
	}
	return rep, nil
}

// Scenario returns the named scenario's results, or nil.
func (r *Report) Scenario(name string) *Scenario {
	i := slices.IndexFunc(r.Scenarios, func(s Scenario) bool { return s.Name == name })
	if i < 0 {
		return nil
	}
	return &r.Scenarios[i]
}

func machine() Machine {
	m := Machine{NProc: runtime.NumCPU(), Go: runtime.Version(), OS: runtime.GOOS + "/" + runtime.GOARCH}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) >= 3 {
			m.LoadAvg = strings.Join(f[:3], " ")
		}
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	return m
}

// binary is harness.BinaryPath, kept as a variable for the error message.
func binary(name string) (string, error) {
	p, err := harness.BinaryPath(name)
	if err != nil {
		return "", fmt.Errorf("binary %s: %w", name, err)
	}
	return p, nil
}

package bench

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// The authorization scenarios run relay and mlsched again with the
// nats-server configuration including the auth.conf `mlsched auth init`
// writes, and every process on its role's nkey: the dispatcher, each worker
// on its node's key, the producer on the producer's key, the results reader
// on the admin's; the relay on the dispatcher's (the same grants on the same
// streams) and each relay sink on its node's key. Against the open
// scenarios in the same run they measure what authentication and the
// server's permission checks cost.
const (
	ScenarioRelayAuth   = "relay-auth"
	ScenarioMlschedAuth = "mlsched-auth"
)

// authScenario reports whether name is an authorization scenario, and the
// open scenario it is the counterpart of.
func authScenario(name string) (base string, auth bool) {
	switch name {
	case ScenarioRelayAuth:
		return ScenarioRelay, true
	case ScenarioMlschedAuth:
		return ScenarioMlsched, true
	}
	return name, false
}

// AuthCost compares a system with authorization to the same system open, in
// the same run: ratios are auth over open (throughput below 1 and latency
// or CPU above 1 are the cost).
type AuthCost struct {
	// System is relay or mlsched.
	System string `json:"system"`
	// OpenThroughput and AuthThroughput are the throughput phase's tasks/s.
	OpenThroughput  float64 `json:"open_throughput"`
	AuthThroughput  float64 `json:"auth_throughput"`
	ThroughputRatio float64 `json:"throughput_ratio"`
	// OpenP50, AuthP50, OpenP99, AuthP99 are the latency phase's, in ms.
	OpenP50  float64 `json:"open_p50_ms"`
	AuthP50  float64 `json:"auth_p50_ms"`
	P50Ratio float64 `json:"p50_ratio"`
	OpenP99  float64 `json:"open_p99_ms"`
	AuthP99  float64 `json:"auth_p99_ms"`
	P99Ratio float64 `json:"p99_ratio"`
	// OpenCPU and AuthCPU are the system's own processes' CPU (relay; or
	// dispatcher and workers) in µs per task in the throughput phase.
	OpenCPU  float64 `json:"open_cpu_us_per_task"`
	AuthCPU  float64 `json:"auth_cpu_us_per_task"`
	CPURatio float64 `json:"cpu_ratio"`
	// OpenNATSCPU and AuthNATSCPU are the nats-server processes' CPU in µs
	// per task in the throughput phase: where permission checks are paid.
	OpenNATSCPU  float64 `json:"open_nats_cpu_us_per_task"`
	AuthNATSCPU  float64 `json:"auth_nats_cpu_us_per_task"`
	NATSCPURatio float64 `json:"nats_cpu_ratio"`
}

// authCosts compares each authorization scenario of the report with its
// open counterpart, when both ran.
func (r *Report) authCosts() []AuthCost {
	var out []AuthCost
	for _, name := range []string{ScenarioRelayAuth, ScenarioMlschedAuth} {
		base, _ := authScenario(name)
		open, auth := r.Scenario(base), r.Scenario(name)
		if open == nil || auth == nil {
			continue
		}
		own := func(k string) bool { return k == "relay" || k == "dispatcher" || strings.HasPrefix(k, "workers") }
		isNATS := func(k string) bool { return strings.HasPrefix(k, "nats-server") }
		c := AuthCost{System: base,
			OpenThroughput: open.Throughput.Throughput, AuthThroughput: auth.Throughput.Throughput,
			OpenP50: open.Latency.Latency.P50, AuthP50: auth.Latency.Latency.P50,
			OpenP99: open.Latency.Latency.P99, AuthP99: auth.Latency.Latency.P99,
			OpenCPU: perTaskCPU(open, own), AuthCPU: perTaskCPU(auth, own),
			OpenNATSCPU: perTaskCPU(open, isNATS), AuthNATSCPU: perTaskCPU(auth, isNATS)}
		c.ThroughputRatio = ratioOf(c.AuthThroughput, c.OpenThroughput)
		c.P50Ratio, c.P99Ratio = ratioOf(c.AuthP50, c.OpenP50), ratioOf(c.AuthP99, c.OpenP99)
		c.CPURatio, c.NATSCPURatio = ratioOf(c.AuthCPU, c.OpenCPU), ratioOf(c.AuthNATSCPU, c.OpenNATSCPU)
		out = append(out, c)
	}
	return out
}

func ratioOf(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return a / b
}

// perTaskCPU is the CPU of the processes match selects in the throughput
// phase, in µs per task.
func perTaskCPU(sc *Scenario, match func(string) bool) float64 {
	if sc == nil || sc.Throughput.Tasks == 0 {
		return 0
	}
	sum := 0.0
	for k, v := range sc.Throughput.CPU {
		if match(k) {
			sum += v
		}
	}
	return sum * 1e6 / float64(sc.Throughput.Tasks)
}

// writeAuthCosts prints the authorization cost of every report that ran an
// authorization scenario next to its open counterpart; nothing otherwise.
func (s *Suite) writeAuthCosts(w io.Writer) error {
	type row struct {
		mode, topo string
		c          AuthCost
	}
	var rows []row
	for _, r := range s.Reports {
		for _, c := range r.AuthCost {
			rows = append(rows, row{ModeOf(r.Options.SyncInterval).Name, topologyName(r.Options.ClusterNodes), c})
		}
	}
	if len(rows) == 0 {
		return nil
	}
	fmt.Fprintf(w, "\n==================== authorization cost: every process on its role's nkey (mlsched auth init) vs open, same run ====================\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\tservers\tsystem\topen tasks/s\tauth tasks/s\tratio\topen p50 ms\tauth p50 ms\tratio\topen p99 ms\tauth p99 ms\tratio\tprocesses µs/task (open / auth)\tratio\tnats µs/task (open / auth)\tratio\t")
	for _, r := range rows {
		c := r.c
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.0f\t%.0f\t%.2fx\t%.2f\t%.2f\t%.2fx\t%.2f\t%.2f\t%.2fx\t%.0f / %.0f\t%.2fx\t%.0f / %.0f\t%.2fx\t\n",
			r.mode, r.topo, c.System, c.OpenThroughput, c.AuthThroughput, c.ThroughputRatio,
			c.OpenP50, c.AuthP50, c.P50Ratio, c.OpenP99, c.AuthP99, c.P99Ratio,
			c.OpenCPU, c.AuthCPU, c.CPURatio, c.OpenNATSCPU, c.AuthNATSCPU, c.NATSCPURatio)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "processes: relay, or dispatcher + workers. Ratios are auth over open; one run each on a possibly shared machine, so differences of a few percent are noise.")
	return nil
}

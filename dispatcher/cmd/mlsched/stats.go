package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mlsched/mlsched/shared/protocol"
)

func runStats(ctx context.Context, a *app, args []string) error {
	fs := a.newFlags("stats", "stats [-json] [-all]")
	raw := fs.Bool("json", false, "print the raw StatsReport JSON, one line per dispatcher")
	all := fs.Bool("all", false, "collect the answer of every dispatcher replica, not just the first")
	gather := fs.Duration("gather", time.Second, "with -all, how long to collect answers")
	if err := a.parseAndConnect(fs, args); err != nil {
		return err
	}
	wait := a.timeout
	if *all {
		wait = min(wait, *gather)
	}
	reports, err := a.requestStats(ctx, *all, wait)
	if err != nil {
		return err
	}
	for i, r := range reports {
		if *raw {
			if _, err := a.stdout.Write(append(r.raw, '\n')); err != nil {
				return err
			}
			continue
		}
		if i > 0 {
			fmt.Fprintln(a.stdout)
		}
		if r.err != nil {
			fmt.Fprintf(a.stdout, "malformed stats report (%v): %.200s\n", r.err, r.raw)
			continue
		}
		renderStats(a.stdout, r.report, time.Now())
	}
	return nil
}

type statsReply struct {
	raw    []byte
	report protocol.StatsReport
	err    error // the reply is not a StatsReport
}

// requestStats sends one request on SubjectAdminStats and gathers the first
// reply, or with all every reply that arrives within wait.
func (a *app) requestStats(ctx context.Context, all bool, wait time.Duration) ([]statsReply, error) {
	inbox := a.nc.NewRespInbox()
	sub, err := a.nc.SubscribeSync(inbox)
	if err != nil {
		return nil, err
	}
	defer sub.Unsubscribe()
	if err := a.nc.PublishRequest(protocol.SubjectAdminStats, inbox, nil); err != nil {
		return nil, fmt.Errorf("stats request: %w", err)
	}
	cx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	var out []statsReply
	for {
		m, err := sub.NextMsgWithContext(cx)
		if errors.Is(err, nats.ErrNoResponders) {
			return nil, fmt.Errorf("no dispatcher is listening on %s: %w", protocol.SubjectAdminStats, err)
		}
		if err != nil {
			if len(out) > 0 && errors.Is(err, context.DeadlineExceeded) {
				return out, nil
			}
			if errors.Is(err, context.DeadlineExceeded) {
				return nil, fmt.Errorf("no dispatcher answered on %s within %s", protocol.SubjectAdminStats, wait)
			}
			return out, err
		}
		if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
			return nil, fmt.Errorf("no dispatcher is listening on %s: %w", protocol.SubjectAdminStats, nats.ErrNoResponders)
		}
		r := statsReply{raw: m.Data}
		r.err = json.Unmarshal(m.Data, &r.report)
		out = append(out, r)
		if !all {
			return out, nil
		}
	}
}

// renderStats prints a report as a human-readable table.
func renderStats(w io.Writer, r protocol.StatsReport, now time.Time) {
	mode := "normal"
	if r.Degraded {
		mode = "DEGRADED"
		if r.DegradedReason != "" {
			mode += " (" + r.DegradedReason + ")"
		}
	}
	fmt.Fprintf(w, "dispatcher %s  store=%s  mode=%s  buffered=%d  dropped=%d\n", r.Dispatcher, r.Store, mode, r.Buffered, r.Dropped)
	age := "never"
	if !r.SnapshotAt.IsZero() {
		age = now.Sub(r.SnapshotAt).Round(time.Millisecond).String() + " ago"
	}
	fmt.Fprintf(w, "snapshot %s  window=%s  nodes=%d  policies=%s\n", age, r.Window, len(r.Nodes), policies(r.Policies))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "MODEL\tDISPATCHED\tOK\tERRORS\tTIMEOUTS\tTASK-ERR\tLATE\tSUCCESS\tP50\tP95\tIN-FLIGHT\tBREAKER\tSHARE\t")
	models := append([]protocol.ModelReport(nil), r.Models...)
	sort.Slice(models, func(i, j int) bool { return models[i].Name < models[j].Name })
	for _, m := range models {
		breaker := m.Breaker
		if breaker == "" {
			breaker = "-"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%.1f%%\t%s\t%s\t%d\t%s\t%.1f%%\t\n", m.Name, m.Dispatched,
			m.Successes, m.ModelErrors, m.Timeouts, m.TaskErrors, m.Late, 100*m.SuccessRate,
			ms(m.P50Ms), ms(m.P95Ms), m.InFlight, breaker, 100*m.TrafficShare)
	}
	tw.Flush()
	if len(models) == 0 {
		fmt.Fprintln(w, "(no model statistics yet)")
	}
	for _, n := range r.Nodes {
		for _, u := range n.Unready {
			fmt.Fprintf(w, "unready %s on %s: %s (not announced: no task goes there)\n", u.Name, n.Node, oneLine(u.Reason, 100))
		}
	}
	if r.Backlog != nil {
		fmt.Fprintln(w, backlogLine(r.Backlog))
	}
	if r.Held > 0 {
		fmt.Fprintf(w, "held back now: %d tasks (every candidate's nodes saturated; see docs/policies.md)\n", r.Held)
	}
	if len(r.HeldBy) > 0 {
		fmt.Fprint(w, "held by band/tenant:")
		for _, h := range r.HeldBy {
			fmt.Fprintf(w, " %s/%s=%d", h.Band, h.Tenant, h.Held)
		}
		fmt.Fprintln(w)
	}
	renderFlow(w, r)
	renderQueueTargets(w, r.QueueTargets)
	renderCosts(w, r, now)
	renderRollouts(w, r.Rollouts, now)
	if r.QuotaDegraded != "" {
		fmt.Fprintf(w, "quotas DEGRADED: %s\n", oneLine(r.QuotaDegraded, 160))
	}
	if r.Unserved > 0 {
		fmt.Fprintf(w, "waiting for a node now: %d tasks (no live node serves their type; at most MLSCHED_UNSERVED_MAX)\n", r.Unserved)
	}
	if len(r.Counters) > 0 {
		keys := make([]string, 0, len(r.Counters))
		for k := range r.Counters {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		fmt.Fprint(w, "since start:")
		for _, k := range keys {
			fmt.Fprintf(w, " %s=%d", k, r.Counters[k])
		}
		fmt.Fprintln(w)
	}
}

func ms(v float64) string {
	if v <= 0 {
		return "-"
	}
	switch {
	case v >= 1000:
		return fmt.Sprintf("%.2fs", v/1000)
	case v >= 100:
		return fmt.Sprintf("%.0fms", v)
	case v >= 1:
		return fmt.Sprintf("%.1fms", v)
	default:
		return fmt.Sprintf("%.3fms", v)
	}
}

func policies(p map[string]string) string {
	if len(p) == 0 {
		return "-"
	}
	keys := make([]string, 0, len(p))
	for k := range p {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + ":" + p[k]
	}
	return strings.Join(parts, ",")
}

// renderFlow prints flow control per priority band: the tasks held now by
// tenant, and the tasks ended without starting (shed, expired,
// quota_exceeded) since the replica started (docs/policies.md, "Flow
// control").
func renderFlow(w io.Writer, r protocol.StatsReport) {
	if len(r.HeldBy) == 0 && len(r.EndedBy) == 0 {
		return
	}
	fmt.Fprintln(w, "flow control by band:")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  BAND\tHELD\tHELD BY TENANT\tSHED\tEXPIRED\tQUOTA_EXCEEDED\t")
	for _, band := range []string{"high", "normal", "low"} {
		held, tenants := 0, []string{}
		for _, h := range r.HeldBy {
			if h.Band == band {
				held += h.Held
				tenants = append(tenants, fmt.Sprintf("%s=%d", h.Tenant, h.Held))
			}
		}
		ended := map[protocol.Code]int64{}
		for _, e := range r.EndedBy {
			if e.Band == band {
				ended[e.Code] += e.Tasks
			}
		}
		if held == 0 && len(ended) == 0 {
			continue
		}
		by := strings.Join(tenants, " ")
		if by == "" {
			by = "-"
		}
		fmt.Fprintf(tw, "  %s\t%d\t%s\t%d\t%d\t%d\t\n", band, held, by, ended[protocol.CodeShed], ended[protocol.CodeExpired], ended[protocol.CodeQuotaExceeded])
	}
	tw.Flush()
}

// renderCosts prints the models' declared costs (from the nodes'
// heartbeats), what this replica's attempts cost since it started, and
// each budget's spending in its current period (shared by the replicas).
func renderCosts(w io.Writer, r protocol.StatsReport, now time.Time) {
	prices := map[string]string{}
	for _, n := range r.Nodes {
		for _, m := range n.Models {
			if m.CostPerTask > 0 || m.CostPerUnit > 0 {
				p := fmt.Sprintf("%g", m.CostPerTask)
				if m.CostPerUnit > 0 {
					p += fmt.Sprintf("+%g/unit", m.CostPerUnit)
				}
				if old, ok := prices[m.Name]; ok && old != p {
					p = "varies by node"
				}
				prices[m.Name] = p
			}
		}
	}
	if len(prices) > 0 {
		names := make([]string, 0, len(prices))
		for k := range prices {
			names = append(names, k)
		}
		sort.Strings(names)
		fmt.Fprint(w, "declared cost per attempt:")
		for _, k := range names {
			fmt.Fprintf(w, " %s=%s", k, prices[k])
		}
		fmt.Fprintln(w)
	}
	if c := r.Cost; c != nil {
		for _, part := range []struct {
			by string
			m  map[string]float64
		}{{"type", c.ByType}, {"model", c.ByModel}, {"tenant", c.ByTenant}} {
			keys := make([]string, 0, len(part.m))
			for k := range part.m {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			fmt.Fprintf(w, "cost since start by %s:", part.by)
			for _, k := range keys {
				fmt.Fprintf(w, " %s=%.4g", k, part.m[k])
			}
			fmt.Fprintln(w)
		}
	}
	if len(r.Budgets) == 0 {
		return
	}
	fmt.Fprintln(w, "budgets (every replica's spending, this period):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  BUDGET	SPENT	LIMIT	USED	PERIOD	RENEWS IN	AT LIMIT	")
	for _, b := range r.Budgets {
		used := 0.0
		if b.Limit > 0 {
			used = 100 * b.Spent / b.Limit
		}
		fmt.Fprintf(tw, "  %s:%s\t%.4g\t%.4g\t%.0f%%\t%s\t%s\t%s\t\n", b.Scope, b.Name, b.Spent, b.Limit, used, b.Period,
			max(0, b.Ends.Sub(now)).Round(time.Second), b.Action)
	}
	tw.Flush()
}

// renderQueueTargets prints each (model, node)'s queue target: how long
// a new attempt may wait plus run there before the replica holds the
// model's tasks back instead (docs/policies.md, "The queue target").
func renderQueueTargets(w io.Writer, ts []protocol.QueueTargetReport) {
	if len(ts) == 0 {
		return
	}
	fmt.Fprintln(w, "queue target by model and node (MLSCHED_QUEUE_TARGET):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  MODEL\tNODE\tSERVICE\tSAMPLES\tTARGET\tMODE\t")
	for _, t := range ts {
		target := ms(t.TargetMs)
		if t.Mode == "off" {
			target = "off"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\t%s\t%s\t\n", t.Model, t.Node, ms(t.ServiceMs), t.Samples, target, t.Mode)
	}
	tw.Flush()
}

// renderRollouts prints one line per model rollout the replica follows.
func renderRollouts(w io.Writer, rs []protocol.RolloutReport, now time.Time) {
	for _, ro := range rs {
		fmt.Fprintf(w, "rollout %s -> %s: %s, step %d/%d, share %.1f%%, new %d ok/%d failed/%d timeouts, incumbent %d/%d/%d, llr %.2f",
			ro.Family, ro.Model, ro.State, ro.Step+1, len(ro.Steps), ro.Share*100, ro.New.Successes, ro.New.Failures, ro.New.Timeouts,
			ro.Incumbent.Successes, ro.Incumbent.Failures, ro.Incumbent.Timeouts, ro.LLR)
		if ro.Verdict != "" {
			fmt.Fprintf(w, " (%s)", ro.Verdict)
		}
		if !ro.StepSince.IsZero() {
			fmt.Fprintf(w, ", at this step for %s", now.Sub(ro.StepSince).Round(time.Second))
		}
		if ro.LastTo != "" {
			fmt.Fprintf(w, "; last: %s %s ago: %s", ro.LastTo, now.Sub(ro.LastAt).Round(time.Second), oneLine(ro.LastReason, 100))
		}
		fmt.Fprintln(w)
	}
}

package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/mlsched/mlsched/dispatcher/clusterview"
)

func runTop(ctx context.Context, a *app, args []string) error {
	fs := a.newFlags("top", "top [-interval D] [-n N]")
	interval := fs.Duration("interval", 2*time.Second, "time between refreshes")
	count := fs.Int("n", 0, "stop after N refreshes (0: until interrupted)")
	dls := fs.Int("dead-letters", 5, "recent dead letters to show")
	if err := a.parseAndConnect(fs, args); err != nil {
		return err
	}
	if *interval <= 0 {
		fmt.Fprintln(a.stderr, "mlsched top: -interval must be positive")
		return errUsage
	}
	tty := isTerminal(a.stdout)
	if tty {
		fmt.Fprint(a.stdout, "\x1b[?25l") // hide the cursor while refreshing in place
		defer fmt.Fprint(a.stdout, "\x1b[?25h")
	}
	opt := clusterview.Options{Wait: min(a.timeout, max(*interval, time.Second)), DeadLetters: *dls}
	t := time.NewTicker(*interval)
	defer t.Stop()
	for i := 0; *count == 0 || i < *count; i++ {
		if i > 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
			}
		}
		var buf bytes.Buffer
		v, err := clusterview.Gather(ctx, a.nc, a.js, opt)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			fmt.Fprintf(&buf, "%s  %v\n", time.Now().Format(time.TimeOnly), err)
		} else {
			renderView(&buf, v, time.Now())
		}
		if tty {
			// Home, draw, clear what is left of the last frame.
			out := bytes.ReplaceAll(buf.Bytes(), []byte("\n"), []byte("\x1b[K\n"))
			fmt.Fprintf(a.stdout, "\x1b[H%s\x1b[J", out)
		} else {
			if i > 0 {
				fmt.Fprintln(a.stdout)
			}
			_, _ = a.stdout.Write(buf.Bytes())
		}
	}
	return nil
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// renderView prints the merged cluster view: what the dashboard shows.
func renderView(w io.Writer, v *clusterview.View, now time.Time) {
	status := "healthy"
	var open []string
	for _, m := range v.Models {
		if m.Breaker == "open" {
			open = append(open, m.Name)
		}
	}
	if un := v.UnreadyNames(); len(un) > 0 {
		status = "unready: " + strings.Join(un, ",")
	}
	if len(open) > 0 {
		status = "breaker open: " + strings.Join(open, ",")
	}
	if d := v.Degraded(); len(d) > 0 {
		names := make([]string, len(d))
		for i, r := range d {
			names[i] = r.Name
		}
		status = "DEGRADED: " + strings.Join(names, ",")
	}
	fmt.Fprintf(w, "mlsched top  %s  %d dispatcher(s)  %d node(s)  window=%s  %s\n", now.Format(time.TimeOnly),
		len(v.Replicas), len(v.Nodes), v.Window, status)
	c := v.Counters
	fmt.Fprintf(w, "results=%d dispatched=%d redispatched=%d waiting=%d dead_letters=%d cancelled=%d late=%d lost=%d\n",
		c["results"], c["dispatched"], c["redispatched"], v.BacklogTotal(), v.DeadLettersTotal, c["cancelled"], c["late"], c["lost"])
	if c["expired"]+c["shed_sheddable"]+c["over_quota"]+c["inversions"] > 0 {
		fmt.Fprintf(w, "flow control: expired=%d shed=%d over_quota=%d inversions=%d\n",
			c["expired"], c["shed_sheddable"], c["over_quota"], c["inversions"])
	}
	for _, p := range v.Problems {
		fmt.Fprintln(w, "problem:", p)
	}
	for _, r := range v.Degraded() {
		fmt.Fprintf(w, "degraded %s: %s\n", r.Name, r.DegradedReason)
	}
	for _, u := range v.Unready() {
		fmt.Fprintf(w, "unready %s on %s: %s\n", u.Model, u.Node, oneLine(u.Reason, 100))
	}

	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "MODEL\tDISPATCHED\tOK\tERRORS\tTIMEOUTS\tSUCCESS\tP50\tP95\tIN-FLIGHT\tBREAKER\tSHARE\t")
	for _, m := range v.Models {
		breaker := m.Breaker
		if breaker == "" {
			breaker = "-"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%.1f%%\t%s\t%s\t%d\t%s\t%.1f%%\t\n", m.Name, m.Dispatched, m.Successes,
			m.ModelErrors, m.Timeouts, 100*m.SuccessRate, ms(m.P50Ms), ms(m.P95Ms), m.InFlight, breaker, 100*m.TrafficShare)
	}
	tw.Flush()
	if len(v.Models) == 0 {
		fmt.Fprintln(w, "(no model statistics yet)")
	}

	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tLOAD\tIN-FLIGHT\tHEARTBEAT\tMODELS")
	for _, n := range v.Nodes {
		name := n.Name
		if n.Draining {
			name += " (draining)"
		}
		models := strings.Join(n.Models, ",")
		for _, u := range n.Unready {
			models += " " + u.Name + "(unready)"
		}
		fmt.Fprintf(tw, "%s\t%s %3.0f%%\t%d/%d\t%s ago\t%s\n", name, bar(n.Load, 10), 100*n.Load, n.InFlight, n.Capacity,
			now.Sub(n.SentAt).Round(100*time.Millisecond), models)
	}
	tw.Flush()
	if len(v.Nodes) == 0 {
		fmt.Fprintln(w, "(no live node)")
	}

	fmt.Fprintln(w)
	fmt.Fprintln(w, backlogLine(v.Backlog))

	if len(v.Autoscale) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "POOL\tREPLICAS\tRECOMMENDED\tNEEDED\tDECIDED\tWHY")
		for _, d := range v.Autoscale {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s ago\t%s\n", d.Pool, d.Current, d.Target, d.Needed,
				now.Sub(d.At).Round(time.Second), oneLine(d.Reason, 140))
		}
		tw.Flush()
	}

	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "DISPATCHER\tSTORE\tMODE\tSNAPSHOT")
	for _, r := range v.Replicas {
		mode := "normal"
		if r.Degraded {
			mode = "DEGRADED"
		}
		age := "never"
		if !r.SnapshotAt.IsZero() {
			age = now.Sub(r.SnapshotAt).Round(time.Millisecond).String() + " ago"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Name, r.Store, mode, age)
	}
	tw.Flush()

	if len(v.DeadLetters) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "DEAD LETTER\tWHEN\tKIND\tTASK\tCODE\tREASON")
		for _, d := range v.DeadLetters {
			task := d.TaskID
			if task == "" {
				task = "-"
			}
			fmt.Fprintf(tw, "%d\t%s ago\t%s\t%s\t%s\t%s\n", d.Seq, now.Sub(d.At).Round(time.Second), d.Kind, task, d.Code, oneLine(d.Reason, 100))
		}
		tw.Flush()
	}
}

// backlogLine prints the tasks waiting per type.
func backlogLine(b map[string]int64) string {
	types := make([]string, 0, len(b))
	for t, n := range b {
		if n > 0 {
			types = append(types, t)
		}
	}
	if len(types) == 0 {
		if b == nil {
			return "backlog: unknown"
		}
		return "backlog: nothing waiting"
	}
	sort.Strings(types)
	parts := make([]string, len(types))
	for i, t := range types {
		parts[i] = fmt.Sprintf("%s=%d", t, b[t])
	}
	return "backlog: " + strings.Join(parts, " ")
}

func bar(f float64, width int) string {
	n := int(f*float64(width) + 0.5)
	n = min(max(n, 0), width)
	return "[" + strings.Repeat("#", n) + strings.Repeat(".", width-n) + "]"
}

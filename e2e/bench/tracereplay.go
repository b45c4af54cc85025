package bench

import (
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Arrival is one request of a trace: when it arrived, relative to the
// trace's first, and its size (0: none).
type Arrival struct {
	At   time.Duration
	Size float64
}

// traceTimeLayout is the Azure traces' TIMESTAMP ("2023-11-16 18:17:03.9799600").
const traceTimeLayout = "2006-01-02 15:04:05.999999999"

// LoadTrace reads a request log's arrivals: its time column (TIMESTAMP as
// in the Azure LLM traces, or a number of seconds) and, when sizeColumn is
// not empty, each request's size. Rows come back in time order. limit > 0
// keeps the first limit rows.
func LoadTrace(path, timeColumn, sizeColumn string, limit int) ([]Arrival, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := csv.NewReader(f)
	head, err := r.Read()
	if err != nil {
		return nil, fmt.Errorf("trace %s: header: %w", path, err)
	}
	col := func(name string) (int, error) {
		for i, h := range head {
			if strings.EqualFold(strings.TrimSpace(h), name) {
				return i, nil
			}
		}
		return -1, fmt.Errorf("trace %s: no column %q (columns: %s)", path, name, strings.Join(head, ", "))
	}
	ti, err := col(timeColumn)
	if err != nil {
		return nil, err
	}
	si := -1
	if sizeColumn != "" {
		if si, err = col(sizeColumn); err != nil {
			return nil, err
		}
	}
	var out []Arrival
	var first time.Time
	var firstSec float64
	for line := 2; limit <= 0 || len(out) < limit; line++ {
		rec, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("trace %s: line %d: %w", path, line, err)
		}
		a := Arrival{}
		v := strings.TrimSpace(rec[ti])
		if sec, err := strconv.ParseFloat(v, 64); err == nil {
			if len(out) == 0 {
				firstSec = sec
			}
			a.At = time.Duration((sec - firstSec) * float64(time.Second))
		} else {
			t, err := time.Parse(traceTimeLayout, v)
			if err != nil {
				return nil, fmt.Errorf("trace %s: line %d: time %q is neither seconds nor %s", path, line, v, traceTimeLayout)
			}
			if len(out) == 0 {
				first = t
			}
			a.At = t.Sub(first)
		}
		if si >= 0 {
			if a.Size, err = strconv.ParseFloat(strings.TrimSpace(rec[si]), 64); err != nil || a.Size < 0 {
				return nil, fmt.Errorf("trace %s: line %d: size %q is not a number ≥ 0", path, line, rec[si])
			}
		}
		out = append(out, a)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("trace %s: no rows", path)
	}
	slices.SortStableFunc(out, func(x, y Arrival) int { return int(x.At - y.At) })
	if out[0].At < 0 { // rows out of order: measure from the earliest
		base := out[0].At
		for i := range out {
			out[i].At -= base
		}
	}
	return out, nil
}

// TraceResult is a trace replay: the latency of the whole trace and of its
// busiest and quietest minutes (of trace time, by arrivals).
type TraceResult struct {
	File    string  `json:"file"`
	Speed   float64 `json:"speed"`
	Tasks   int     `json:"tasks"`
	Minutes int     `json:"minutes"`
	// Duplicates counts results beyond the first of a task, Missing the
	// tasks without one: both must be 0.
	Duplicates int64         `json:"duplicates"`
	Missing    int64         `json:"missing"`
	All        Phase         `json:"all"`
	Busiest    TraceMinute   `json:"busiest"`
	Quietest   TraceMinute   `json:"quietest"`
	PerMinute  []TraceMinute `json:"per_minute"`
}

// TraceMinute is one minute of trace time.
type TraceMinute struct {
	Minute  int     `json:"minute"`
	Tasks   int     `json:"tasks"`
	Latency Latency `json:"latency"`
	Failed  int     `json:"failed"`
}

// replay offers the trace's tasks at their arrival times divided by speed,
// each carrying its size, and waits for every result.
func (r *run) replay(ctx context.Context, pub *publisher, arrivals []Arrival) (*TraceResult, error) {
	n := len(arrivals)
	tr := newTracker("tr-", n, 0)
	tr.failedAt = make([]atomic.Bool, n)
	r.tr.Store(tr)
	cpu0 := sampleCPU(r.cpu)
	speed := r.o.TraceSpeed
	pub.at = make([]time.Duration, n)
	pub.sizes = make([]float64, n)
	for i, a := range arrivals {
		pub.at[i] = time.Duration(float64(a.At) / speed)
		pub.sizes[i] = a.Size
	}
	defer func() { pub.at, pub.sizes = nil, nil }()
	if err := pub.run(ctx, tr, 0); err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	timeout := time.Minute + time.Duration(n)*time.Second/200
	select {
	case <-tr.all:
	case <-time.After(timeout):
		return nil, fmt.Errorf("trace: %d of %d tasks had no result %v after the last was offered", tr.remaining.Load(), n, timeout)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	res := &TraceResult{File: r.o.TraceFile, Speed: speed, Tasks: n, All: tr.phase(cpuDelta(cpu0, sampleCPU(r.cpu))),
		Duplicates: tr.again.Load(), Missing: tr.remaining.Load()}
	byMinute := map[int][]int{}
	for i, a := range arrivals {
		m := int(a.At / time.Minute)
		byMinute[m] = append(byMinute[m], i)
	}
	for m := range int(arrivals[n-1].At/time.Minute) + 1 {
		idx := byMinute[m]
		tm := TraceMinute{Minute: m, Tasks: len(idx)}
		var l []int64
		for _, i := range idx {
			if d := tr.done[i].Load(); d != 0 {
				l = append(l, d-tr.sent[i].Load())
			}
			if tr.failedAt[i].Load() {
				tm.Failed++
			}
		}
		tm.Latency = summarize(l)
		res.PerMinute = append(res.PerMinute, tm)
	}
	res.Minutes = len(res.PerMinute)
	res.Busiest, res.Quietest = res.PerMinute[0], res.PerMinute[0]
	for _, tm := range res.PerMinute {
		if tm.Tasks > res.Busiest.Tasks {
			res.Busiest = tm
		}
		if tm.Tasks > 0 && (res.Quietest.Tasks == 0 || tm.Tasks < res.Quietest.Tasks) {
			res.Quietest = tm
		}
	}
	r.log("trace %s at %gx: %d tasks over %d trace minutes, p50 %.1fms p99 %.1fms; busiest minute %d (%d tasks) p50 %.1fms p99 %.1fms; quietest minute %d (%d tasks) p50 %.1fms p99 %.1fms; failed %d, duplicates %d, missing %d",
		r.o.TraceFile, speed, n, res.Minutes, res.All.Latency.P50, res.All.Latency.P99,
		res.Busiest.Minute, res.Busiest.Tasks, res.Busiest.Latency.P50, res.Busiest.Latency.P99,
		res.Quietest.Minute, res.Quietest.Tasks, res.Quietest.Latency.P50, res.Quietest.Latency.P99,
		res.All.Failed, res.Duplicates, res.Missing)
	return res, nil
}

// writeTrace prints a trace replay: the whole trace, its busiest and
// quietest minutes (of trace time), and every minute.
func writeTrace(w io.Writer, scenario string, tr *TraceResult, o Options) {
	fmt.Fprintf(w, "\n%s: trace %s replayed at %gx with %d dispatcher(s), %d workers x %d slots, %d sim models (latency grows with size)\n",
		scenario, tr.File, tr.Speed, o.Dispatchers, o.Nodes, o.Concurrency, o.Models)
	fmt.Fprintf(w, "%d tasks over %d trace minutes, %d failed, %d duplicate results, %d without a result\n",
		tr.Tasks, tr.Minutes, tr.All.Failed, tr.Duplicates, tr.Missing)
	fmt.Fprintf(w, "  %-22s %7s %9s %9s %9s\n", "", "tasks", "p50 ms", "p99 ms", "max ms")
	row := func(label string, n int, l Latency) {
		fmt.Fprintf(w, "  %-22s %7d %9.1f %9.1f %9.1f\n", label, n, l.P50, l.P99, l.Max)
	}
	row("whole trace", tr.Tasks, tr.All.Latency)
	row(fmt.Sprintf("busiest minute (%d)", tr.Busiest.Minute), tr.Busiest.Tasks, tr.Busiest.Latency)
	row(fmt.Sprintf("quietest minute (%d)", tr.Quietest.Minute), tr.Quietest.Tasks, tr.Quietest.Latency)
	for _, m := range tr.PerMinute {
		row(fmt.Sprintf("minute %d", m.Minute), m.Tasks, m.Latency)
	}
	fmt.Fprintln(w)
}

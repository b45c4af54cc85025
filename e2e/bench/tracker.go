package bench

import (
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mlsched/mlsched/shared/protocol"
)

// tracker follows the tasks of one phase: when each was submitted and when
// it completed (reached a sink, or its result became readable). Task ids are
// prefix + index, so completion costs no map and no lock.
type tracker struct {
	prefix    string
	sent      []atomic.Int64 // Unix ns
	done      []atomic.Int64 // Unix ns; 0 = not yet
	remaining atomic.Int64
	failed    atomic.Int64 // completed, but not successfully (mlsched results)
	foreign   atomic.Int64 // completions of ids not of this phase
	again     atomic.Int64 // completions of a task completed already (a second result)
	// failedBy counts the failures by reason (see Phase.FailedBy).
	failedMu sync.Mutex
	failedBy map[string]int64
	// failedAt marks the tasks that completed unsuccessfully (trace
	// replays: per minute), when not nil.
	failedAt []atomic.Bool
	all      chan struct{}
	// With deadlines (Options.Deadlines): the failed tasks' results and
	// the successful runs, explained at the phase's end (late.go).
	lateMu  sync.Mutex
	lateRes []lateResult
	runs    []timedRun

	// seen[k][i] is when the k-th traced subject (see Options.Trace) first
	// carried task i, or 0.
	seen [][]atomic.Int64
}

// index returns the index of task id, or -1 for an id of another phase.
func (t *tracker) index(id string) int {
	s, found := strings.CutPrefix(id, t.prefix)
	i, err := strconv.Atoi(s)
	if !found || err != nil || i < 0 || i >= len(t.done) {
		return -1
	}
	return i
}

// observe records that traced point k saw id.
func (t *tracker) observe(k int, id string, at time.Time) {
	if i := t.index(id); i >= 0 && k < len(t.seen) {
		t.seen[k][i].CompareAndSwap(0, at.UnixNano())
	}
}

// hop summarises the latency from point a to point b over the tasks that
// have both; a -1 is the submission, len(seen) the completion.
func (t *tracker) hop(a, b int) Latency {
	at := func(k, i int) int64 {
		switch {
		case k < 0:
			return t.sent[i].Load()
		case k >= len(t.seen):
			return t.done[i].Load()
		}
		return t.seen[k][i].Load()
	}
	var l []int64
	for i := range t.done {
		if x, y := at(a, i), at(b, i); x != 0 && y != 0 {
			l = append(l, y-x)
		}
	}
	return summarize(l)
}

func newTracker(prefix string, n, points int) *tracker {
	t := &tracker{prefix: prefix, sent: make([]atomic.Int64, n), done: make([]atomic.Int64, n), all: make(chan struct{})}
	for range points {
		t.seen = append(t.seen, make([]atomic.Int64, n))
	}
	t.remaining.Store(int64(n))
	if n == 0 {
		close(t.all)
	}
	return t
}

// id names task i.
func (t *tracker) id(i int) string { return t.prefix + strconv.Itoa(i) }

// complete records the first completion of id; later ones (redeliveries)
// and ids of other phases are ignored.
func (t *tracker) complete(id string, ok bool, at time.Time) {
	i := t.index(id)
	if i < 0 {
		t.foreign.Add(1)
		return
	}
	if !t.done[i].CompareAndSwap(0, at.UnixNano()) {
		t.again.Add(1)
		return
	}
	if !ok {
		t.failed.Add(1)
		if t.failedAt != nil {
			t.failedAt[i].Store(true)
		}
	}
	if t.remaining.Add(-1) == 0 {
		close(t.all)
	}
}

// failedBecause records why a task of the phase failed (once, with its
// first completion: call it before complete).
func (t *tracker) failedBecause(id, reason string) {
	if i := t.index(id); i < 0 || t.done[i].Load() != 0 {
		return
	}
	t.failedMu.Lock()
	defer t.failedMu.Unlock()
	if t.failedBy == nil {
		t.failedBy = map[string]int64{}
	}
	t.failedBy[reason]++
}

// lateResult is a failed task's result, kept to be explained.
type lateResult struct {
	id         string
	deadlineMs int
	res        protocol.Result
}

// failedResult keeps a failed task's result (once, with its first
// completion: call it before complete).
func (t *tracker) failedResult(id string, deadlineMs int, res protocol.Result) {
	if i := t.index(id); i < 0 || t.done[i].Load() != 0 {
		return
	}
	t.lateMu.Lock()
	t.lateRes = append(t.lateRes, lateResult{id, deadlineMs, res})
	t.lateMu.Unlock()
}

// timedRun is a successful task's run (ms) and when its result was
// published (Unix ns).
type timedRun struct {
	at  int64
	run float64
}

// succeeded keeps a successful task's run (once, before complete).
func (t *tracker) succeeded(id string, res protocol.Result, run float64) {
	if i := t.index(id); i < 0 || t.done[i].Load() != 0 {
		return
	}
	t.lateMu.Lock()
	t.runs = append(t.runs, timedRun{res.FinishedAt.UnixNano(), run})
	t.lateMu.Unlock()
}

// runWindow is how near a success's result must be to a late task's to
// tell the run of its moment, and minRunsNear how many it takes.
const (
	runWindow   = time.Second
	minRunsNear = 5
)

// late explains the kept failed results (late.go). The run of a late
// attempt that did not run is taken to be the median run of the successes
// whose results came within runWindow of its own (the run of that moment:
// a stalled machine runs slower), or the phase's median run.
func (t *tracker) late() (late []LateTask, runP50 float64) {
	t.lateMu.Lock()
	defer t.lateMu.Unlock()
	all := make([]float64, len(t.runs))
	for i, r := range t.runs {
		all[i] = r.run
	}
	if len(all) > 0 {
		runP50 = median(all)
	}
	for _, r := range t.lateRes {
		at, run := r.res.FinishedAt.UnixNano(), runP50
		var near []float64
		for _, s := range t.runs {
			if s.at >= at-int64(runWindow) && s.at <= at+int64(runWindow) {
				near = append(near, s.run)
			}
		}
		if len(near) >= minRunsNear {
			run = median(near)
		}
		late = append(late, explainLate(r.id, r.deadlineMs, r.res, run))
	}
	return late, runP50
}

// span is the phase's extent: first submission, last submission, last
// completion (Unix ns).
func (t *tracker) span() (firstSent, lastSent, lastDone int64) {
	firstSent = math.MaxInt64
	for i := range t.sent {
		s, d := t.sent[i].Load(), t.done[i].Load()
		firstSent, lastSent, lastDone = min(firstSent, s), max(lastSent, s), max(lastDone, d)
	}
	return firstSent, lastSent, lastDone
}

// phase summarises a completed phase: its extent, throughput, offered
// rate, latency and failures, with the CPU it used.
func (t *tracker) phase(cpu map[string]float64) Phase {
	n := len(t.sent)
	first, lastSent, lastDone := t.span()
	p := Phase{Tasks: n, Latency: t.latency(), Failed: t.failed.Load(), Duplicates: t.again.Load(), CPU: cpu}
	p.Late, p.RunP50Ms = t.late()
	p.LateBy = lateBy(p.Late)
	t.failedMu.Lock()
	if len(t.failedBy) > 0 {
		p.FailedBy = maps.Clone(t.failedBy)
	}
	t.failedMu.Unlock()
	if n > 0 {
		p.Seconds = float64(lastDone-first) / 1e9
		p.Throughput = float64(n) / p.Seconds
		if lastSent > first {
			p.OfferedRate = float64(n-1) / (float64(lastSent-first) / 1e9)
		}
	}
	return p
}

// Latency summarises submit-to-completion latencies in milliseconds.
type Latency struct {
	P50  float64 `json:"p50_ms"`
	P90  float64 `json:"p90_ms"`
	P99  float64 `json:"p99_ms"`
	P999 float64 `json:"p999_ms"`
	Max  float64 `json:"max_ms"`
	Mean float64 `json:"mean_ms"`
}

// latency computes the summary over the completed tasks.
func (t *tracker) latency() Latency {
	l := make([]int64, 0, len(t.done))
	for i := range t.done {
		if d := t.done[i].Load(); d != 0 {
			l = append(l, d-t.sent[i].Load())
		}
	}
	return summarize(l)
}

func summarize(ns []int64) Latency {
	if len(ns) == 0 {
		return Latency{}
	}
	slices.Sort(ns)
	var sum float64
	for _, v := range ns {
		sum += float64(v)
	}
	ms := func(v int64) float64 { return float64(v) / 1e6 }
	// Nearest rank: the smallest value with at least q of the samples at or
	// below it.
	q := func(q float64) float64 {
		r := int(math.Ceil(q*float64(len(ns)))) - 1
		return ms(ns[max(0, min(r, len(ns)-1))])
	}
	return Latency{P50: q(0.50), P90: q(0.90), P99: q(0.99), P999: q(0.999), Max: ms(ns[len(ns)-1]),
		Mean: sum / float64(len(ns)) / 1e6}
}

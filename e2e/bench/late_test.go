package bench

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/mlsched/mlsched/shared/protocol"
)

func TestExplainLate(t *testing.T) {
	const run = 5 // the phase's median run, ms
	at := func(st protocol.OutcomeStatus, latency, wait, left float64) protocol.Attempt {
		return protocol.Attempt{Attempt: 1, Model: "m", Node: "n", Status: st, LatencyMs: latency, BatchWaitMs: wait, DeadlineLeftMs: left}
	}
	for _, c := range []struct {
		name    string
		history []protocol.Attempt
		why     string
		ended   string
		before  float64
		runMs   float64
	}{
		{"no node got it", nil, LateNoDispatch, "dispatcher", 0, 0},
		{"only lost", []protocol.Attempt{{Status: protocol.OutcomeLost}}, LateOther, "dispatcher", 0, 0},
		// Ran 15 ms after a 20 ms wait, 30 ms left: in time with no wait.
		{"batch wait, timed out", []protocol.Attempt{at(protocol.OutcomeTimeout, 35, 20, 30)}, LateBatchWait, "worker", 70, 15},
		// Not run after a 10 ms wait, 12 left: the median run would fit.
		{"batch wait, expired", []protocol.Attempt{at(protocol.OutcomeExpired, 0, 10, 12)}, LateBatchWait, "worker", 88, 0},
		{"late at the node", []protocol.Attempt{at(protocol.OutcomeExpired, 0, 1, 3)}, LateBeforeNode, "worker", 97, 0},
		{"past its deadline at the node", []protocol.Attempt{at(protocol.OutcomeExpired, 0, 0, -2)}, LateBeforeNode, "worker", 102, 0},
		{"ran longer than was left", []protocol.Attempt{at(protocol.OutcomeTimeout, 42, 2, 30)}, LateBeforeNode, "worker", 70, 40},
		{"ran longer than its deadline", []protocol.Attempt{at(protocol.OutcomeTimeout, 120, 2, 99)}, LateShortDeadline, "worker", 1, 118},
		// Cut at its deadline after 4 ms of run: the median run (5)
		// stands for it, and 6 ms left would have covered it.
		{"cut, the batch wait made it late", []protocol.Attempt{at(protocol.OutcomeTimeout, 6, 2, 6)}, LateBatchWait, "worker", 94, 4},
		{"cut after a longer run than the median", []protocol.Attempt{at(protocol.OutcomeTimeout, 30, 1, 30)}, LateNodeWait, "worker", 70, 29},
		{"slot wait, unbatched", []protocol.Attempt{at(protocol.OutcomeExpired, 0, 0, 30)}, LateNodeWait, "worker", 70, 0},
		{"slot wait, unbatched, timed out", []protocol.Attempt{at(protocol.OutcomeTimeout, 12, 0, 30)}, LateNodeWait, "worker", 70, 12},
		{"in time with its batch wait", []protocol.Attempt{at(protocol.OutcomeTimeout, 12, 2, 30)}, LateNodeWait, "worker", 70, 10},
		{"a batch wait then a retry too late", []protocol.Attempt{at(protocol.OutcomeExpired, 0, 10, 12), at(protocol.OutcomeExpired, 0, 0, 1)},
			LateBatchWait, "worker", 88, 0},
		{"model error", []protocol.Attempt{at(protocol.OutcomeModelError, 3, 1, 50)}, LateOther, "model", 50, 2},
	} {
		res := protocol.Result{ID: "l-1", Status: protocol.StatusFailed, ErrorCode: protocol.CodeExpired, Attempts: len(c.history), History: c.history}
		lt := explainLate("l-1", 100, res, run)
		if lt.Why != c.why || lt.EndedBy != c.ended || lt.BeforeNodeMs != c.before || lt.RunMs != c.runMs {
			t.Errorf("%s: %+v; want why %q, ended by %s, %g ms before the node, run %g ms", c.name, lt, c.why, c.ended, c.before, c.runMs)
		}
	}
	if run, ok := runOf(protocol.Result{History: []protocol.Attempt{at(protocol.OutcomeSuccess, 9, 4, 50)}}); !ok || run != 5 {
		t.Errorf("runOf a success: %g %v, want 5 true", run, ok)
	}
	if _, ok := runOf(protocol.Result{}); ok {
		t.Error("runOf a result without history: ok")
	}
}

// The deadline table gives each round's counts and their medians.
func TestWriteDeadlines(t *testing.T) {
	rep := func(round int, failed, batch, before int64) *Report {
		p := Phase{Tasks: 100, Failed: failed, LateBy: map[string]int64{LateBatchWait: batch, LateBeforeNode: before},
			FailedBy: map[string]int64{"expired/expired <100ms": failed - 1, "expired/timeout 100-500ms": 1}, RunP50Ms: 2.5}
		return &Report{Options: Options{Round: round, Deadlines: [2]int{20, 2000}, LatencyTasks: 100, Rate: 10},
			Scenarios: []Scenario{{Name: ScenarioDigitsBatch, Latency: p}}}
	}
	s := &Suite{Reports: []*Report{rep(1, 10, 1, 9), rep(2, 30, 3, 27), rep(3, 20, 0, 20)}}
	var b strings.Builder
	if err := s.writeDeadlines(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"deadlines 20-2000 ms", "median of 3", LateBatchWait} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
	var med string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "median of 3") {
			med = strings.Join(strings.Fields(l), " ")
		}
	}
	// failed 20; batch 1, short 0, before 20, node wait 0, no dispatch 0, other 0; <100ms 19, 100-500 1, >=500 0; duplicates 0; run 2.50
	if want := "digits-batch median of 3 20 1 0 20 0 0 0 19 1 0 0 2.50"; med != want {
		t.Errorf("median row %q, want %q", med, want)
	}
}

// The run of a late attempt not run is the run of its moment: the median
// of the successes within a second of it, not the phase's.
func TestLateRunOfItsMoment(t *testing.T) {
	tr := newTracker("l-", 20, 0)
	t0 := time.Date(2026, 12, 6, 3, 0, 0, 0, time.UTC)
	for i := range 12 {
		at, run := t0, 40.0
		if i >= 6 { // a stall, 10 s later: calls of 150 ms
			at, run = t0.Add(10*time.Second), 150
		}
		tr.succeeded(fmt.Sprintf("l-%d", i), protocol.Result{FinishedAt: at}, run)
	}
	// 140 ms left at the node, 60 of them waiting for a batch: late with
	// no wait too at the stall's 150 ms run (the phase's median is 95).
	res := protocol.Result{Status: protocol.StatusFailed, ErrorCode: protocol.CodeExpired, Attempts: 1, FinishedAt: t0.Add(10*time.Second + 300*time.Millisecond),
		History: []protocol.Attempt{{Attempt: 1, Status: protocol.OutcomeExpired, BatchWaitMs: 60, DeadlineLeftMs: 140}}}
	tr.failedResult("l-13", 160, res)
	late, p50 := tr.late()
	if p50 != 95 || len(late) != 1 || late[0].Why != LateBeforeNode || late[0].RunEstimateMs != 150 {
		t.Fatalf("late %+v, run p50 %g; want late at the node with the stall's run 150, p50 95", late, p50)
	}
}

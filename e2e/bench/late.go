package bench

import (
	"github.com/mlsched/mlsched/shared/protocol"
)

// A deadline run's account of its late tasks (issue 41): for every task of
// a phase that failed, where its time went, read from its result's history
// (each attempt's latency_ms and the outcome's deadline_left_ms and
// batch_wait_ms, docs/protocol.md), and why it was late. "Waited for a
// batch" is said only of a task that a node got with time to run and
// that would have made it with no batch wait: its deadline left at the
// node covered its run but not its batch wait as well.

// Why a task was late (LateTask.Why).
const (
	// LateBatchWait: the batch wait alone made it late.
	LateBatchWait = "waited for a batch"
	// LateShortDeadline: its deadline_ms itself was shorter than its run:
	// late however fast the way to the node and with no wait there.
	LateShortDeadline = "deadline shorter than the run"
	// LateBeforeNode: what was left when a node got it did not cover
	// its run, though its deadline did: late with no batch wait too; its
	// time went before the node (the dispatcher's queue or hold, the
	// node's stream).
	LateBeforeNode = "late at the node"
	// LateNodeWait: a node got it with time to run and for its batch
	// wait as well, yet it waited there until too late to start or to
	// finish: for a slot (unbatched), or on its way to the batcher (the
	// time between the node's receipt and the batcher's, which no field
	// reports: on a loaded machine, the goroutines' scheduling).
	LateNodeWait = "waited at the node, not for a batch"
	// LateNoDispatch: no node got it: the dispatcher expired it before
	// any dispatch (queued or held).
	LateNoDispatch = "expired before dispatch"
	// LateOther: a model error or a lost attempt.
	LateOther = "other"
)

// LateTask is one failed task of a phase with deadlines: where its time
// went, on the attempt that explains it (the first one that waited for a
// batch, else the last one a node reported).
type LateTask struct {
	ID         string `json:"id"`
	DeadlineMs int    `json:"deadline_ms"`
	ErrorCode  string `json:"error_code"`
	Attempts   int    `json:"attempts"`
	// Status is the explaining attempt's outcome ("" when no node got it).
	Status string `json:"status,omitempty"`
	// BeforeNodeMs is the time from the submission to the node's receipt
	// (deadline_ms - deadline_left_ms; the task's deadline bounds the
	// dispatch in these runs), DeadlineLeftMs what was left then.
	BeforeNodeMs   float64 `json:"before_node_ms"`
	DeadlineLeftMs float64 `json:"deadline_left_ms"`
	// BatchWaitMs is its wait for its batch's call (0 unbatched).
	BatchWaitMs float64 `json:"batch_wait_ms"`
	// RunMs is the call's run (latency less batch wait); 0 when it did not
	// run. RunEstimateMs is the run the classification takes: RunMs, or
	// for an attempt not run the median run of its moment (the successes
	// within a second of it, else the phase's), and for a timeout, whose
	// call may have been cut at its deadline, the larger of the two.
	RunMs         float64 `json:"run_ms"`
	RunEstimateMs float64 `json:"run_estimate_ms"`
	// EndedBy is who ended it: "dispatcher" (no node got it, or its last
	// attempt was lost), "worker" (expired or timed out there), "model"
	// (an error).
	EndedBy string `json:"ended_by"`
	Why     string `json:"why"`
}

// explainLate says where a failed task's time went; typicalRun (ms) is the
// median run of its moment, standing for the run of an attempt that did not
// run.
func explainLate(id string, deadlineMs int, res protocol.Result, typicalRun float64) LateTask {
	lt := LateTask{ID: id, DeadlineMs: deadlineMs, ErrorCode: string(res.ErrorCode), Attempts: res.Attempts}
	var explaining *protocol.Attempt
	why := LateNoDispatch
	for i := range res.History {
		a := &res.History[i]
		if a.Status.IsLost() || a.Status == "" {
			continue
		}
		w := attemptWhy(a, deadlineMs, typicalRun)
		if explaining == nil || why != LateBatchWait {
			explaining, why = a, w
		}
	}
	last := protocol.OutcomeStatus("")
	if n := len(res.History); n > 0 {
		last = res.History[n-1].Status
	}
	switch {
	case last == "" || last.IsLost():
		lt.EndedBy = "dispatcher"
	case last == protocol.OutcomeExpired || last == protocol.OutcomeTimeout:
		lt.EndedBy = "worker"
	default:
		lt.EndedBy = "model"
	}
	if explaining == nil {
		if len(res.History) > 0 {
			why = LateOther // only lost attempts
		}
		lt.Why = why
		return lt
	}
	lt.Status = string(explaining.Status)
	lt.DeadlineLeftMs, lt.BatchWaitMs = explaining.DeadlineLeftMs, explaining.BatchWaitMs
	lt.BeforeNodeMs = float64(deadlineMs) - explaining.DeadlineLeftMs
	if ran(explaining.Status) {
		lt.RunMs = max(explaining.LatencyMs-explaining.BatchWaitMs, 0)
	}
	lt.RunEstimateMs = runEstimate(explaining, typicalRun)
	lt.Why = why
	return lt
}

// attemptWhy classifies one attempt a node reported. Its run is what it
// ran, or the phase's median for one that did not run; for one that timed
// out, whose call may have been cut at its deadline, the larger of the two.
func attemptWhy(a *protocol.Attempt, deadlineMs int, typicalRun float64) string {
	run := runEstimate(a, typicalRun)
	switch {
	case a.Status == protocol.OutcomeModelError || a.Status == protocol.OutcomeTaskError:
		return LateOther
	case float64(deadlineMs) < run:
		return LateShortDeadline
	case a.DeadlineLeftMs < run:
		return LateBeforeNode
	case a.BatchWaitMs > 0 && a.DeadlineLeftMs-a.BatchWaitMs < run:
		return LateBatchWait
	case a.Status == protocol.OutcomeExpired || a.Status == protocol.OutcomeTimeout:
		// In time at the node even after its batch wait: its time went
		// at the node outside it, before the run's clock started.
		return LateNodeWait
	}
	return LateOther
}

// runEstimate is the run attemptWhy takes for a (LateTask.RunEstimateMs).
func runEstimate(a *protocol.Attempt, typicalRun float64) float64 {
	switch {
	case a.Status == protocol.OutcomeTimeout:
		return max(a.LatencyMs-a.BatchWaitMs, typicalRun)
	case ran(a.Status):
		return max(a.LatencyMs-a.BatchWaitMs, 0)
	}
	return typicalRun
}

// ran reports whether an attempt of this outcome ran its model.
func ran(s protocol.OutcomeStatus) bool {
	return s == protocol.OutcomeSuccess || s == protocol.OutcomeTimeout || s == protocol.OutcomeModelError || s == protocol.OutcomeTaskError
}

// runOf is a successful result's run (ms): its last attempt's latency less
// its batch wait.
func runOf(res protocol.Result) (float64, bool) {
	n := len(res.History)
	if n == 0 || res.History[n-1].Status != protocol.OutcomeSuccess {
		return 0, false
	}
	a := res.History[n-1]
	return max(a.LatencyMs-a.BatchWaitMs, 0), true
}

// lateBy counts late tasks by why.
func lateBy(late []LateTask) map[string]int64 {
	if len(late) == 0 {
		return nil
	}
	by := map[string]int64{}
	for _, lt := range late {
		by[lt.Why]++
	}
	return by
}

// lateByString is " [why n, ...]", or "" without late tasks.
func lateByString(by map[string]int64) string { return countsString(by, " [", "]") }

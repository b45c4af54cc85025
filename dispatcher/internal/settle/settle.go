// Package settle holds the rule that turns an attempt's outcome into what
// happens to its task: the final result, a retry after a backoff, or a
// failure that is also dead-lettered, plus the statistics to record. It is a
// pure function of the attempt, the outcome and what is stored about the
// task, so the dispatcher and the simulator (dispatcher/internal/simulate) apply the very
// same rules.
package settle

import (
	"strconv"
	"time"

	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/shared/protocol"
)

// Rules are the retry rules. The zero value retries at once.
type Rules struct {
	// Backoff is the delay before the first retry, doubled per attempt up to
	// BackoffMax (the dispatcher's MLSCHED_RETRY_BACKOFF and
	// MLSCHED_RETRY_BACKOFF_MAX).
	Backoff    time.Duration
	BackoffMax time.Duration
}

// BackoffAfter is the delay before the attempt after attempt.
func (r Rules) BackoffAfter(attempt int) time.Duration {
	b := r.Backoff
	for i := 1; i < attempt && b < r.BackoffMax; i++ {
		b *= 2
	}
	return min(b, r.BackoffMax)
}

// State is what the settler knows about the task besides the outcome.
type State struct {
	// Superseded: the attempt was declared lost and a later one dispatched,
	// so this outcome is late and the task's result comes from a later
	// attempt.
	Superseded bool
	// Cancelled: an operator cancelled this submission of the task, which
	// has its cancelled result: every outcome of it is late, a lost one too.
	Cancelled bool
	// Redelivered: the outcome was delivered before, so its statistics are
	// recorded and its backoff has been waited.
	Redelivered bool
	// TaskErr is why the outcome's task bytes cannot be dispatched again
	// (nil: they can). Only looked at for an outcome that may be retried.
	TaskErr error
	// Expired: the task's own deadline (deadline_ms) has passed, so a
	// failed attempt is not retried: the task fails with CodeExpired.
	Expired bool
}

// Action is what to do with the task.
type Action uint8

const (
	// Finish publishes the task's final result (Status, Code, Error).
	Finish Action = iota + 1
	// Retry dispatches the next attempt once Backoff has passed.
	Retry
	// DeadLetter publishes the task's failed result (Status, Code, Error)
	// and keeps the task in the dead-letter stream for an operator.
	DeadLetter
	// Late does nothing but count: a later attempt, or a cancellation,
	// owns the task.
	Late
)

func (a Action) String() string {
	switch a {
	case Finish:
		return "finish"
	case Retry:
		return "retry"
	case DeadLetter:
		return "dead-letter"
	case Late:
		return "late"
	}
	return "unknown"
}

// Decision is how to settle one outcome.
type Decision struct {
	Action Action
	// Status, Code and Error of the result (Finish, DeadLetter); Code and
	// Error are empty on success.
	Status protocol.Status
	Code   protocol.Code
	Error  string
	// Backoff before the retry (Retry; 0: at once).
	Backoff time.Duration
	// Record tells whether to record Kind in the statistics (not again for a
	// redelivered outcome); Kind is the statistics kind of the outcome.
	Record bool
	Kind   stats.Kind
	// Supersede: the attempt was lost; mark it superseded so that its own
	// late outcome, should its node wake up, is not final.
	Supersede bool
}

// Settle decides what an attempt's outcome does to its task.
func Settle(r Rules, d protocol.Dispatch, o protocol.Outcome, s State) Decision {
	dec := Decision{Record: !s.Redelivered, Kind: KindOf(o.Status)}
	if s.Cancelled || (s.Superseded && !o.Status.IsLost()) {
		dec.Action = Late
		return dec
	}
	dec.Supersede = o.Status.IsLost()
	switch o.Status {
	case protocol.OutcomeSuccess:
		dec.Action, dec.Status = Finish, protocol.StatusSucceeded
		return dec
	case protocol.OutcomeTaskError:
		// Bad input: not the model's fault, and another attempt would fail too.
		dec.Action, dec.Status, dec.Code, dec.Error = Finish, protocol.StatusFailed, protocol.CodeTaskError, o.Error
		return dec
	}
	// A failed, timed-out, lost or expired attempt (or an unknown status,
	// treated as a model error).
	if s.Expired {
		// Its answer is worthless now: no retry, and no dead letter.
		dec.Action, dec.Status, dec.Code = Finish, protocol.StatusFailed, protocol.CodeExpired
		dec.Error = "the task's deadline passed: attempt " + strconv.Itoa(d.Attempt) + " on model " + o.Model + " node " + o.Node +
			" ended " + string(o.Status) + " (" + o.Error + ") and the task was not started again"
		return dec
	}
	if d.Attempt < d.MaxAttempts && s.TaskErr == nil {
		dec.Action = Retry
		if !s.Redelivered && o.Status != protocol.OutcomeExpired {
			// An expired attempt never ran: retrying it at once costs the model nothing.
			dec.Backoff = r.BackoffAfter(d.Attempt)
		}
		return dec
	}
	err := protocol.Errorf(protocol.CodeAttemptsExhausted, "all %d attempts failed; the last, on model %s node %s, ended %s: %s",
		d.Attempt, o.Model, o.Node, o.Status, o.Error)
	if s.TaskErr != nil && d.Attempt < d.MaxAttempts {
		err = protocol.Errorf(protocol.CodeAttemptsExhausted, "attempt %d on model %s node %s ended %s (%s) and cannot be retried: %v",
			d.Attempt, o.Model, o.Node, o.Status, o.Error, s.TaskErr)
	}
	dec.Action, dec.Status, dec.Code, dec.Error = DeadLetter, protocol.StatusFailed, err.Code, err.Msg // the code has its own field
	return dec
}

// KindOf is the statistics kind of an outcome status. A lost attempt counts
// as a timeout; an unknown status as a model error.
func KindOf(s protocol.OutcomeStatus) stats.Kind {
	switch s {
	case protocol.OutcomeSuccess:
		return stats.KindSuccess
	case protocol.OutcomeTaskError:
		return stats.KindTaskError
	case protocol.OutcomeExpired, protocol.OutcomeNodeLost: // neither the model's success nor its failure
		return stats.KindExpired
	case protocol.OutcomeTimeout, protocol.OutcomeLost:
		return stats.KindTimeout
	default:
		return stats.KindModelError
	}
}

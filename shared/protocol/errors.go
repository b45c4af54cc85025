package protocol

import (
	"errors"
	"fmt"
	"strings"
)

// Code names a class of error that producers and operators can match on.
// Codes appear in results ("error_code") and dead-letter entries.
type Code string

// Error codes. Validation codes are produced by DecodeTask; the others by the
// dispatcher and workers.
const (
	CodeMalformedJSON      Code = "malformed_json"
	CodeNotObject          Code = "not_object"
	CodeInvalidUTF8        Code = "invalid_utf8"
	CodeInvalidField       Code = "invalid_field"
	CodeMissingID          Code = "missing_id"
	CodeInvalidID          Code = "invalid_id"
	CodeMissingType        Code = "missing_type"
	CodeInvalidType        Code = "invalid_type"
	CodeTypeMismatch       Code = "type_mismatch"
	CodePayloadTooLarge    Code = "payload_too_large"
	CodeInvalidTimeout     Code = "invalid_timeout"
	CodeInvalidMaxAttempts Code = "invalid_max_attempts"
	CodeTooManyModels      Code = "too_many_models"
	CodeUnknownModel       Code = "unknown_model"
	CodeNoModel            Code = "no_model"
	CodeConstraints        Code = "constraints_unsatisfied"
	CodeAttemptsExhausted  Code = "attempts_exhausted"
	CodeTaskError          Code = "task_error"
	// CodeInvalidDispatch: a dispatch (or the outcome echoing it) whose
	// headers are missing or unreadable; see ParseDispatch.
	CodeInvalidDispatch Code = "invalid_dispatch"
	// CodeCancelled: an operator cancelled the task (`mlsched cancel`).
	CodeCancelled Code = "cancelled"
	// CodeSaturated: every candidate's nodes held more work than they could
	// start before the task's deadline, for as long as the task could wait.
	CodeSaturated Code = "saturated"
	// CodeInvalidPriority, CodeInvalidTenant, CodeInvalidDeadline: the
	// flow-control fields are out of range.
	CodeInvalidPriority Code = "invalid_priority"
	CodeInvalidTenant   Code = "invalid_tenant"
	CodeInvalidDeadline Code = "invalid_deadline"
	// CodeBandMismatch: a task was published on a priority band's subject
	// (topology.BandTaskSubject) that its priority does not belong to.
	CodeBandMismatch Code = "band_mismatch"
	// CodeExpired: the task's deadline_ms passed before it could start; it
	// was never started, so no stale answer was computed.
	CodeExpired Code = "expired"
	// CodeShed: the cluster could not finish the held work within its
	// deadlines and dropped this sheddable (negative-priority) task first.
	CodeShed Code = "shed"
	// CodeQuotaExceeded: the task's tenant was over its rate or
	// concurrency quota, and the quota is configured to reject.
	CodeQuotaExceeded Code = "quota_exceeded"
	// CodeBudgetExceeded: the task's tenant or type has spent its cost
	// budget for the current period, and the budget is configured to refuse
	// (RetryAfterMs says when the period ends).
	CodeBudgetExceeded Code = "budget_exceeded"
)

// Error is a protocol error with a stable Code and a human-readable message.
type Error struct {
	Code Code
	Msg  string
}

func (e *Error) Error() string { return string(e.Code) + ": " + e.Msg }

// Is makes errors.Is(err, protocol.ErrX) match on the code alone.
func (e *Error) Is(target error) bool {
	var t *Error
	if errors.As(target, &t) {
		return t.Code == e.Code && (t.Msg == "" || t.Msg == e.Msg)
	}
	return false
}

// Errorf builds an *Error.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// CodeOf returns the Code of err, or "" when err carries none.
func CodeOf(err error) Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// Sentinels for errors.Is.
var (
	ErrMalformedJSON   = &Error{Code: CodeMalformedJSON}
	ErrNotObject       = &Error{Code: CodeNotObject}
	ErrInvalidUTF8     = &Error{Code: CodeInvalidUTF8}
	ErrMissingID       = &Error{Code: CodeMissingID}
	ErrInvalidID       = &Error{Code: CodeInvalidID}
	ErrMissingType     = &Error{Code: CodeMissingType}
	ErrPayloadTooLarge = &Error{Code: CodePayloadTooLarge}
	ErrTooManyModels   = &Error{Code: CodeTooManyModels}
	ErrUnknownModel    = &Error{Code: CodeUnknownModel}
	ErrNoModel         = &Error{Code: CodeNoModel}
)

func asType[T any](err error, target *T) bool { return errors.As(err, target) }

// Message is err's text without its leading error code: what goes in a
// result's "error" or a dead letter's "reason", next to the code in its own
// field, so that nothing shows "attempts_exhausted: attempts_exhausted: …".
func Message(err error) string {
	if err == nil {
		return ""
	}
	s := err.Error()
	if c := CodeOf(err); c != "" {
		if rest, ok := strings.CutPrefix(s, string(c)+": "); ok {
			return rest
		}
	}
	return s
}

package settle_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/mlsched/mlsched/dispatcher/internal/settle"
	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/shared/protocol"
)

var rules = settle.Rules{Backoff: 100 * time.Millisecond, BackoffMax: 5 * time.Second}

func TestSettle(t *testing.T) {
	bad := errors.New("task bytes are not a task")
	cases := []struct {
		name     string
		attempt  int // of 3
		status   protocol.OutcomeStatus
		state    settle.State
		action   settle.Action
		result   protocol.Status
		code     protocol.Code
		errHas   string
		backoff  time.Duration
		record   bool
		kind     stats.Kind
		supersed bool
	}{
		{"success", 1, protocol.OutcomeSuccess, settle.State{}, settle.Finish, protocol.StatusSucceeded, "", "", 0, true, stats.KindSuccess, false},
		{"success redelivered", 2, protocol.OutcomeSuccess, settle.State{Redelivered: true}, settle.Finish, protocol.StatusSucceeded, "", "", 0, false, stats.KindSuccess, false},
		{"success on the last attempt", 3, protocol.OutcomeSuccess, settle.State{}, settle.Finish, protocol.StatusSucceeded, "", "", 0, true, stats.KindSuccess, false},
		{"task error is final", 1, protocol.OutcomeTaskError, settle.State{}, settle.Finish, protocol.StatusFailed, protocol.CodeTaskError, "bad input", 0, true, stats.KindTaskError, false},
		{"model error retries after backoff", 1, protocol.OutcomeModelError, settle.State{}, settle.Retry, "", "", "", 100 * time.Millisecond, true, stats.KindModelError, false},
		{"backoff doubles", 2, protocol.OutcomeTimeout, settle.State{}, settle.Retry, "", "", "", 200 * time.Millisecond, true, stats.KindTimeout, false},
		{"redelivery retries at once", 2, protocol.OutcomeTimeout, settle.State{Redelivered: true}, settle.Retry, "", "", "", 0, false, stats.KindTimeout, false},
		{"expired retries at once", 1, protocol.OutcomeExpired, settle.State{}, settle.Retry, "", "", "", 0, true, stats.KindExpired, false},
		{"lost retries and supersedes", 1, protocol.OutcomeLost, settle.State{}, settle.Retry, "", "", "", 100 * time.Millisecond, true, stats.KindTimeout, true},
		{"lost is never late", 1, protocol.OutcomeLost, settle.State{Superseded: true}, settle.Retry, "", "", "", 100 * time.Millisecond, true, stats.KindTimeout, true},
		{"unknown status counts as a model error", 1, "melted", settle.State{}, settle.Retry, "", "", "", 100 * time.Millisecond, true, stats.KindModelError, false},
		{"late success is only counted", 1, protocol.OutcomeSuccess, settle.State{Superseded: true}, settle.Late, "", "", "", 0, true, stats.KindSuccess, false},
		{"cancelled success is only counted", 2, protocol.OutcomeSuccess, settle.State{Cancelled: true}, settle.Late, "", "", "", 0, true, stats.KindSuccess, false},
		{"cancelled lost attempt is only counted", 1, protocol.OutcomeLost, settle.State{Cancelled: true}, settle.Late, "", "", "", 0, true, stats.KindTimeout, false},
		{"late failure is only counted", 1, protocol.OutcomeModelError, settle.State{Superseded: true}, settle.Late, "", "", "", 0, true, stats.KindModelError, false},
		{"exhausted", 3, protocol.OutcomeModelError, settle.State{}, settle.DeadLetter, protocol.StatusFailed, protocol.CodeAttemptsExhausted, "all 3 attempts failed", 0, true, stats.KindModelError, false},
		{"exhausted by expiry", 3, protocol.OutcomeExpired, settle.State{}, settle.DeadLetter, protocol.StatusFailed, protocol.CodeAttemptsExhausted, "ended expired", 0, true, stats.KindExpired, false},
		{"unretryable task bytes", 1, protocol.OutcomeTimeout, settle.State{TaskErr: bad}, settle.DeadLetter, protocol.StatusFailed, protocol.CodeAttemptsExhausted, "cannot be retried: task bytes", 0, true, stats.KindTimeout, false},
		{"past the task's deadline: not retried", 1, protocol.OutcomeExpired, settle.State{Expired: true}, settle.Finish, protocol.StatusFailed, protocol.CodeExpired, "deadline passed", 0, true, stats.KindExpired, false},
		{"lost past the task's deadline", 1, protocol.OutcomeLost, settle.State{Expired: true}, settle.Finish, protocol.StatusFailed, protocol.CodeExpired, "ended lost", 0, true, stats.KindTimeout, true},
		{"success past the task's deadline is kept", 1, protocol.OutcomeSuccess, settle.State{Expired: true}, settle.Finish, protocol.StatusSucceeded, "", "", 0, true, stats.KindSuccess, false},
		{"task bytes ignored on success", 1, protocol.OutcomeSuccess, settle.State{TaskErr: bad}, settle.Finish, protocol.StatusSucceeded, "", "", 0, true, stats.KindSuccess, false},
	}
	for _, c := range cases {
		d := protocol.Dispatch{TaskID: "t", Type: "x", Model: "m", Node: "n", Attempt: c.attempt, MaxAttempts: 3}
		o := protocol.Outcome{TaskID: "t", Model: "m", Node: "n", Attempt: c.attempt, Status: c.status}
		if c.status == protocol.OutcomeTaskError {
			o.Error = "bad input"
		}
		got := settle.Settle(rules, d, o, c.state)
		if got.Action != c.action || got.Status != c.result || got.Code != c.code || got.Backoff != c.backoff ||
			got.Record != c.record || got.Kind != c.kind || got.Supersede != c.supersed || !strings.Contains(got.Error, c.errHas) {
			t.Errorf("%s: %+v (%s)", c.name, got, got.Action)
		}
		if (c.code == "") != (got.Error == "") {
			t.Errorf("%s: error %q with code %q", c.name, got.Error, got.Code)
		}
	}
}

func TestBackoffIsCapped(t *testing.T) {
	want := []time.Duration{100, 200, 400, 800, 1600, 3200, 5000, 5000}
	for i, w := range want {
		if got := rules.BackoffAfter(i + 1); got != w*time.Millisecond {
			t.Errorf("after attempt %d: %v, want %v", i+1, got, w*time.Millisecond)
		}
	}
	if got := (settle.Rules{}).BackoffAfter(4); got != 0 {
		t.Errorf("zero rules: %v", got)
	}
}

// Every outcome status maps to a statistics kind, and only the statuses
// that count against a model map to a failure kind.
func TestKindOfEveryStatus(t *testing.T) {
	for _, s := range []protocol.OutcomeStatus{protocol.OutcomeSuccess, protocol.OutcomeModelError, protocol.OutcomeTimeout,
		protocol.OutcomeTaskError, protocol.OutcomeExpired, protocol.OutcomeLost} {
		k := settle.KindOf(s)
		failure := k == stats.KindModelError || k == stats.KindTimeout
		if failure != s.Failed() {
			t.Errorf("%s → kind %d: failure %v, but Failed() is %v", s, k, failure, s.Failed())
		}
	}
	if settle.KindOf(protocol.OutcomeTaskError) != stats.KindTaskError {
		t.Error("task_error is not recorded as a task error")
	}
}

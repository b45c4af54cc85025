package main

import (
	"strings"
	"testing"

	"github.com/mlsched/mlsched/dispatcher/internal/settle"
	"github.com/mlsched/mlsched/shared/protocol"
)

// A reason too long for `dlq list` or `top` keeps its end, the last
// attempt's error (issue 22: both cut it off), and says its code once.
func TestReasonKeepsTheLastError(t *testing.T) {
	dec := settle.Settle(settle.Rules{}, protocol.Dispatch{Attempt: 3, MaxAttempts: 3},
		protocol.Outcome{Status: protocol.OutcomeModelError, Model: "flaky-fast-with-a-long-name", Node: "worker-node-number-3",
			Error: "simulated model failure"}, settle.State{})
	if dec.Code != protocol.CodeAttemptsExhausted || strings.Contains(dec.Error, string(protocol.CodeAttemptsExhausted)) {
		t.Fatalf("decision code %q error %q: the error repeats its code", dec.Code, dec.Error)
	}
	line := oneLine(dec.Error, 80)
	if !strings.HasSuffix(line, "simulated model failure") || len(line) > 85 {
		t.Fatalf("oneLine(%q) = %q: want at most ~80 bytes ending with the last error", dec.Error, line)
	}
	if got := oneLine("short  reason\n", 80); got != "short reason" {
		t.Fatalf("oneLine short = %q", got)
	}
}

package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/mlsched/mlsched/shared/protocol"
)

func TestWriteSteps(t *testing.T) {
	var b bytes.Buffer
	writeSteps(&b, &protocol.Result{Status: protocol.StatusFailed, FailedStep: "two", ErrorCode: protocol.CodePipelineError,
		Steps: []protocol.StepRecord{
			{Name: "one", Type: "extract", Model: "m1", Node: "n1", Attempts: 1, LatencyMs: 3.2, Status: protocol.StatusSucceeded},
			{Name: "v1", Ensemble: "vote", Type: "judge", Model: "m2", Node: "n2", Attempts: 2, LatencyMs: 5, Status: protocol.StatusFailed, Error: "boom"}}})
	out := b.String()
	for _, want := range []string{"step 1 one", "m1 on n1, 1 attempt(s), 3.2 ms, succeeded", "step 2 vote/v1", "failed: boom", "pipeline failed at step two: pipeline_error"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
	b.Reset()
	writeSteps(&b, &protocol.Result{Status: protocol.StatusSucceeded})
	if b.Len() != 0 {
		t.Errorf("a plain task's steps: %q", b.String())
	}
}

package dispatcher

import (
	"testing"

	"github.com/mlsched/mlsched/shared/protocol"
)

// A dispatcher acks only the task a dispatch names: the ack subject of the
// dispatchers' consumer of MLSCHED_TASKS, at the sealed submission.
func TestTaskAckFor(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		ack, submission string
		ok              bool
	}{
		{"$JS.ACK.MLSCHED_TASKS.dispatcher.1.42.7.1800000000000000000.0", "42", true},
		{"$JS.ACK.hub.ACCHASH.MLSCHED_TASKS.dispatcher.1.42.7.1800000000000000000.0.tok", "42", true},
		{"$JS.ACK.MLSCHED_TASKS.dispatcher.1.43.7.1800000000000000000.0", "42", false}, // another task
		{"$JS.ACK.MLSCHED_OUTCOMES.dispatcher.1.42.7.1800000000000000000.0", "42", false},
		{"$JS.ACK.MLSCHED_TASKS.other.1.42.7.1800000000000000000.0", "42", false},
		{"$JS.ACK.MLSCHED_TASKS.dispatcher-high.1.42.7.1800000000000000000.0", "42", true}, // a band's consumer
		{"$JS.ACK.MLSCHED_TASKS.dispatcher-low.1.42.7.1800000000000000000.0", "42", true},
		{"$JS.ACK.MLSCHED_TASKS.dispatcher-urgent.1.42.7.1800000000000000000.0", "42", false},
		{"$JS.ACK.MLSCHED_TASKS.dispatcher.1.42.7.0", "42", false}, // too short
		{"mlsched.results.x", "42", false},
		{"$JS.ACK.MLSCHED_TASKS.dispatcher.*.42.7.1800000000000000000.0", "42", false},
		{"$JS.ACK.MLSCHED_TASKS.dispatcher.1.42.7.1800000000000000000.0", "", false}, // no submission
		{"", "42", false},
	} {
		got := taskAckFor(&protocol.Dispatch{TaskAck: c.ack, Submission: c.submission})
		if (got != "") != c.ok || (c.ok && got != c.ack) {
			t.Errorf("taskAckFor(%q, submission %q) = %q, want ok=%v", c.ack, c.submission, got, c.ok)
		}
	}
}

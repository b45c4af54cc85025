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

// parseTaskAck runs for every result: it reads the subject in place.
func TestParseTaskAckDoesNotAllocate(t *testing.T) {
	for _, subj := range []string{
		"$JS.ACK.MLSCHED_TASKS.dispatcher.1.42.7.1800000000000000000.0",
		"$JS.ACK.hub.ACCHASH.MLSCHED_TASKS.dispatcher.1.42.7.1800000000000000000.0.tok",
	} {
		var seq string
		if n := testing.AllocsPerRun(100, func() { _, seq, _ = parseTaskAck(subj) }); n != 0 || seq != "42" {
			t.Errorf("parseTaskAck(%q): %v allocations, sequence %q", subj, n, seq)
		}
	}
	for _, subj := range []string{
		"$JS.ACK.MLSCHED_TASKS.dispatcher.1.42.7.1800000000000000000.0.x",   // 10 tokens
		"$JS.ACK.MLSCHED_TASKS.dispatcher.1.42.7.1800000000000000000.0.x.y", // 11
		"$JS.ACK..dispatcher.1.42.7.1800000000000000000.0",                  // no stream
		"$JS.ACK.MLSCHED_TASKS..1.42.7.1800000000000000000.0",               // no consumer
	} {
		if _, _, ok := parseTaskAck(subj); ok {
			t.Errorf("parseTaskAck(%q) accepted it", subj)
		}
	}
}

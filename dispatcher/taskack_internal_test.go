package dispatcher

import (
	"testing"
	"time"

	"github.com/mlsched/mlsched/dispatcher/internal/finish"
	"github.com/mlsched/mlsched/shared/jsplumb"
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
		got := finish.TaskAckFor(&protocol.Dispatch{TaskAck: c.ack, Submission: c.submission})
		if (got != "") != c.ok || (c.ok && got != c.ack) {
			t.Errorf("finish.TaskAckFor(%q, submission %q) = %q, want ok=%v", c.ack, c.submission, got, c.ok)
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
		if n := testing.AllocsPerRun(100, func() { _, seq, _ = finish.ParseTaskAck(subj) }); n != 0 || seq != "42" {
			t.Errorf("finish.ParseTaskAck(%q): %v allocations, sequence %q", subj, n, seq)
		}
	}
	for _, subj := range []string{
		"$JS.ACK.MLSCHED_TASKS.dispatcher.1.42.7.1800000000000000000.0.x",   // 10 tokens
		"$JS.ACK.MLSCHED_TASKS.dispatcher.1.42.7.1800000000000000000.0.x.y", // 11
		"$JS.ACK..dispatcher.1.42.7.1800000000000000000.0",                  // no stream
		"$JS.ACK.MLSCHED_TASKS..1.42.7.1800000000000000000.0",               // no consumer
	} {
		if _, _, ok := finish.ParseTaskAck(subj); ok {
			t.Errorf("finish.ParseTaskAck(%q) accepted it", subj)
		}
	}
}

// replyMsg is a consumed message known by its ack subject.
type replyMsg struct {
	jsplumb.Msg
	reply string
}

func (m replyMsg) Reply() string { return m.reply }

// keep holds a task for a retry that stands for it (not for the task
// itself, which its own room keeps alive), signalled at the keeper's next
// tick, for at least as long as asked; a dispatch of the retry then keeps
// it until its deadline without resetting when it was last signalled.
func TestKeeperKeepsARetrysTask(t *testing.T) {
	t.Parallel()
	const task = "$JS.ACK.MLSCHED_TASKS.dispatcher.1.42.7.1800000000000000000.0"
	k := newTaskKeeper(nil, nil, 30*time.Second, 2*time.Second)
	now := time.Now()
	k.Keep(replyMsg{reply: task}, task, now.Add(time.Minute)) // the task itself: its room keeps it
	if len(k.tasks) != 0 {
		t.Fatalf("kept %v for the task message itself", k.tasks)
	}
	outcome := replyMsg{reply: "$JS.ACK.MLSCHED_OUTCOMES.dispatcher.1.9.9.1800000000000000000.0"}
	k.Keep(outcome, task, now.Add(time.Minute))
	k.Keep(outcome, task, now.Add(time.Second)) // never shortened
	kt, ok := k.tasks[task]
	if !ok || !kt.until.Equal(now.Add(time.Minute)) || !kt.last.IsZero() {
		t.Fatalf("kept %+v (%v), want until a minute from now, signalled at the next tick", kt, ok)
	}
	k.add(task, now.Add(10*time.Second), attemptRecord{}) // the retry is dispatched
	if kt = k.tasks[task]; !kt.until.Equal(now.Add(10*time.Second)) || !kt.last.IsZero() {
		t.Fatalf("after the dispatch: %+v, want until its deadline, its last signal kept", kt)
	}
	k.remove(task)
	if len(k.tasks) != 0 {
		t.Fatalf("kept %v after its ack", k.tasks)
	}
	var none *taskKeeper // an older dispatcher's: nothing to keep
	none.Keep(outcome, task, now)
	none.remove(task)
}

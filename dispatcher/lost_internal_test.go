package dispatcher

import (
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// A lost attempt's record: the latest attempt of a submission wins whatever
// order the replicas' records arrive in, it is found until the task went
// on from it (its attempt superseded), and it is pruned with the rest.
func TestLostAttemptRecords(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	s := newSupersededSet(nil, zerolog.Nop())
	s.now = func() time.Time { return now }
	ctx := t.Context()
	if err := s.RecordLost(ctx, attemptRecord{Task: "a", Submission: "7", Attempt: 2, Model: "m2"}); err != nil {
		t.Fatal(err)
	}
	// Another replica dispatched attempt 1 and kept it: a stale record.
	if err := s.RecordLost(ctx, attemptRecord{Task: "a", Submission: "7", Attempt: 1, Model: "m1"}); err != nil {
		t.Fatal(err)
	}
	s.applyLost(supersededKey("a", "7"), []byte(`{"task":"a","submission":"7","attempt":1,"model":"m1"}`), now)
	r, ok := s.LostAttempt("a", "7")
	if !ok || r.Attempt != 2 || r.Model != "m2" {
		t.Fatalf("LostAttempt = %+v, %v; want attempt 2 on m2", r, ok)
	}
	if _, ok := s.LostAttempt("a", "8"); ok {
		t.Error("another submission of the task has a record")
	}
	s.Mark("a", "7", 2) // the task went on from it
	if _, ok := s.LostAttempt("a", "7"); ok {
		t.Error("the record is still found once its attempt is superseded")
	}
	s.applyLost(supersededKey("b", "1"), []byte(`not json`), now) // ignored, logged
	if _, ok := s.LostAttempt("b", "1"); ok {
		t.Error("an unreadable record is found")
	}
	now = now.Add(supersededRetention + 2*time.Minute)
	s.Mark("c", "1", 1) // prunes
	s.mu.RLock()
	n := len(s.lost)
	s.mu.RUnlock()
	if n != 0 {
		t.Errorf("%d lost records kept past the retention", n)
	}
}

// The keeper hands over the attempts dispatched before the streams' loss
// that it still keeps, not a retry that waits (its attempt ended), nor one
// dispatched after.
func TestKeeperInFlight(t *testing.T) {
	k := newTaskKeeper(nil, nil, time.Minute, time.Second)
	now := time.Now()
	until := now.Add(time.Minute)
	k.add("t1", until, attemptRecord{Task: "t1", Attempt: 1, Dispatched: now.Add(-time.Second)})
	k.add("t2", until, attemptRecord{Task: "t2", Attempt: 2, Dispatched: now.Add(-time.Second)})
	k.add("t3", until, attemptRecord{Task: "t3", Attempt: 1, Dispatched: now.Add(time.Second)})
	k.add("t4", now.Add(-time.Second), attemptRecord{Task: "t4", Attempt: 1, Dispatched: now.Add(-2 * time.Second)})
	k.Keep(replyMsg{reply: "outcome"}, "t2", until) // t2's attempt ended: its retry waits
	got := k.inFlight(now)
	if len(got) != 1 || got[0].Task != "t1" {
		t.Fatalf("inFlight = %+v, want t1 alone", got)
	}
}

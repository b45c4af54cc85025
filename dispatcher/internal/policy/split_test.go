package policy

import (
	"math"
	"testing"
	"time"

	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/shared/protocol"
)

func splitTable() *Table {
	return NewTable(snapshot(map[string]stats.Series{
		"fraud@v7": series(1000, 10, time.Millisecond, 0),
		// the better model: reliability would send it nearly everything
		"fraud@v8": series(1000, 0, time.Millisecond, 0),
	}), []protocol.Heartbeat{hb("n1", "t", 64, "fraud@v7", "fraud@v8"), hb("n2", "t", 64, "fraud@v7", "fraud@v8")}, t0)
}

func TestSplitCapsTheShare(t *testing.T) {
	t.Parallel()
	tab := splitTable()
	e := engine(t, Config{ExploreShare: -1})
	if got := counts(t, e, tab, &Request{Type: "t"}, 1000); got["fraud@v8"] < 900 {
		t.Fatalf("without a split the better version should win: %v", got)
	}
	sp := NewSplit("fraud@v8", 0.05)
	e.SetSplits([]*Split{sp})
	// every window of 200 decisions holds 10 canaries, give or take one
	for w := range 5 {
		if got := counts(t, e, tab, &Request{Type: "t"}, 200); math.Abs(float64(got["fraud@v8"])-10) > 1 {
			t.Fatalf("window %d: %v, want 10 of 200 on fraud@v8", w, got)
		}
	}
	sp.SetShare(0.5)
	if got := counts(t, e, tab, &Request{Type: "t"}, 200); math.Abs(float64(got["fraud@v8"])-100) > 1 {
		t.Fatalf("50%%: %v", got)
	}
	// a retry never goes to the capped version; a failed canary goes back
	// to the incumbent
	retry := &Request{Type: "t", Tried: []protocol.Attempt{{Model: "fraud@v8", Node: "n1"}}}
	if got := counts(t, e, tab, retry, 100); got["fraud@v7"] != 100 {
		t.Fatalf("retry of a canary: %v", got)
	}
	// a task pinned to the new version is not capped; one pinned to the
	// incumbent never reaches the new version
	if got := counts(t, e, tab, &Request{Type: "t", Models: []string{"fraud@v8"}}, 50); got["fraud@v8"] != 50 {
		t.Fatalf("pinned: %v", got)
	}
	if got := counts(t, e, tab, &Request{Type: "t", Models: []string{"fraud@v7"}}, 50); got["fraud@v7"] != 50 {
		t.Fatalf("pinned incumbent: %v", got)
	}
	sp.SetShare(0) // rolled back
	if got := counts(t, e, tab, &Request{Type: "t"}, 500); got["fraud@v8"] != 0 {
		t.Fatalf("rolled back: %v", got)
	}
	sp.SetShare(1) // promoted
	if got := counts(t, e, tab, &Request{Type: "t"}, 200); got["fraud@v8"] != 200 {
		t.Fatalf("promoted: %v", got)
	}
	e.SetSplits(nil)
}

func TestSplitRespectsBreakersAndConstraints(t *testing.T) {
	t.Parallel()
	snap := snapshot(map[string]stats.Series{
		"fraud@v7": series(1000, 10, time.Millisecond, 0),
		"fraud@v8": series(1000, 0, 50*time.Millisecond, 0),
	})
	s := snap.Models["fraud@v8"].Series
	s.Breaker = stats.Breaker{State: stats.BreakerOpen, Since: t0}
	snap.Models["fraud@v8"].Series = s
	tab := NewTable(snap, []protocol.Heartbeat{hb("n1", "t", 64, "fraud@v7", "fraud@v8")}, t0)
	e := engine(t, Config{ExploreShare: -1})
	e.SetSplits([]*Split{NewSplit("fraud@v8", 0.5)})
	if got := counts(t, e, tab, &Request{Type: "t"}, 100); got["fraud@v8"] != 0 {
		t.Fatalf("open breaker: %v", got)
	}
	// a canary that does not meet the task's constraints leaves it to the
	// incumbent
	slow := snapshot(map[string]stats.Series{
		"fraud@v7": series(1000, 10, time.Millisecond, 0),
		"fraud@v8": series(1000, 0, 50*time.Millisecond, 0),
	})
	tab = NewTable(slow, []protocol.Heartbeat{hb("n1", "t", 64, "fraud@v7", "fraud@v8")}, t0)
	if got := counts(t, e, tab, &Request{Type: "t", MaxLatencyMs: 10}, 100); got["fraud@v7"] != 100 {
		t.Fatalf("constraints: %v", got)
	}
	// only the capped version is live: the task is not sent beyond the cap
	tab = NewTable(snapshot(nil), []protocol.Heartbeat{hb("n1", "t", 64, "fraud@v8")}, t0)
	e.SetSplits([]*Split{NewSplit("fraud@v8", 0)})
	if _, err := e.Decide(tab, &Request{Type: "t"}); protocol.CodeOf(err) != protocol.CodeUnknownModel {
		t.Fatalf("only the capped version live: %v", err)
	}
}

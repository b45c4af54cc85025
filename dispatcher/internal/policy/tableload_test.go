package policy

import (
	"testing"
	"time"

	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/shared/protocol"
)

// fastNode is a table at now of one node of 2 slots hosting m, a 10 ms
// model, whose heartbeat (sent at t0) announced running plus queued work.
func fastNode(t *testing.T, running, queued int, now time.Time) *Table {
	t.Helper()
	snap := snapshot(map[string]stats.Series{"m": series(100, 0, 10*time.Millisecond, 0)})
	snap.Models["m"].Nodes["n1"] = &snap.Models["m"].Series
	h := hb("n1", "t", 2, "m")
	h.InFlight, h.Queued = running, queued
	return NewTable(snap, []protocol.Heartbeat{h}, now)
}

// A heartbeat's work drains at the node's service rate: a table built
// 20 ms after a heartbeat that announced 6 attempts on 2 slots of a 10 ms
// model counts 2 of them, not 6 (issue 38: held for a second of tables).
func TestAnnouncedWorkDrainsAtTheNodesRate(t *testing.T) {
	if got := fastNode(t, 2, 4, t0).NodeWork("n1"); got != 6 {
		t.Fatalf("at the heartbeat: %d, want the 6 it announced", got)
	}
	if got := fastNode(t, 2, 4, t0.Add(20*time.Millisecond)).NodeWork("n1"); got < 1 || got > 3 {
		t.Fatalf("20 ms later: %d, want about 2 (6 less 20 ms × 2 slots / 10 ms)", got)
	}
	if got := fastNode(t, 2, 4, t0.Add(time.Second)).NodeWork("n1"); got != 0 {
		t.Fatalf("a second later: %d, want 0", got)
	}
	// a heartbeat from a clock ahead of ours is taken as it is
	if got := fastNode(t, 2, 4, t0.Add(-time.Second)).NodeWork("n1"); got != 6 {
		t.Fatalf("heartbeat dated after now: %d, want 6", got)
	}
}

// Shared counts another replica's changes like this process's own, without
// sharing them again, and keeps the full count right for batches.
func TestSharedCountsAnotherReplicasChanges(t *testing.T) {
	tb := fastNode(t, 0, 0, t0)
	var told []int64
	tb.ShareWith(func(model, node string, d int64) { told = append(told, d) })
	tb.Shared("m", "n1", 3)
	if got := tb.NodeWork("n1"); got != 3 {
		t.Fatalf("after another replica's 3 dispatches: %d, want 3", got)
	}
	if got := tb.full.Load(); got != 1 {
		t.Fatalf("full %d after the node passed its 2 slots, want 1", got)
	}
	tb.Dispatched("m", "n1")
	tb.Completed("m", "n1")
	tb.Shared("m", "n1", -3)
	if got := tb.NodeWork("n1"); got != 0 {
		t.Fatalf("after 3 settled elsewhere: %d, want 0", got)
	}
	if got := tb.full.Load(); got != 0 {
		t.Fatalf("full %d with the node empty, want 0", got)
	}
	if len(told) != 2 || told[0] != 1 || told[1] != -1 {
		t.Fatalf("shared %v, want only this process's own [1 -1]", told)
	}
	tb.Shared("nope", "n9", 5) // unknown pair: nothing to count, no panic
}

// Carry starts a table from the one before: a snapshot that misreads a
// node (its writers' last 50 ms missing) moves the count a quarter of the
// way, and repeated readings are followed.
func TestCarryFollowsTheSnapshotsSlowly(t *testing.T) {
	prev := fastNode(t, 0, 0, t0)
	prev.Dispatched("m", "n1") // prev counts 1, exact
	snap := snapshot(map[string]stats.Series{"m": series(100, 0, 10*time.Millisecond, 0)})
	ns := snap.Models["m"].Series
	ns.InFlight = 5 // the snapshot reads 5
	snap.Models["m"].Nodes["n1"] = &ns
	next := func(prev *Table) *Table {
		tb := NewTable(snap, []protocol.Heartbeat{hb("n1", "t", 2, "m")}, t0)
		tb.Carry(prev, t0)
		return tb
	}
	tb := next(prev)
	if got := tb.NodeWork("n1"); got != 2 {
		t.Fatalf("carried: %d, want 2 (a quarter of the way from 1 to 5)", got)
	}
	if tb.full.Load() != 1 {
		t.Fatalf("full %d at 2 of 2 slots, want 1", tb.full.Load())
	}
	for range 12 {
		tb = next(tb)
	}
	if got := tb.NodeWork("n1"); got != 5 {
		t.Fatalf("after 13 tables reading 5: %d, want 5", got)
	}
	if got := next(nil).NodeWork("n1"); got != 5 {
		t.Fatalf("no table before: %d, want the snapshot's 5", got)
	}
}

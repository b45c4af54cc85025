package bench

import (
	"testing"
	"time"
)

func TestTracker(t *testing.T) {
	t.Parallel()
	tr := newTracker("x-", 3, 1)
	base := time.Unix(100, 0)
	for i := range 3 {
		tr.sent[i].Store(base.UnixNano())
	}
	tr.complete("x-0", true, base.Add(1*time.Millisecond))
	tr.complete("x-0", false, base.Add(9*time.Millisecond)) // redelivery: ignored
	tr.complete("y-1", true, base)                          // another phase
	tr.complete("x-7", true, base)                          // out of range
	tr.complete("x-1", false, base.Add(2*time.Millisecond))
	select {
	case <-tr.all:
		t.Fatal("all closed with a task missing")
	default:
	}
	tr.complete("x-2", true, base.Add(3*time.Millisecond))
	select {
	case <-tr.all:
	default:
		t.Fatal("all not closed after every task completed")
	}
	if f, fo := tr.failed.Load(), tr.foreign.Load(); f != 1 || fo != 2 {
		t.Errorf("failed=%d foreign=%d, want 1 and 2", f, fo)
	}
	l := tr.latency()
	if l.P50 != 2 || l.Max != 3 || l.Mean != 2 {
		t.Errorf("latency %+v, want p50 2, max 3, mean 2", l)
	}
	tr.observe(0, "x-0", base.Add(time.Millisecond/2))
	tr.observe(0, "x-0", base.Add(time.Millisecond)) // later sightings do not count
	tr.observe(0, "zz", base)
	if h := tr.hop(-1, 0); h.Max != 0.5 {
		t.Errorf("submit to point 0: %+v, want 0.5ms", h)
	}
	if h := tr.hop(0, 1); h.Max != 0.5 || h.P50 != 0.5 {
		t.Errorf("point 0 to completion: %+v, want 0.5ms (one task)", h)
	}
	first, last, done := tr.span()
	if first != base.UnixNano() || last != base.UnixNano() || done != base.Add(3*time.Millisecond).UnixNano() {
		t.Errorf("span %d %d %d", first, last, done)
	}
}

func TestSummarizeQuantiles(t *testing.T) {
	t.Parallel()
	ns := make([]int64, 1000)
	for i := range ns {
		ns[i] = int64(1000-i) * 1e6 // 1..1000 ms, reversed
	}
	l := summarize(ns)
	if l.P50 != 500 || l.P90 != 900 || l.P99 != 990 || l.P999 != 999 || l.Max != 1000 {
		t.Errorf("summary %+v", l)
	}
	if (summarize(nil) != Latency{}) {
		t.Error("empty summary not zero")
	}
}

func TestTrackerFailedBecause(t *testing.T) {
	tr := newTracker("f-", 3, 0)
	now := time.Now()
	tr.failedBecause("f-0", "expired/expired")
	tr.complete("f-0", false, now)
	tr.failedBecause("f-0", "expired/none") // a second result: not counted again
	tr.complete("f-0", false, now)
	tr.failedBecause("g-1", "other phase")
	tr.failedBecause("f-1", "expired/none")
	tr.complete("f-1", false, now)
	tr.complete("f-2", true, now)
	p := tr.phase(nil)
	if p.Failed != 2 || len(p.FailedBy) != 2 || p.FailedBy["expired/expired"] != 1 || p.FailedBy["expired/none"] != 1 {
		t.Fatalf("failed %d by %v, want 2: one expired on the worker, one before dispatch", p.Failed, p.FailedBy)
	}
	if s := failedByString(p.FailedBy); s != " (expired/expired 1, expired/none 1)" {
		t.Fatalf("failedByString = %q", s)
	}
	if s := lateByString(map[string]int64{"waited for a batch": 2, "before dispatch": 1}); s != " [before dispatch 1, waited for a batch 2]" {
		t.Fatalf("lateByString = %q", s)
	}
	if s := lateByString(nil); s != "" {
		t.Fatalf("lateByString(nil) = %q, want nothing", s)
	}
}

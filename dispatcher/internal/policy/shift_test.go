package policy

import (
	"testing"
	"time"

	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/shared/protocol"
)

// withRecent returns s whose most recent buckets hold rs successes and rf
// failures, added to the window's counts (Recent is a part of the window).
func withRecent(s stats.Series, rs, rf int64) stats.Series {
	s.Successes += rs
	s.ModelErrors += rf
	for i := int64(0); i < rs; i++ {
		s.Latency.Observe(20 * time.Millisecond)
	}
	s.Recent = stats.Counts{Successes: rs, ModelErrors: rf}
	return s
}

// driftWorld: "alpha" has a minute of 99% behind it; "beta" is a 97% model
// measured by exploration only.
func driftWorld(alphaRecentOK, alphaRecentFail int64) (*stats.Snapshot, []protocol.Heartbeat) {
	snap := snapshot(map[string]stats.Series{
		"alpha": withRecent(series(5400, 55, 20*time.Millisecond, time.Millisecond), alphaRecentOK, alphaRecentFail),
		"beta":  withRecent(series(190, 6, 20*time.Millisecond, time.Millisecond), 10, 0),
	})
	return snap, []protocol.Heartbeat{hb("n1", "t", 8, "alpha", "beta"), hb("n2", "t", 8, "alpha", "beta")}
}

// A model reliable for the whole window whose recent buckets fail 40% of the
// time loses the lead at once, under reliability and thompson, although
// its window rate (98%) is still above the runner-up's.
func TestRecentFailuresLoseTheLead(t *testing.T) {
	t.Parallel()
	for _, pol := range []string{Reliability, Thompson} {
		t.Run(pol, func(t *testing.T) {
			t.Parallel()
			// steady: the recent buckets agree with the rest of the window
			snap, hbs := driftWorld(540, 5)
			tab := NewTable(snap, hbs, t0)
			if c := tab.Candidates("t")[0]; c.Model != "alpha" || c.Shifted {
				t.Fatalf("steady alpha: %+v, want not shifted", c)
			}
			e := engine(t, Config{Default: pol, ExploreShare: -1})
			if got := counts(t, e, tab, &Request{Type: "t"}, 1000); got["alpha"] < 950 {
				t.Fatalf("steady: %v, want alpha to lead", got)
			}
			// drift: 120 recent attempts, 40% failed (98% over the window)
			snap, hbs = driftWorld(72, 48)
			tab = NewTable(snap, hbs, t0)
			c := tab.Candidates("t")[0]
			if !c.Shifted || c.Successes != 72 || c.Failures != 48 {
				t.Fatalf("drifting alpha: %+v, want shifted to the recent 72/120", c)
			}
			if w := float64(snap.Models["alpha"].Successes) / float64(snap.Models["alpha"].Judged()); w < 0.98 {
				t.Fatalf("test setup: alpha's window rate %.3f should still look better than beta's", w)
			}
			if got := counts(t, e, tab, &Request{Type: "t"}, 1000); got["beta"] < 990 {
				t.Fatalf("drift: %v, want beta every time (thompson: nearly)", got)
			}
		})
	}
}

// Tens of recent failures are enough: the shift is found after about 20 of
// them among a hundred recent attempts.
func TestShiftNeedsFewRecentFailures(t *testing.T) {
	t.Parallel()
	snap, hbs := driftWorld(80, 20)
	if c := NewTable(snap, hbs, t0).Candidates("t")[0]; !c.Shifted {
		t.Fatalf("alpha with 20/100 recent failures: %+v, want shifted", c)
	}
	// chance: 2 recent failures in 100 at a 1% history is not a shift
	snap, hbs = driftWorld(98, 2)
	if c := NewTable(snap, hbs, t0).Candidates("t")[0]; c.Shifted {
		t.Fatalf("alpha with 2/100 recent failures: %+v, want not shifted", c)
	}
}

// After the bad period, a model whose recent buckets succeed again is
// judged on them although its window still holds the failures, and leads
// again once they are enough to beat the runner-up.
func TestRecoveryAfterBadPeriod(t *testing.T) {
	t.Parallel()
	bad := series(300, 200, 20*time.Millisecond, time.Millisecond) // 60% over the window
	snap := snapshot(map[string]stats.Series{
		"alpha": withRecent(bad, 400, 0),
		"beta":  series(1940, 60, 20*time.Millisecond, time.Millisecond), // 97%
	})
	hbs := []protocol.Heartbeat{hb("n1", "t", 8, "alpha", "beta")}
	tab := NewTable(snap, hbs, t0)
	if c := tab.Candidates("t")[0]; !c.Shifted || c.Failures != 0 || c.Rate < 0.99 {
		t.Fatalf("recovered alpha: %+v, want shifted to its recent 400/400", c)
	}
	for _, pol := range []string{Reliability, Thompson} {
		if got := counts(t, engine(t, Config{Default: pol, ExploreShare: -1}), tab, &Request{Type: "t"}, 500); got["alpha"] < 475 {
			t.Fatalf("%s: %v, want the recovered alpha to lead", pol, got)
		}
	}
	// without the recent successes it stays behind
	snap.Models["alpha"].Series = bad
	tab = NewTable(snap, hbs, t0)
	if got := counts(t, engine(t, Config{ExploreShare: -1}), tab, &Request{Type: "t"}, 100); got["beta"] != 100 {
		t.Fatalf("%v, want beta while alpha has only its bad record", got)
	}
}

// Attempts lost with a crashed node are reported all at once a deadline
// later; once the node has left the heartbeats they do not shift its
// model, which is fine on its other nodes.
func TestLostNodeDoesNotShiftModel(t *testing.T) {
	t.Parallel()
	snap, _ := driftWorld(300, 0)
	alpha := snap.Models["alpha"]
	alpha.Timeouts += 300 // the lost attempts of n1
	alpha.Recent.Timeouts = 300
	n1 := stats.Series{}
	n1.Timeouts, n1.Recent.Timeouts = 300, 300
	n2 := stats.Series{}
	n2.Successes, n2.Recent.Successes = 300, 300
	alpha.Nodes = map[string]*stats.Series{"n1": &n1, "n2": &n2}

	live := []protocol.Heartbeat{hb("n2", "t", 8, "alpha", "beta")}
	if c := NewTable(snap, live, t0).Candidates("t")[0]; c.Shifted {
		t.Fatalf("alpha after n1 died: %+v, want not shifted", c)
	}
	// while n1 is still announced, its failures are the model's
	both := append(live, hb("n1", "t", 8, "alpha", "beta"))
	if c := NewTable(snap, both, t0).Candidates("t")[0]; !c.Shifted {
		t.Fatalf("alpha failing on a live node: %+v, want shifted", c)
	}
}

// Reliability ranks by a one-sided 90% lower bound: a newcomer with 45
// straight successes overtakes a well-measured 96% incumbent, 30 do not
// (TestReliabilityExploresPlausiblyBetter), nor do 3 against 970/1000
// (TestReliabilityPrefersWellMeasured).
func TestReliabilityNewcomerLeadsAfterFewDozen(t *testing.T) {
	t.Parallel()
	snap := snapshot(map[string]stats.Series{
		"incumbent": series(5760, 240, 100*time.Millisecond, time.Millisecond),
		"newcomer":  series(45, 0, 100*time.Millisecond, 0),
	})
	tab := NewTable(snap, []protocol.Heartbeat{hb("n1", "t", 8, "incumbent", "newcomer")}, t0)
	if got := counts(t, engine(t, Config{ExploreShare: -1}), tab, &Request{Type: "t"}, 100); got["newcomer"] != 100 {
		t.Fatalf("%v: want the newcomer with 45/45 to lead", got)
	}
}

package policy

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/shared/protocol"
)

func constraintsTable() *Table {
	snap := snapshot(map[string]stats.Series{
		"precise": series(990, 10, 300*time.Millisecond, time.Millisecond), // p95 ≈ 300ms
		"quick":   series(900, 100, 20*time.Millisecond, time.Millisecond), // p95 ≈ 20ms
		"sloppy":  series(600, 400, 5*time.Millisecond, time.Millisecond),  // p95 ≈ 5ms
	})
	return NewTable(snap, []protocol.Heartbeat{hb("n1", "t", 8, "precise", "quick", "sloppy", "unmeasured")}, t0)
}

func TestMaxLatencyPicksMostReliableThatFits(t *testing.T) {
	t.Parallel()
	e := engine(t, Config{ExploreShare: -1})
	tab := constraintsTable()
	if got := counts(t, e, tab, &Request{Type: "t"}, 50); got["precise"] != 50 {
		t.Fatalf("unconstrained: %v", got)
	}
	got := counts(t, e, tab, &Request{Type: "t", MaxLatencyMs: 100}, 50)
	if got["quick"] != 50 {
		t.Fatalf("max_latency_ms=100: %v, want quick", got)
	}
	// a model with no latency data is allowed: with only it and precise
	// allowed and precise too slow, the unmeasured one is chosen
	got = counts(t, e, tab, &Request{Type: "t", MaxLatencyMs: 100, Models: []string{"precise", "unmeasured"}}, 20)
	if got["unmeasured"] != 20 {
		t.Fatalf("a model without latency data should be allowed: %v", got)
	}
}

func TestMinSuccessRate(t *testing.T) {
	t.Parallel()
	e := engine(t, Config{Default: Latency, ExploreShare: -1})
	tab := constraintsTable()
	got := counts(t, e, tab, &Request{Type: "t", MinSuccessRate: 0.8}, 50)
	if got["quick"] != 50 {
		t.Fatalf("min_success_rate=0.8 with latency policy: %v, want quick", got)
	}
}

func TestConstraintsExplainEachCandidate(t *testing.T) {
	t.Parallel()
	e := engine(t, Config{})
	tab := constraintsTable()
	for _, pol := range Names {
		e := engine(t, Config{Default: pol})
		_, err := e.Decide(tab, &Request{Type: "t", MaxLatencyMs: 10, MinSuccessRate: 0.95})
		if protocol.CodeOf(err) != protocol.CodeConstraints {
			t.Fatalf("%s: err %v, want %s", pol, err, protocol.CodeConstraints)
		}
	}
	_, err := e.Decide(tab, &Request{Type: "t", MaxLatencyMs: 10, MinSuccessRate: 0.95})
	msg := err.Error()
	for _, want := range []string{
		"precise: p95 ", "exceeds max_latency_ms 10",
		"quick: p95 ", "success rate 0.899 (900/1000) below min_success_rate 0.95",
		"sloppy: success rate 0.600",
		"unmeasured: success rate 0.500 (0/0)",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q lacks %q", msg, want)
		}
	}
	// sloppy fits the latency budget: only its rate is named
	if strings.Contains(msg, "sloppy: p95") {
		t.Errorf("message blames sloppy's latency: %q", msg)
	}
	var pe *protocol.Error
	if !errors.As(err, &pe) {
		t.Fatalf("not a *protocol.Error: %T", err)
	}
}

func TestAllowList(t *testing.T) {
	t.Parallel()
	e := engine(t, Config{ExploreShare: -1})
	tab := constraintsTable()
	got := counts(t, e, tab, &Request{Type: "t", Models: []string{"sloppy", "gone"}}, 50)
	if got["sloppy"] != 50 {
		t.Fatalf("allow-list: %v", got)
	}
	// constraints are explained only for allowed models
	_, err := e.Decide(tab, &Request{Type: "t", Models: []string{"sloppy"}, MinSuccessRate: 0.99})
	if protocol.CodeOf(err) != protocol.CodeConstraints || strings.Contains(err.Error(), "precise") {
		t.Fatalf("err %v", err)
	}
}

func TestNoModelAndUnknownModel(t *testing.T) {
	t.Parallel()
	e := engine(t, Config{})
	tab := constraintsTable()

	_, err := e.Decide(tab, &Request{Type: "other", Models: []string{"x"}})
	if !errors.Is(err, protocol.ErrNoModel) || !strings.Contains(err.Error(), `"other"`) || !strings.Contains(err.Error(), "allow-list: x") {
		t.Fatalf("no model: %v", err)
	}
	_, err = e.Decide(nil, &Request{Type: "t"})
	if !errors.Is(err, protocol.ErrNoModel) {
		t.Fatalf("nil table: %v", err)
	}
	_, err = e.Decide(NewTable(nil, nil, t0), &Request{Type: "t"})
	if !errors.Is(err, protocol.ErrNoModel) {
		t.Fatalf("empty table: %v", err)
	}
	_, err = e.Decide(tab, &Request{Type: "t", Models: []string{"ghost", "phantom"}})
	if !errors.Is(err, protocol.ErrUnknownModel) || !strings.Contains(err.Error(), "ghost, phantom") {
		t.Fatalf("unknown model: %v", err)
	}
	// a model served for another type only is unknown for this one
	tab2 := NewTable(nil, []protocol.Heartbeat{hb("n1", "t", 1, "m1"), hb("n2", "u", 1, "m2")}, t0)
	_, err = e.Decide(tab2, &Request{Type: "t", Models: []string{"m2"}})
	if !errors.Is(err, protocol.ErrUnknownModel) {
		t.Fatalf("model of another type: %v", err)
	}
}

func TestDrainingNodesAreLeftOut(t *testing.T) {
	t.Parallel()
	e := engine(t, Config{})
	d1 := hb("n1", "t", 4, "m")
	d1.Draining = true
	tab := NewTable(nil, []protocol.Heartbeat{d1}, t0)
	if _, err := e.Decide(tab, &Request{Type: "t"}); !errors.Is(err, protocol.ErrNoModel) {
		t.Fatalf("draining only: %v", err)
	}
	tab = NewTable(nil, []protocol.Heartbeat{d1, hb("n2", "t", 4, "m")}, t0)
	for i := 0; i < 50; i++ {
		d, err := e.Decide(tab, &Request{Type: "t"})
		if err != nil || d.Node != "n2" {
			t.Fatalf("decision %+v, %v: want n2", d, err)
		}
	}
}

func TestAllowListFamilyAndPinnedVersion(t *testing.T) {
	t.Parallel()
	e := engine(t, Config{ExploreShare: -1})
	tab := NewTable(snapshot(map[string]stats.Series{
		"fraud@v7": series(100, 0, time.Millisecond, 0),
		"fraud@v8": series(100, 0, time.Millisecond, 0),
		"fraudx":   series(100, 0, time.Millisecond, 0),
	}), []protocol.Heartbeat{hb("n1", "t", 4, "fraud@v7", "fraud@v8", "fraudx")}, t0)
	got := counts(t, e, tab, &Request{Type: "t", Models: []string{"fraud"}}, 400)
	if got["fraudx"] != 0 || got["fraud@v7"] == 0 || got["fraud@v8"] == 0 {
		t.Fatalf("family allow-list: %v, want both versions and never fraudx", got)
	}
	got = counts(t, e, tab, &Request{Type: "t", Models: []string{"fraud@v8"}}, 100)
	if got["fraud@v8"] != 100 {
		t.Fatalf("pinned version: %v", got)
	}
	if _, err := e.Decide(tab, &Request{Type: "t", Models: []string{"fraud@v9"}}); protocol.CodeOf(err) != protocol.CodeUnknownModel {
		t.Fatalf("unknown pinned version: %v", err)
	}
}

package policy

import (
	"testing"
	"time"

	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/shared/protocol"
)

func TestFailoverAvoidsTriedModels(t *testing.T) {
	t.Parallel()
	snap := snapshot(map[string]stats.Series{
		"best":   series(990, 10, time.Millisecond, time.Millisecond),
		"second": series(950, 50, time.Millisecond, time.Millisecond),
		"third":  series(900, 100, time.Millisecond, time.Millisecond),
	})
	hbs := []protocol.Heartbeat{hb("n1", "t", 4, "best", "second"), hb("n2", "t", 4, "best", "third")}
	tab := NewTable(snap, hbs, t0)
	for _, pol := range Names {
		e := engine(t, Config{Default: pol})
		for i := 0; i < 50; i++ {
			d, err := e.Decide(tab, &Request{Type: "t", Tried: []protocol.Attempt{{Model: "best", Node: "n1"}}})
			if err != nil || d.Model == "best" {
				t.Fatalf("%s: %+v %v: retried a tried model while others remain", pol, d, err)
			}
			d, err = e.Decide(tab, &Request{Type: "t", Tried: []protocol.Attempt{{Model: "best", Node: "n1"}, {Model: "second", Node: "n1"}}})
			if err != nil || d.Model != "third" {
				t.Fatalf("%s: %+v %v, want the untried third", pol, d, err)
			}
		}
	}
	e := engine(t, Config{ExploreShare: -1})
	d, err := e.Decide(tab, &Request{Type: "t", Tried: []protocol.Attempt{{Model: "best", Node: "n1"}}})
	if err != nil || d.Model != "second" {
		t.Fatalf("reliability failover: %+v %v, want second", d, err)
	}
}

func TestFailoverSameModelOtherNodeThenRepeat(t *testing.T) {
	t.Parallel()
	e := engine(t, Config{})
	tab := NewTable(nil, []protocol.Heartbeat{hb("n1", "t", 4, "only"), hb("n2", "t", 4, "only")}, t0)
	for i := 0; i < 20; i++ {
		d, err := e.Decide(tab, &Request{Type: "t", Tried: []protocol.Attempt{{Model: "only", Node: "n2"}}})
		if err != nil || d.Model != "only" || d.Node != "n1" {
			t.Fatalf("%+v %v, want only on the untried n1", d, err)
		}
	}
	// both nodes tried: repeat
	tried := []protocol.Attempt{{Model: "only", Node: "n1"}, {Model: "only", Node: "n2"}}
	if d, err := e.Decide(tab, &Request{Type: "t", Tried: tried}); err != nil || d.Model != "only" {
		t.Fatalf("repeat: %+v %v", d, err)
	}

	// a tried model with an untried node beats repeating a model on a tried
	// node: a on n1 and b on n1 tried, b also on n2 → b on n2
	tab = NewTable(nil, []protocol.Heartbeat{hb("n1", "t", 4, "a", "b"), hb("n2", "t", 4, "b")}, t0)
	tried = []protocol.Attempt{{Model: "a", Node: "n1"}, {Model: "b", Node: "n1"}}
	for i := 0; i < 20; i++ {
		if d, err := e.Decide(tab, &Request{Type: "t", Tried: tried}); err != nil || d.Model != "b" || d.Node != "n2" {
			t.Fatalf("%+v %v, want b on n2", d, err)
		}
	}
}

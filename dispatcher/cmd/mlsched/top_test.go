package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/mlsched/mlsched/dispatcher/autoscale"
	"github.com/mlsched/mlsched/dispatcher/clusterview"
	"github.com/mlsched/mlsched/shared/protocol"
)

// top says a model is unready in its status line, names it, its node and
// why, and shows each node's heartbeat age (issue 22: top said "healthy"
// and left the unready model out).
func TestTopShowsUnreadyModels(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	v := clusterview.Merge([]protocol.StatsReport{{Dispatcher: "d1", Store: "memory", SnapshotAt: now, Window: time.Minute,
		Nodes: []protocol.Heartbeat{{Node: "n1", Capacity: 8, SentAt: now.Add(-1500 * time.Millisecond),
			Models:  []protocol.ModelInfo{{Name: "echo", Types: []string{"echo"}}},
			Unready: []protocol.UnreadyModel{{Name: "remote", Types: []string{"classify"}, Reason: "connection refused"}}}}}}, now)
	var b bytes.Buffer
	renderView(&b, v, now)
	out := b.String()
	for _, want := range []string{"unready: remote", "unready remote on n1: connection refused", "1.5s ago", "remote(unready)"} {
		if !strings.Contains(out, want) {
			t.Errorf("top lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "healthy") {
		t.Errorf("top says healthy with an unready model:\n%s", out)
	}
}

// top shows each pool's replicas, the autoscaler's recommendation and why.
func TestTopShowsAutoscaleDecisions(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	v := clusterview.Merge(nil, now)
	v.Autoscale = []autoscale.Decision{{Pool: "worker", Current: 3, Target: 7, Needed: 9, At: now.Add(-4 * time.Second),
		Reason: "scale up 3→7: needs 70.0 slots"}}
	var b bytes.Buffer
	renderView(&b, v, now)
	out := b.String()
	for _, want := range []string{"POOL", "RECOMMENDED", "worker", "4s ago", "scale up 3→7: needs 70.0 slots"} {
		if !strings.Contains(out, want) {
			t.Errorf("top lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(out, "worker  3         7            9") {
		t.Errorf("top's pool row is not current 3, recommended 7, needed 9:\n%s", out)
	}
}

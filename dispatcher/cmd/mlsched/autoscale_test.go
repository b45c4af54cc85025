package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mlsched/mlsched/dispatcher/autoscaler"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// autoscale -dry-run -once, with no compose project, derives the pool from
// the workers' heartbeats, says what it would do and why, and publishes the
// recommendation in MLSCHED_AUTOSCALE for the dashboard and top.
func TestAutoscaleDryRunRecommendsFromHeartbeats(t *testing.T) {
	t.Parallel()
	srv := cluster(t)
	ctx := tctx(t)
	kv, err := topology.EnsureNodesBucket(ctx, srv.JS, topology.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var hbs []protocol.Heartbeat
	for _, n := range []string{"n1", "n2"} {
		hb := protocol.Heartbeat{Node: n, Capacity: 8, SentAt: time.Now(),
			Models: []protocol.ModelInfo{{Name: "steady", Types: []string{"classify"}}}}
		hbs = append(hbs, hb)
		data, _ := json.Marshal(hb)
		if _, err := kv.Put(ctx, n, data); err != nil {
			t.Fatal(err)
		}
	}
	// A dispatcher replica's report: classify tasks of 100 ms each finish
	// at 1000/s of real time, however late the scaler's polls come on a
	// loaded machine.
	start := time.Now()
	sub, err := srv.NC.Subscribe(protocol.SubjectAdminStats, func(m *nats.Msg) {
		r := protocol.StatsReport{Dispatcher: "d1", Nodes: hbs, SnapshotAt: time.Now(),
			Models:  []protocol.ModelReport{{Name: "steady", P50Ms: 100, SuccessRate: 1, TrafficShare: 1}},
			Types:   map[string]protocol.TypeCounts{"classify": {Succeeded: int64(time.Since(start).Seconds() * 1000)}},
			Backlog: map[string]int64{"classify": 0}}
		data, _ := json.Marshal(r)
		_ = m.Respond(data)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := srv.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	code, out, errs := cli(t, srv.URL, "", "autoscale", "-dry-run", "-once", "-backend", "heartbeats", "-interval", "1s", "-max", "20")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errs)
	}
	// ~1000 tasks/s of 100 ms at ρ 0.7: ~143 slots, 18 replicas of 8;
	// from 2, at most 2+4 this step.
	if !strings.Contains(out, "pool models:steady: would scale 2→6") || !strings.Contains(out, "scale up 2→6") ||
		!strings.Contains(out, "rate-limited") {
		t.Fatalf("dry run output lacks the decision and why:\n%s", out)
	}
	ds, err := autoscaler.ReadDecisions(ctx, srv.JS)
	if err != nil || len(ds) != 1 || ds[0].Pool != "models:steady" || ds[0].Target != 6 || ds[0].Current != 2 || ds[0].Needed < 15 {
		t.Fatalf("published decisions %+v (%v)", ds, err)
	}
}

func TestAutoscaleRejectsBadFlags(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"-min", "5", "-max", "2"}, {"-utilisation", "1.5"}, {"-interval", "0s"}, {"-policy", "magic"}, {"-http", "nope"},
		{"-cooldown", "-1s"},
	} {
		code, _, errs := cli(t, "nats://127.0.0.1:1", "", append([]string{"autoscale"}, args...)...)
		if code != exitUsage || !strings.Contains(errs, "mlsched autoscale:") {
			t.Errorf("%v: exit %d, want %d with a message; stderr %q", args, code, exitUsage, errs)
		}
	}
}

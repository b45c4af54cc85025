package simulate

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mlsched/mlsched/dispatcher/internal/policy"
)

// flowRun runs a flow-control scenario under reliability (and the oracle)
// and returns the two results.
func flowRun(t *testing.T, sc *Scenario, tasks int, opt Options) (rel, orc *Result) {
	t.Helper()
	opt.Tasks, opt.Policies = tasks, []string{"reliability"}
	rep, err := Run(context.Background(), sc, opt)
	if err != nil {
		t.Fatal(err)
	}
	rel, orc = rep.Get("reliability"), rep.Get(Oracle)
	for _, r := range []*Result{rel, orc} {
		fc := r.FlowControl
		if fc == nil {
			t.Fatalf("%s: no flow-control figures", r.Policy)
		}
		// The dispatcher's invariants, under every policy.
		if fc.Inversions != 0 || fc.StartedLate != 0 || fc.ShedInversions != 0 {
			t.Errorf("%s: %d inversions, %d attempts started after their deadline, %d shedding inversions; want 0, 0 and 0",
				r.Policy, fc.Inversions, fc.StartedLate, fc.ShedInversions)
		}
		for _, f := range fc.Flows {
			t.Logf("%s %s: %d tasks, success %.2f%%, p50/p95/p99 %.0f/%.0f/%.0f ms, shed %d, expired %d, saturated %d, share %.1f%%",
				r.Policy, f.Flow, f.Tasks, f.Success*100, f.P50Ms, f.P95Ms, f.P99Ms, f.Shed, f.Expired, f.Saturated, f.Share*100)
		}
	}
	return rel, orc
}

func flowOf(t *testing.T, r *Result, name string) FlowResult {
	t.Helper()
	for _, f := range r.FlowControl.Flows {
		if f.Flow == name {
			return f
		}
	}
	t.Fatalf("%s: no flow %q", r.Policy, name)
	return FlowResult{}
}

// scaled divides a flow scenario's capacity and rate by k: the same
// overload with k times fewer events per simulated second (the tests run
// with -race on a shared machine).
func scaled(t *testing.T, name string, k int) *Scenario {
	t.Helper()
	sc, err := Load(name)
	if err != nil {
		t.Fatal(err)
	}
	sc.Arrival.Rate /= float64(k)
	sc.Nodes = append([]Node(nil), sc.Nodes...)
	for i := range sc.Nodes {
		sc.Nodes[i].Capacity /= k
	}
	return sc
}

// only keeps one flow of a scenario at its own rate: its solo baseline.
func only(sc *Scenario, name string) *Scenario {
	c := *sc
	var sum float64
	for _, f := range sc.Arrival.Flows {
		sum += f.Share
	}
	for _, f := range sc.Arrival.Flows {
		if f.Name == name {
			c.Arrival.Rate = sc.Arrival.Rate * f.Share / sum
			c.Arrival.Flows = []Flow{f}
		}
	}
	return &c
}

// TestPriorityOverload: at 2x overload the strict bands serve priority 5
// first (the targets: ≥ 99% succeed, ≥ 99% within the deadline),
// shed the sheddable first, and never start a task past its deadline.
func TestPriorityOverload(t *testing.T) {
	t.Parallel()
	sc := scaled(t, "priority-overload", 4)
	const tasks = 4000 // 25 s at 160/s
	rel, orc := flowRun(t, sc, tasks, Options{})
	for _, r := range []*Result{rel, orc} {
		u, n, s := flowOf(t, r, "urgent"), flowOf(t, r, "normal"), flowOf(t, r, "sheddable")
		if u.Success < 0.99 || u.WithinDeadline < 0.99 {
			t.Errorf("%s: priority 5 succeeded %.2f%%, %.2f%% within the deadline; want ≥ 99%% each", r.Policy, u.Success*100, u.WithinDeadline*100)
		}
		if !(u.Success >= n.Success && n.Success >= s.Success) {
			t.Errorf("%s: success by priority 5/0/-5 = %.3f/%.3f/%.3f, want strict bands (non-increasing)", r.Policy, u.Success, n.Success, s.Success)
		}
		if s.Shed == 0 || u.Shed != 0 || n.Shed != 0 {
			t.Errorf("%s: shed 5/0/-5 = %d/%d/%d, want only the sheddable", r.Policy, u.Shed, n.Shed, s.Shed)
		}
	}
	solo, _ := flowRun(t, only(sc, "urgent"), tasks/5, Options{})
	t.Logf("priority 5 p99: %.0f ms under overload, %.0f ms alone (%.2fx)", flowOf(t, rel, "urgent").P99Ms,
		flowOf(t, solo, "urgent").P99Ms, flowOf(t, rel, "urgent").P99Ms/flowOf(t, solo, "urgent").P99Ms)

	// Before issue 20's fix a held task saturated only by its own
	// deadline held back its type for the pass: the fix gives priority 0
	// the capacity priority 5 leaves. The oracle shows it in full (46% ->
	// 73%). Under reliability the old rule's loss came with timeouts:
	// attempts started with little of their deadline left and cut at it,
	// which opened the breakers; since a node no longer starts those
	// (nodequeue.go, as the worker since d02e923) it costs reliability
	// only a few points (74% -> 76%).
	old, oldOrc := flowRun(t, sc, tasks, Options{OwnDeadlineBlocks: true})
	for _, c := range []struct {
		old, now *Result
		gain     float64
	}{{old, rel, 0}, {oldOrc, orc, 0.10}} {
		before, after := flowOf(t, c.old, "normal").Success, flowOf(t, c.now, "normal").Success
		if after < before+c.gain {
			t.Errorf("%s: priority 0 success %.1f%% with the old rule, %.1f%% as the dispatcher now holds: want at least %.0f points more",
				c.now.Policy, before*100, after*100, c.gain*100)
		}
	}
}

// TestTenantFlood: tenant a floods at 10x capacity while b and c send 10%
// each. Under the dispatchers' pull bound (the default max_ack_pending,
// 2048 per band) tenant parking keeps a's backlog out of the band's pull
// window, so b and c are pulled at once and the hold keeps them near their
// solo latency; a still gets the rest of the capacity.
func TestTenantFlood(t *testing.T) {
	t.Parallel()
	sc := scaled(t, "tenant-flood", 4)
	const tasks = 6528 // 8 s of the flood
	rel, orc := flowRun(t, sc, tasks, Options{})
	solo, _ := flowRun(t, only(sc, "b"), 200, Options{})
	base := flowOf(t, solo, "b").P95Ms
	// the automatic queue target of the 50 ms model: 150 ms
	bound := base + float64(policy.AutoQueueTarget(50*time.Millisecond).Milliseconds())
	for _, r := range []*Result{rel, orc} {
		var share float64
		for _, name := range []string{"b", "c"} {
			f := flowOf(t, r, name)
			// The queue target (automatic: 3 x 50 ms) is what a task waits behind on a
			// node at most: bounded by it plus the solo latency.
			if f.Success < 0.999 || f.P95Ms > bound {
				t.Errorf("%s: tenant %s success %.2f%%, p95 %.0f ms against %.0f ms alone; want all and ≤ solo + 150 ms", r.Policy, name, f.Success*100, f.P95Ms, base)
			}
			share += f.Share
		}
		if a := flowOf(t, r, "a").Share; a < 0.75 || share > 0.25 {
			t.Errorf("%s: a got %.1f%% of the results, b and c %.1f%%: want a the rest (≥ 75%%)", r.Policy, a*100, share*100)
		}
	}
	// Without parking the flood's backlog waits in the stream in stream
	// order, and b and c behind it (docs/simulator.md: about 65 s at p95
	// in the full-size scenario).
	off := *sc
	off.ParkAbove = -1
	old, _ := flowRun(t, &off, tasks, Options{})
	t.Logf("parking off: b and c p95 %.0f and %.0f ms (alone %.0f ms); on: %.0f and %.0f ms",
		flowOf(t, old, "b").P95Ms, flowOf(t, old, "c").P95Ms, base, flowOf(t, rel, "b").P95Ms, flowOf(t, rel, "c").P95Ms)
}

// TestTenantWeights: three tenants saturating at weights 3:1:1 share the
// capacity 60/20/20 within ±5 points, the hold ordering by start tag as
// the dispatcher does; the old finish-tag order is logged.
func TestTenantWeights(t *testing.T) {
	t.Parallel()
	sc := scaled(t, "tenant-weights", 4)
	const tasks = 2400 // 10 s
	wide := *sc
	wide.MaxAckPending = 1_000_000
	rel, orc := flowRun(t, &wide, tasks, Options{})
	want := map[string]float64{"a": 0.6, "b": 0.2, "c": 0.2}
	for _, r := range []*Result{rel, orc} {
		for name, w := range want {
			if got := flowOf(t, r, name).Share; got < w-0.05 || got > w+0.05 {
				t.Errorf("%s: tenant %s share %.1f%%, want %.0f%% ± 5", r.Policy, name, got*100, w*100)
			}
		}
	}
	old, _ := flowRun(t, &wide, tasks, Options{FairByFinishTag: true})
	t.Logf("the old order (finish tags): shares a/b/c %.1f/%.1f/%.1f%%", flowOf(t, old, "a").Share*100,
		flowOf(t, old, "b").Share*100, flowOf(t, old, "c").Share*100)
}

// oneNode keeps one of a flow scenario's two nodes, at half the rate: the
// same overload and the same node queue (8 slots, the automatic
// queue target), with half the events.
func oneNode(t *testing.T, name string) *Scenario {
	t.Helper()
	sc, err := Load(name)
	if err != nil {
		t.Fatal(err)
	}
	sc.Arrival.Rate /= 2
	sc.Nodes = sc.Nodes[:1]
	return sc
}

// TestNodeOrder: a node starts what it was sent highest priority first and
// tenants in turn (nodequeue.go, as worker/slots.go does), so a quiet
// tenant's task, or an urgent one, no longer waits behind the work the
// dispatcher already sent the node. In arrival order (prefetch -1) it waits
// more than one service time (50 ms) beyond its latency alone, behind the
// queue target's worth of others' work; in the node's order, less.
func TestNodeOrder(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		scenario, flow string
		tasks          int
		p99            bool // compare p99 (else p95)
	}{
		{"tenant-flood", "b", 6528, false},          // 4 s of the flood
		{"priority-overload", "urgent", 4000, true}, // 12.5 s
	} {
		sc := oneNode(t, c.scenario)
		off := *sc
		off.Prefetch = -1
		q := func(r *Result) float64 {
			f := flowOf(t, r, c.flow)
			if c.p99 {
				return f.P99Ms
			}
			return f.P95Ms
		}
		solo, _ := flowRun(t, only(sc, c.flow), 400, Options{})
		rel, orc := flowRun(t, sc, c.tasks, Options{})
		relOff, orcOff := flowRun(t, &off, c.tasks, Options{})
		base, service := q(solo), 50.0
		for _, r := range [][2]*Result{{rel, relOff}, {orc, orcOff}} {
			on, off := q(r[0]), q(r[1])
			t.Logf("%s: %s %s %.0f ms in the node's order, %.0f ms in arrival order, %.0f ms alone",
				c.scenario, r[0].Policy, c.flow, on, off, base)
			if on > base+service || off <= base+service {
				t.Errorf("%s: %s %s %.0f ms in the node's order, %.0f ms in arrival order, %.0f ms alone: want within one service time (%.0f ms) of alone in the node's order only",
					c.scenario, r[0].Policy, c.flow, on, off, base, service)
			}
		}
	}
}

// TestNodeOrderOneFlowIsArrivalOrder: with one priority and one tenant the
// node's order is arrival order whatever the prefetch, so the output is
// byte for byte the simulator's FIFO queue's (prefetch -1), a short
// prefetch (most of the queue in the node's stream) included.
func TestNodeOrderOneFlowIsArrivalOrder(t *testing.T) {
	t.Parallel()
	deadlines := scaled(t, "priority-overload", 4) // 2x overload, every task priority 0 with a 5 s deadline
	deadlines.Name, deadlines.Arrival.Flows = "priority-overload's priority 0", deadlines.Arrival.Flows[1:2]
	overload, err := Load("overload") // no flows: the oracle queues seconds of work
	if err != nil {
		t.Fatal(err)
	}
	for _, sc := range []*Scenario{deadlines, overload} {
		out := func(prefetch int) string {
			c := *sc
			c.Prefetch = prefetch
			rep, err := Run(context.Background(), &c, Options{Tasks: tasksFor(t, 4000), Seed: 3})
			if err != nil {
				t.Fatal(err)
			}
			var b bytes.Buffer
			if err := rep.WriteJSON(&b); err != nil {
				t.Fatal(err)
			}
			return b.String()
		}
		want := out(-1)
		for _, prefetch := range []int{1, 32} {
			if out(prefetch) != want {
				t.Errorf("%s: prefetch %d differs from arrival order", sc.Name, prefetch)
			}
		}
	}
}

// TestNodeQueueOrder holds the node's order with worker/slots_test.go's
// case: a node of one slot, busy, is sent these dispatches in turn, and
// each slot freed starts the next. Priority first; within a priority
// tenants in turn (b1 after one of a's, not behind all three); an urgent
// start does not move a band's turn. With prefetch 3 the node orders only
// the three it has taken, the rest waiting in its stream in arrival order;
// with -1, arrival order.
func TestNodeQueueOrder(t *testing.T) {
	t.Parallel()
	type req struct {
		prio         int
		tenant, name string
	}
	reqs := []req{{0, "a", "a1"}, {0, "a", "a2"}, {0, "a", "a3"}, {9, "a", "u1"}, {0, "b", "b1"}, {0, "b", "b2"},
		{-5, "c", "c1"}, {0, "c", "c2"}, {9, "b", "u2"}}
	for _, c := range []struct {
		prefetch int
		want     string
	}{
		{32, "u1 u2 a1 b1 c2 a2 b2 a3 c1"},
		{3, "a1 u1 b1 a2 b2 c2 u2 a3 c1"},
		{-1, "a1 a2 a3 u1 b1 b2 c1 c2 u2"},
	} {
		sc, err := ParseScenario([]byte(minimal))
		if err != nil {
			t.Fatal(err)
		}
		sc.Prefetch, sc.Nodes[0].Capacity = c.prefetch, 1
		s, err := newSim(sc, Options{}.withDefaults(sc), Oracle)
		if err != nil {
			t.Fatal(err)
		}
		n := s.nodes[0]
		var sent []*attempt
		for i, r := range append([]req{{0, "x", "busy"}}, reqs...) {
			sent = append(sent, &attempt{t: &task{idx: i, priority: r.prio, tenant: r.tenant}, n: 1, model: "m", node: n, deadline: time.Hour})
			s.toNode(sent[i])
		}
		var got []string
		for range reqs {
			n.running-- // a slot frees
			s.startQueued(n)
			for i, a := range sent[1:] {
				if a.state == stRunning && !slices.Contains(got, reqs[i].name) {
					got = append(got, reqs[i].name)
				}
			}
		}
		if g := strings.Join(got, " "); g != c.want {
			t.Errorf("prefetch %d: started %s, want %s", c.prefetch, g, c.want)
		}
	}
}

// TestNodeOrderKeepsPriorityZero: under reliability the node's order cost
// priority 0 a third of its successes (a held task sent with little of its
// deadline left was overtaken at the node, started late and cut at its
// deadline: timeouts charged to the model, which opened its breaker). The
// dispatcher's ahead credit and the worker's refusal to start a dispatch
// with less than its model's mean run left (flow.go, nodequeue.go) bring
// it back within a few points of arrival order. One node of 8 slots at
// half the rate, 25 s: 64.7% against 76.1% before them, 75.2% against
// 77.0% with them.
func TestNodeOrderKeepsPriorityZero(t *testing.T) {
	t.Parallel()
	sc := oneNode(t, "priority-overload")
	off := *sc
	off.Prefetch = -1
	const tasks = 8000
	on, _ := flowRun(t, sc, tasks, Options{})
	fifo, _ := flowRun(t, &off, tasks, Options{})
	o, f := flowOf(t, on, "normal").Success, flowOf(t, fifo, "normal").Success
	if o < f-0.05 {
		t.Errorf("reliability: priority 0 succeeded %.1f%% in the node's order, %.1f%% in arrival order: want within 5 points", o*100, f*100)
	}
}

// TestAheadOnOrderingNode: while tenant a's tasks are held and the node's
// queue is past the queue target, a task of tenant b goes first (none of
// b's held): it is sent at once, the engine counting one slot's wait on a
// node that orders its queue (Heartbeat.Prefetch, Request.Ahead) rather
// than the queue's. On a node in arrival order it waits in the hold, and
// so does another of a's tasks anywhere (behind a's held one).
func TestAheadOnOrderingNode(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		prefetch int
		tenant   string
		sent     bool
	}{{32, "b", true}, {-1, "b", false}, {32, "a", false}} {
		sc := oneNode(t, "tenant-flood")
		sc.Prefetch = c.prefetch
		s, err := newSim(sc, Options{Policies: []string{"reliability"}}.withDefaults(sc), "reliability")
		if err != nil {
			t.Fatal(err)
		}
		n := s.nodes[0]
		n.running = n.spec.Capacity
		for range 16 { // 8 running and 16 queued: beyond the automatic queue target (unmeasured: 3 x 100 ms)
			n.stream = append(n.stream, &attempt{t: &task{tenant: "a"}, model: "m50", node: n, deadline: time.Hour})
		}
		if err := s.dec.refresh(context.Background(), s.clock(), s.heartbeats()); err != nil {
			t.Fatal(err)
		}
		s.tasks = make([]taskResult, 2)
		s.hold(&task{idx: 0, typ: "flow", tenant: "a", waitFrom: -1})
		tk := &task{idx: 1, typ: "flow", tenant: c.tenant, waitFrom: -1}
		if err := s.dispatchFlow(context.Background(), tk, false); err != nil {
			t.Fatal(err)
		}
		if sent := !tk.counted && n.queued() == 17; sent != c.sent {
			t.Errorf("prefetch %d, tenant %s: sent %v (held %v, %d queued), want sent %v", c.prefetch, c.tenant, sent, tk.counted, n.queued(), c.sent)
		}
	}
}

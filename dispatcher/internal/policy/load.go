package policy

import (
	"cmp"
	"math"
	"slices"
	"time"

	"github.com/mlsched/mlsched/dispatcher/stats"
)

// The load model: how long a new attempt on a (model, node) waits before it
// starts, and how likely it is to start and finish before its deadline.
//
// Per node it knows
//   - the slots: the node's capacity, and a model's own MaxConcurrency there;
//     a batching model (ModelInfo.BatchMaxSize b) runs up to b attempts per
//     slot in one call, so its slots there count b times: its throughput
//     on the node is its batch throughput, and the queue it may be sent
//     fills its batches instead of holding it to one attempt per slot;
//   - the work sent and not finished: the larger of the heartbeat's running
//     plus queued and the snapshot's in-flight (every replica's dispatches
//     when the statistics are shared), plus this process's dispatches minus
//     the outcomes it received since the table was built;
//   - the service time: the mean time an attempt occupied a slot there
//     (successes and failures, over the window).
//
// With c slots, o attempts outstanding and a service time s, a new attempt
// has k = o+1-c attempts ahead of it once every slot is busy; slots free up
// at a rate of c/s, so it waits W = k·s/c on average, with a variance of
// k·(s/c)² (exponential service). It finishes in time when W + s fits in
// the deadline D: P(in time) = Φ((D - s - W) / σ_W). A decision weighs each
// candidate by its best node's
//
//	fit = P(in time)
//
// a probability of success like the model's own, which it multiplies.
// Where a task may queue is the queue target's business (below): a pair
// past it is saturated, and nothing is sent there while another candidate
// is not. The target already keeps a node's queue to what keeps its slots
// busy, so a wait within it costs nothing. Until issue 42 the fit also
// charged the wait, × exp(-(W+E)/T) with T the timeout and E a slow
// node's extra service time; under the target that only spilled bursts
// to less reliable models with free slots (docs/simulator.md, "Where
// reliability lost on them").

// defaultServiceUs is the service time assumed where nothing has been
// measured yet (µs).
const defaultServiceUs = 100_000

// The queue target (Config.QueueTarget; docs/policies.md, "The queue
// target"). Flow control orders only what the caller still holds: work
// already queued on a node runs in the node's order, so every queued
// attempt beyond what keeps the slots busy is a place a more urgent task,
// or a quieter tenant's, cannot take. A pair therefore counts as saturated
// once a new attempt would wait plus run longer than its target there.
//
// By default the target is targetServices of the pair's own service time
// (the model's mean attempt time on that node over the statistics
// window): W + s <= 3s means a wait of at most two service times, about
// 2c attempts queued on a node of c slots whatever the model's speed. One
// service time of queue is what the slots finish before a dispatcher can
// refill them after an outcome (the outcome's path, a hold pass, the
// dispatch's path); the second absorbs the replicas' stale view of the
// node between table refreshes and the spread of service times, so that
// the slots never idle while the hold has work (shorter targets starved
// the nodes in the simulator: docs/policies.md). Because it is counted in
// service times, it follows each model on each node: a 10 ms model's
// nodes queue about 20 ms of work, a 500 ms model's about a second, and a
// model that slows from 50 ms to 200 ms has its target grow with its
// window's mean instead of finding every node saturated.
const (
	targetServices = 3
	// minTargetUs is the least automatic target: below about 20 ms the
	// dispatch's own path (publish, the node's fetch, a hold pass every
	// 5 ms at most) is as long as the queue, and a very fast model's
	// nodes would idle between refills.
	minTargetUs = 20_000
	// targetSamples: a pair with fewer judged attempts in the window has a
	// service time borrowed from its model's other nodes, or the table's
	// mean, or defaultServiceUs; its target is then at least
	// fewSamplesFloor of the attempt's timeout (at most maxFewFloorUs),
	// so that a guess too short does not hold back a new model or node
	// before it has been measured.
	targetSamples   = 20
	fewSamplesFloor = 0.1
	maxFewFloorUs   = 1_000_000
)

// autoTarget is p's automatic queue target in µs for an attempt timeout
// of timeoutUs.
func (p *pairState) autoTarget(timeoutUs float64) float64 {
	t := max(targetServices*p.serviceUs, minTargetUs)
	if p.judged < targetSamples {
		t = max(t, min(fewSamplesFloor*timeoutUs, maxFewFloorUs))
	}
	return t
}

// Queue is what the load model says of one candidate for one decision: its
// best node's figures.
type Queue struct {
	// Fit is what the reliability policies multiply a model's success rate
	// by: the probability that an attempt sent now starts and finishes
	// before its deadline (InTime), 1 when a slot is free. Where the task
	// may queue is the queue target's business (Saturated), not Fit's.
	Fit float64
	// InTime is the probability to start and finish before the deadline.
	InTime float64
	// WaitUs is the expected wait before the attempt starts, in µs.
	WaitUs float64
	// Saturated: even the best node's queue cannot be started and finished
	// before the deadline (or, with max_latency_ms or min_success_rate, the
	// queue alone breaks the task's constraint).
	Saturated bool
}

var free = Queue{Fit: 1, InTime: 1}

// hasSlot reports whether a new attempt on p starts at once.
func (p *pairState) hasSlot() bool {
	n := p.node
	return n.inFlight+n.local.Load() < int64(n.capacity)*p.batch && (p.limit == 0 || p.sent+p.local.Load() < int64(p.limit)*p.batch)
}

// wait is the expected wait before a new attempt on p starts, and its
// variance (µs, µs²). An attempt that goes first (Request.Ahead) on a node
// that orders its queue, while the node's work fits its share of the
// node's ordered room (share of the prefetch, aheadShare; 0: no credit),
// waits only for the next free slot. A model's own limit is a queue in
// arrival order on the node: it gets no such credit.
func (p *pairState) wait(share float64) (w, v float64) {
	n := p.node
	c := float64(n.capacity) * float64(p.batch)
	o := float64(n.outstanding())
	if share > 0 && p.limit == 0 && n.prefetch > 0 && o < c+share*float64(n.prefetch) {
		o = min(o, c)
	}
	if ahead := o + 1 - c; ahead > 0 {
		s := n.serviceUs / c
		w, v = ahead*s, ahead*s*s
	}
	if p.limit > 0 {
		m := float64(p.limit) * float64(p.batch)
		if ahead := float64(p.outstanding()) + 1 - m; ahead > 0 {
			s := p.serviceUs / m
			if ahead*s > w {
				w, v = ahead*s, ahead*s*s
			}
		}
	}
	return w, v
}

// budget is a decision's deadline and timeout, in µs, whether the task
// goes first where it is sent (Request.Ahead), and the queue target: > 0 a
// fixed one in µs, 0 each pair's automatic one, < 0 none.
type budget struct {
	deadline, timeout float64
	target            float64
	// ahead is the share of a node's ordered room the attempt's credit
	// may use (aheadShare), 0 without Request.Ahead.
	ahead float64
}

// aheadShare is the share of a node's ordered room (its prefetch) a task
// of the priority that goes first over lower bands only may fill: all of
// it for the high band, half for the normal band, a quarter for the low
// band (one that leads held tasks of its own band, a quiet tenant's, has
// all of it: Request.AheadInBand). A band's tasks lead while only lower
// bands are held; under an overload of that
// band alone they lead at its whole rate until its first is held, and
// with the whole room theirs they filled a 10 ms model's node to its
// capacity plus prefetch (34 attempts, five queue targets), so that the
// next priority-5 task found no room left, was held, and waited for the
// replica's view of the node to drain (a snapshot interval, 250 ms:
// 3.0x its p99 alone). The room kept back is what a higher band's tasks
// still go first into.
func aheadShare(priority int) float64 {
	switch {
	case priority > 0:
		return 1
	case priority < 0:
		return 0.25
	}
	return 0.5
}

// limit is what a new attempt on p must start and finish within: the
// deadline, or p's queue target if shorter.
func (b budget) limit(p *pairState) float64 {
	switch {
	case b.target < 0:
		return b.deadline
	case b.target > 0:
		return min(b.deadline, b.target)
	}
	return min(b.deadline, p.autoTarget(b.timeout))
}

// queue applies the load model to one (model, node).
func (p *pairState) queue(b budget) Queue {
	w, v := p.wait(b.ahead)
	if w == 0 {
		if p.extraUs == 0 {
			return free
		}
		return Queue{Fit: 1, InTime: 1, Saturated: p.serviceUs >= b.limit(p)}
	}
	// The queue target (limit) gates where the task may go; only the
	// deadline decides whether it succeeds. A wait within the target costs
	// a well-measured model nothing: charging it (a factor exp(-wait/timeout)
	// until issue 42) spilled bursts to a less reliable model whenever its
	// slots were free, which on the Azure code trace cost thompson 0.16
	// points of first-attempt success against the oracle (docs/simulator.md).
	in := 0.5 * math.Erfc(-(b.deadline-p.serviceUs-w)/math.Sqrt(2*v))
	return Queue{Fit: in, InTime: in, WaitUs: w, Saturated: b.limit(p)-p.serviceUs-w <= 0}
}

// saturated reports whether a new attempt on p would not start and finish
// before the deadline, on average (Queue.Saturated without the rest).
func (p *pairState) saturated(b budget) bool {
	if p.hasSlot() {
		return p.serviceUs >= b.limit(p)
	}
	w, _ := p.wait(b.ahead)
	return b.limit(p)-p.serviceUs-w <= 0
}

// cost is the expected time from now until an attempt sent to p now
// finishes (µs): its service time, plus the wait when the node (or the
// model's limit there) is full; with free slots, the service time scaled
// by how busy the node is, so that idle nodes are preferred.
func (p *pairState) cost() float64 {
	n := p.node
	o, c := float64(n.outstanding())+1, float64(n.capacity)*float64(p.batch)
	t := p.serviceUs * o / c
	if o > c {
		t = (o-c)*n.serviceUs/c + p.serviceUs
	}
	if p.limit > 0 {
		if po, m := float64(p.outstanding())+1, float64(p.limit)*float64(p.batch); po > m {
			t = max(t, (po-m)*p.serviceUs/m+p.serviceUs)
		}
	}
	return t
}

// queueOf is a candidate's best node (highest fit) among those its
// breakers let through (all of them in panic mode), with the task's
// constraints applied to the wait: a queue that alone breaks max_latency_ms
// or min_success_rate makes the candidate saturated for this task.
func (e *Engine) queueOf(tc *typeCand, budget budget, req *Request) Queue {
	// The node with the least delay (wait plus extra service time) is the
	// best; only its figures are computed in full.
	var pick *pairState
	delay := math.Inf(1)
	for pass := 0; pass < 2 && pick == nil; pass++ {
		for _, p := range tc.pairs {
			if pass == 0 && p.breaker.State == stats.BreakerOpen {
				continue
			}
			d := p.extraUs
			if !p.hasSlot() {
				w, _ := p.wait(budget.ahead)
				d += w
			} else if d == 0 {
				return free
			}
			if d < delay {
				pick, delay = p, d
			}
		}
	}
	if pick == nil {
		return Queue{Saturated: true}
	}
	best := pick.queue(budget)
	if best.WaitUs > 0 && !best.Saturated {
		c := &tc.m.Candidate
		if req.MaxLatencyMs > 0 && float64(c.P95)/float64(time.Microsecond)+best.WaitUs > float64(req.MaxLatencyMs)*1000 {
			best.Saturated = true
		}
		if req.MinSuccessRate > 0 && c.Rate*best.InTime < req.MinSuccessRate {
			best.Saturated = true
		}
	}
	return best
}

// budgetOf is the request's deadline and timeout in µs.
func (e *Engine) budgetOf(req *Request) budget {
	d, t := req.Deadline, req.Timeout
	if d <= 0 {
		d = e.cfg.Deadline
	}
	if t <= 0 {
		t = min(e.cfg.Timeout, d)
	}
	target := float64(e.cfg.QueueTarget) / float64(time.Microsecond)
	if req.FullDeadline || e.cfg.QueueTarget < 0 {
		target = -1
	}
	ahead := 0.0
	if req.Ahead {
		ahead = aheadShare(req.Priority)
		if req.AheadInBand {
			ahead = 1
		}
	}
	return budget{deadline: max(float64(d)/float64(time.Microsecond), 1), timeout: max(float64(t)/float64(time.Microsecond), 1),
		target: target, ahead: ahead}
}

// serviceTimes sets each pair's and node's mean service time from the
// window's latencies (successful and failed attempts): a pair with no
// record takes its model's, a model with none the table's mean, and a
// table with none defaultServiceUs.
func serviceTimes(t *Table, ms func(string) *stats.ModelStats) {
	type acc struct{ n, sum float64 }
	var all acc
	nodes := map[*nodeState]*acc{}
	model := func(m *modelState) (float64, float64) {
		n := float64(m.Successes + m.Failures)
		if st := ms(m.Model); st != nil {
			n = float64(st.Judged())
			if n > 0 {
				return n, serviceOf(&st.Series)
			}
		}
		return 0, 0
	}
	for _, m := range t.models {
		if n, s := model(m); n > 0 {
			all.n += n
			all.sum += n * s
		}
	}
	def := float64(defaultServiceUs)
	if all.n > 0 {
		def = all.sum / all.n
	}
	for _, m := range t.models {
		mn, msv := model(m)
		if mn == 0 {
			msv = def
		}
		st := ms(m.Model)
		for _, p := range m.pairs {
			p.serviceUs = msv
			var n float64
			if st != nil && st.Nodes != nil {
				if ns := st.Nodes[p.node.name]; ns != nil && ns.Judged() > 0 {
					n = float64(ns.Judged())
					p.serviceUs = serviceOf(ns)
					p.judged = n
				}
			}
			a := nodes[p.node]
			if a == nil {
				a = &acc{}
				nodes[p.node] = a
			}
			// a pair without a record weighs as one attempt, so a node
			// with no record at all takes its models' mean
			w := max(n, 1e-3)
			a.n += w
			a.sum += w * p.serviceUs
		}
	}
	for n, a := range nodes {
		n.serviceUs = max(a.sum/a.n, 1)
	}
	for _, m := range t.models {
		fastest := math.Inf(1)
		for _, p := range m.pairs {
			p.serviceUs = max(p.serviceUs, 1)
			fastest = min(fastest, p.serviceUs)
		}
		for _, p := range m.pairs {
			// within a quarter of the fastest is the same speed: noise of
			// the measurement, not a slower node
			if p.extraUs = p.serviceUs - fastest; p.extraUs <= fastest/4 {
				p.extraUs = 0
			}
		}
	}
}

// serviceOf is a series' mean attempt time in µs (successes from the
// histogram, failures from their summed latency).
func serviceOf(s *stats.Series) float64 {
	succ := float64(s.Latency.Count())
	fail := float64(s.Failures())
	if succ+fail == 0 {
		return 0
	}
	return (succ*meanUs(&s.Latency) + float64(max(s.FailLatencySumUs, 0))) / (succ + fail)
}

// PairTarget is one (model, node)'s queue target as the engine applies it
// to a new attempt with the configured timeout (Config.Timeout).
type PairTarget struct {
	Model, Node string
	// Service is the model's mean attempt time on the node over the
	// statistics window (borrowed from its other nodes, or assumed, when
	// Samples is 0).
	Service time.Duration
	// Target is the queue target; 0 with Mode "off".
	Target time.Duration
	// Samples is the judged attempts the service time rests on.
	Samples int64
	// Mode: "auto" (targetServices service times), "floor" (auto, raised
	// to the few-samples or absolute floor), "fixed" (MLSCHED_QUEUE_TARGET)
	// or "off" (the attempt's deadline only).
	Mode string
}

// QueueTargets lists every (model, node)'s queue target in t, by model
// then node: what `mlsched stats` and the dashboard show.
func (e *Engine) QueueTargets(t *Table) []PairTarget {
	if t == nil {
		return nil
	}
	timeout := max(float64(e.cfg.Timeout)/float64(time.Microsecond), 1)
	var out []PairTarget
	for _, m := range t.models {
		for _, p := range m.pairs {
			pt := PairTarget{Model: m.Model, Node: p.node.name, Service: time.Duration(p.serviceUs) * time.Microsecond,
				Samples: int64(p.judged)}
			switch {
			case e.cfg.QueueTarget < 0:
				pt.Mode = "off"
			case e.cfg.QueueTarget > 0:
				pt.Mode, pt.Target = "fixed", e.cfg.QueueTarget
			default:
				us := p.autoTarget(timeout)
				pt.Mode, pt.Target = "auto", time.Duration(us)*time.Microsecond
				if us > targetServices*p.serviceUs {
					pt.Mode = "floor"
				}
			}
			out = append(out, pt)
		}
	}
	slices.SortFunc(out, func(a, b PairTarget) int { return cmp.Or(cmp.Compare(a.Model, b.Model), cmp.Compare(a.Node, b.Node)) })
	return out
}

// AutoQueueTarget is the automatic queue target of a pair whose service
// time is known to be service (enough samples): targetServices of it, at
// least minTargetUs. The simulator's oracle, which knows the true service
// times, applies it.
func AutoQueueTarget(service time.Duration) time.Duration {
	return max(targetServices*service, minTargetUs*time.Microsecond)
}

package policy

import (
	"math"
	"time"

	"github.com/mlsched/mlsched/dispatcher/stats"
)

// The load model: how long a new attempt on a (model, node) waits before it
// starts, and how likely it is to start and finish before its deadline.
//
// Per node it knows
//   - the slots: the node's capacity, and a model's own MaxConcurrency there;
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
//	fit = P(in time) × exp(-(W + E)/T)
//
// with T the attempt timeout and E how much slower the node runs the model
// than its fastest node (0 on homogeneous nodes). The second factor charges waiting: queueing
// beyond what keeps the slots busy buys no success (a node finishes the
// same number of attempts per second however long its queue), it only adds
// latency. A wait of about a timeout is charged like a failed attempt; a
// short wait costs W/T of the success rate. So a slightly less reliable
// model that can start at once beats a queue (a 1.5-point better model is
// worth waiting for about 1.5% of a timeout: 30ms of a 2s timeout), and a
// much less reliable one does not. A node where W + s >= D is saturated:
// nothing is sent there while another candidate is not.

// defaultServiceUs is the service time assumed where nothing has been
// measured yet (µs).
const defaultServiceUs = 100_000

// Queue is what the load model says of one candidate for one decision: its
// best node's figures.
type Queue struct {
	// Fit is P(in time) × exp(-(W+E)/T), in [0, 1]; 1 when a slot is free
	// on a node as fast as the model's fastest.
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
	return n.inFlight+n.local.Load() < int64(n.capacity) && (p.limit == 0 || p.sent+p.local.Load() < int64(p.limit))
}

// wait is the expected wait before a new attempt on p starts, and its
// variance (µs, µs²). An attempt that goes first (Request.Ahead) on a node
// that orders its queue, while the node's work fits its ordered room,
// waits only for the next free slot. A model's own limit is a queue in
// arrival order on the node: it gets no such credit.
func (p *pairState) wait(first bool) (w, v float64) {
	n := p.node
	c := float64(n.capacity)
	o := float64(n.outstanding())
	if first && p.limit == 0 && n.prefetch > 0 && o < c+float64(n.prefetch) {
		o = min(o, c)
	}
	if ahead := o + 1 - c; ahead > 0 {
		s := n.serviceUs / c
		w, v = ahead*s, ahead*s*s
	}
	if p.limit > 0 {
		m := float64(p.limit)
		if ahead := float64(p.outstanding()) + 1 - m; ahead > 0 {
			s := p.serviceUs / m
			if ahead*s > w {
				w, v = ahead*s, ahead*s*s
			}
		}
	}
	return w, v
}

// budget is a decision's deadline and timeout, in µs, and whether the task
// goes first where it is sent (Request.Ahead).
type budget struct {
	deadline, timeout float64
	ahead             bool
}

// queue applies the load model to one (model, node).
func (p *pairState) queue(b budget) Queue {
	w, v := p.wait(b.ahead)
	if w == 0 {
		if p.extraUs == 0 {
			return free
		}
		return Queue{Fit: math.Exp(-p.extraUs / b.timeout), InTime: 1, Saturated: p.serviceUs >= b.deadline}
	}
	room := b.deadline - p.serviceUs - w
	in := 0.5 * math.Erfc(-room/math.Sqrt(2*v))
	return Queue{Fit: in * math.Exp(-(w+p.extraUs)/b.timeout), InTime: in, WaitUs: w, Saturated: room <= 0}
}

// saturated reports whether a new attempt on p would not start and finish
// before the deadline, on average (Queue.Saturated without the rest).
func (p *pairState) saturated(b budget) bool {
	if p.hasSlot() {
		return p.serviceUs >= b.deadline
	}
	w, _ := p.wait(b.ahead)
	return b.deadline-p.serviceUs-w <= 0
}

// cost is the expected time from now until an attempt sent to p now
// finishes (µs): its service time, plus the wait when the node (or the
// model's limit there) is full; with free slots, the service time scaled
// by how busy the node is, so that idle nodes are preferred.
func (p *pairState) cost() float64 {
	n := p.node
	o, c := float64(n.outstanding())+1, float64(n.capacity)
	t := p.serviceUs * o / c
	if o > c {
		t = (o-c)*n.serviceUs/c + p.serviceUs
	}
	if p.limit > 0 {
		if po, m := float64(p.outstanding())+1, float64(p.limit); po > m {
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
	return budget{deadline: max(float64(d)/float64(time.Microsecond), 1), timeout: max(float64(t)/float64(time.Microsecond), 1),
		ahead: req.Ahead}
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

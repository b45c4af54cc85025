package simulate

import (
	"context"
	"errors"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/mlsched/mlsched/dispatcher/internal/policy"
	"github.com/mlsched/mlsched/shared/protocol"
)

// errNoCandidate is the oracle's answer when no live node hosts a model of
// the type.
var errNoCandidate = errors.New("no live model serves the type")

// oracle knows the true failure probabilities (bursts, timeouts and slow
// nodes included), which nodes are alive, the true mean latencies and every
// node's queue. It is capacity-aware: it takes the (model, node) pairs from
// the least likely to fail, and sends the task to the first that can start
// it while the attempt still has its whole timeout before the dispatch
// deadline (expected wait plus three standard deviations within the
// deadline slack). So it fills the most reliable models up to what they can
// finish in time, then spills to the next. When none can, the decision is
// saturated and the task is held, as the dispatcher holds it. It ignores
// the attempt history: outcomes are independent, so the best model stays
// the best on a retry.
type oracle struct {
	s     *sim
	order []rankedPair // scratch
}

type rankedPair struct {
	model string
	n     *node
	p     float64
	lat   time.Duration
	wait  time.Duration
	load  float64
}

func (o *oracle) refresh(context.Context, time.Time, []protocol.Heartbeat) error { return nil }

func (o *oracle) completed(string, string) {}

func (o *oracle) peek(req *policy.Request) (policy.Decision, error) { return o.decide(req) }

func (o *oracle) sent(string, string) {}

func (o *oracle) decide(req *policy.Request) (policy.Decision, error) {
	s := o.s
	o.order = o.order[:0]
	for i := range s.sc.Models {
		m := &s.sc.Models[i]
		if !s.joined[m.Name] || !slices.Contains(m.Types, req.Type) || !protocol.AllowedBy(req.Models, m.Name) {
			continue
		}
		lat := m.step(s.now).Latency.mean() + m.step(s.now).sizePart(s.size)
		for _, n := range s.nodes {
			if n.alive && slices.Contains(n.spec.Models, m.Name) {
				o.order = append(o.order, rankedPair{m.Name, n, s.attemptFailProb(m.Name, n),
					time.Duration(float64(lat) * n.spec.Slowdown), s.queueWait(n), float64(n.load()) / float64(n.spec.Capacity)})
			}
		}
	}
	if len(o.order) == 0 {
		return policy.Decision{}, errNoCandidate
	}
	sort.SliceStable(o.order, func(i, j int) bool {
		a, b := o.order[i], o.order[j]
		if math.Abs(a.p-b.p) > 1e-12 {
			return a.p < b.p
		}
		if a.wait != b.wait {
			return a.wait < b.wait
		}
		if a.model != b.model {
			return a.lat < b.lat
		}
		return a.load < b.load
	})
	for _, r := range o.order {
		// Under flow control the request's deadline is the task's time
		// left, and the queue target caps it per (model, node) unless the
		// request asks without it: the attempt must also start and finish
		// within it, as the engine's load model asks.
		if r.wait <= s.sc.DeadlineSlack.D() && (s.fc == nil || r.wait+r.lat <= o.limit(req, r.lat)) {
			return policy.Decision{Model: r.model, Node: r.n.spec.Name}, nil
		}
	}
	return policy.Decision{Model: o.order[0].model, Node: o.order[0].n.spec.Name, Saturated: true}, nil
}

// limit is what an attempt of service time lat must start and finish
// within under flow control: the request's deadline, capped by the queue
// target (fixed, or automatic from the true service time).
func (o *oracle) limit(req *policy.Request, lat time.Duration) time.Duration {
	qt := o.s.fc.qt
	switch {
	case req.FullDeadline || qt < 0:
		return req.Deadline
	case qt > 0:
		return min(req.Deadline, qt)
	}
	return min(req.Deadline, policy.AutoQueueTarget(lat))
}

// queueWait bounds the wait before an attempt sent to n now starts: with k
// attempts ahead of it once every slot is busy and a mean service time t
// (the true mean latency, capped at the timeout, of what is queued there),
// k·t/c plus three standard deviations, t·√k/c.
func (s *sim) queueWait(n *node) time.Duration {
	c := float64(n.spec.Capacity)
	ahead := float64(n.load()) + 1 - c
	if ahead <= 0 {
		return 0
	}
	meanOf := func(m string, size float64) float64 {
		st := s.models[m].step(s.now)
		return min(float64(st.Latency.mean()+st.sizePart(size))*n.spec.Slowdown, float64(s.sc.Timeout.D()))
	}
	mean := func(m string) float64 { return meanOf(m, 0) }
	var t float64
	for _, q := range [][]*attempt{n.waiting, n.stream} {
		for _, a := range q {
			t += meanOf(a.model, a.t.size)
		}
	}
	t /= float64(max(n.queued(), 1))
	if n.queued() == 0 {
		for _, m := range n.spec.Models {
			t = max(t, mean(m))
		}
	}
	return time.Duration(ahead*t/c + 3*t*math.Sqrt(ahead)/c)
}

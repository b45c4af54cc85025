package policy

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/shared/protocol"
)

// randomWorld builds a random snapshot and node set: random statistics,
// breakers in every state, draining nodes, models serving one or two types.
func randomWorld(r *Rand) (*stats.Snapshot, []protocol.Heartbeat) {
	snap := &stats.Snapshot{Taken: t0, Window: time.Minute, Models: map[string]*stats.ModelStats{}}
	nModels, nNodes := 1+r.IntN(8), 1+r.IntN(5)
	breaker := func() stats.Breaker {
		return stats.Breaker{State: stats.BreakerState(r.IntN(3) * r.IntN(2)), Since: t0}
	}
	hbs := make([]protocol.Heartbeat, nNodes)
	for n := range hbs {
		// in-flight below capacity: no queue, whose effect (load_test.go)
		// would trump failover's preferences checked here
		c := r.IntN(5) - 1
		hbs[n] = protocol.Heartbeat{Node: fmt.Sprintf("n%d", n), Capacity: c, InFlight: min(r.IntN(6)-1, max(c, 1)-1), Draining: r.IntN(6) == 0}
	}
	for m := 0; m < nModels; m++ {
		name := fmt.Sprintf("m%d", m)
		if r.IntN(5) > 0 {
			s := series(int64(r.IntN(300)), int64(r.IntN(100)), time.Duration(1+r.IntN(400))*time.Millisecond, time.Duration(r.IntN(50))*time.Millisecond)
			s.InFlight = int64(r.IntN(4))
			s.Breaker = breaker()
			ms := &stats.ModelStats{Series: s, Nodes: map[string]*stats.Series{}}
			for n := range hbs {
				if r.IntN(2) == 0 {
					ns := series(int64(r.IntN(50)), int64(r.IntN(50)), time.Millisecond, time.Millisecond)
					ns.Breaker = breaker()
					ms.Nodes[hbs[n].Node] = &ns
				}
			}
			snap.Models[name] = ms
		}
		for n := range hbs {
			if r.IntN(2) == 0 {
				types := []string{"a"}
				if r.IntN(3) == 0 {
					types = []string{"b", "a"}
				}
				hbs[n].Models = append(hbs[n].Models, protocol.ModelInfo{Name: name, Types: types})
			}
		}
	}
	return snap, hbs
}

func randomRequest(r *Rand) *Request {
	req := &Request{Type: []string{"a", "a", "a", "a", "a", "a", "b", "b", "b", "c"}[r.IntN(10)]}
	for i := r.IntN(6) - 2; i > 0; i-- {
		req.Models = append(req.Models, fmt.Sprintf("m%d", r.IntN(10)))
	}
	if r.IntN(3) == 0 {
		req.MaxLatencyMs = int64(r.IntN(500))
	}
	if r.IntN(3) == 0 {
		req.MinSuccessRate = r.Float64()
	}
	for i := r.IntN(4); i > 0; i-- {
		req.Tried = append(req.Tried, protocol.Attempt{Model: fmt.Sprintf("m%d", r.IntN(8)), Node: fmt.Sprintf("n%d", r.IntN(5))})
	}
	return req
}

// TestDecideProperties checks the decision invariants over random worlds
// and requests, for every policy.
func TestDecideProperties(t *testing.T) {
	t.Parallel()
	r := NewRand(testSeed())
	for _, pol := range Names {
		e := engine(t, Config{Default: pol, Breaker: BreakerConfig{HalfOpenProbes: 1000}})
		for w := 0; w < 120; w++ {
			snap, hbs := randomWorld(r)
			tab := NewTable(snap, hbs, t0)
			for k := 0; k < 20; k++ {
				req := randomRequest(r)
				d, err := e.Decide(tab, req)
				if err := checkDecision(snap, hbs, req, d, err); err != nil {
					t.Fatalf("%s: %v\nrequest %+v\ndecision %+v", pol, err, req, d)
				}
			}
		}
	}
}

func checkDecision(snap *stats.Snapshot, hbs []protocol.Heartbeat, req *Request, d Decision, err error) error {
	// the ground truth, computed naively
	type pair struct{ model, node string }
	hosts := map[pair]bool{}
	var cands []string
	for _, h := range hbs {
		if h.Draining {
			continue
		}
		for _, m := range h.Models {
			if slices.Contains(m.Types, req.Type) {
				hosts[pair{m.Name, h.Node}] = true
				if !slices.Contains(cands, m.Name) {
					cands = append(cands, m.Name)
				}
			}
		}
	}
	series := func(model, node string) *stats.Series {
		ms := snap.Models[model]
		if ms == nil {
			return &stats.Series{}
		}
		if node == "" {
			return &ms.Series
		}
		if s := ms.Nodes[node]; s != nil {
			return s
		}
		return &stats.Series{}
	}
	fitsReq := func(m string) bool {
		s := series(m, "")
		if req.MaxLatencyMs > 0 && s.Latency.Quantile(0.95) > time.Duration(req.MaxLatencyMs)*time.Millisecond {
			return false
		}
		return req.MinSuccessRate <= 0 || smoothed(s.Successes, s.Failures()) >= req.MinSuccessRate
	}
	var allowed, fitting, unblocked []string
	for _, m := range cands {
		if len(req.Models) > 0 && !slices.Contains(req.Models, m) {
			continue
		}
		allowed = append(allowed, m)
		if !fitsReq(m) {
			continue
		}
		fitting = append(fitting, m)
		if series(m, "").Breaker.State == stats.BreakerOpen {
			continue
		}
		for p := range hosts {
			if p.model == m && series(m, p.node).Breaker.State != stats.BreakerOpen {
				unblocked = append(unblocked, m)
				break
			}
		}
	}
	code := protocol.CodeOf(err)
	switch {
	case len(cands) == 0:
		if code != protocol.CodeNoModel {
			return fmt.Errorf("want no_model, got %v", err)
		}
		return nil
	case len(allowed) == 0:
		if code != protocol.CodeUnknownModel {
			return fmt.Errorf("want unknown_model, got %v", err)
		}
		return nil
	case len(fitting) == 0:
		if code != protocol.CodeConstraints {
			return fmt.Errorf("want constraints_unsatisfied, got %v", err)
		}
		for _, m := range allowed {
			if !containsWord(err.Error(), m+":") {
				return fmt.Errorf("message does not name %s: %v", m, err)
			}
		}
		return nil
	}
	if err != nil {
		var pe *protocol.Error
		return fmt.Errorf("unexpected error %v (protocol error: %v)", err, errors.As(err, &pe))
	}
	if !slices.Contains(fitting, d.Model) || !hosts[pair{d.Model, d.Node}] {
		return fmt.Errorf("%s on %s is not an allowed, fitting, hosted choice (fitting %v)", d.Model, d.Node, fitting)
	}
	if d.Panic != (len(unblocked) == 0) {
		return fmt.Errorf("panic %v, unblocked %v", d.Panic, unblocked)
	}
	if !d.Panic {
		if !slices.Contains(unblocked, d.Model) || series(d.Model, d.Node).Breaker.State == stats.BreakerOpen {
			return fmt.Errorf("%s on %s is behind an open breaker", d.Model, d.Node)
		}
	}
	pool := unblocked
	if d.Panic {
		pool = fitting
	}
	untried := false
	for _, m := range pool {
		if !tried(req, m) {
			untried = true
		}
	}
	if untried && tried(req, d.Model) {
		return fmt.Errorf("repeated %s while %v had untried models", d.Model, pool)
	}
	return nil
}

func containsWord(s, w string) bool {
	for i := 0; i+len(w) <= len(s); i++ {
		if s[i:i+len(w)] == w && (i == 0 || s[i-1] == ' ') {
			return true
		}
	}
	return false
}

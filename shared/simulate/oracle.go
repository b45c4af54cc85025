package simulate

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/mlsched/mlsched/shared/policy"
	"github.com/mlsched/mlsched/shared/protocol"
)

// errNoCandidate is the oracle's answer when no live node hosts a model of
// the type.
var errNoCandidate = errors.New("no live model serves the type")

// oracle knows the true failure probabilities (bursts and timeouts
// included) and which nodes are alive at every moment, and picks the model
// least likely to fail, ties going to the lower mean latency. It ignores
// the attempt history: outcomes are independent, so the best model stays
// the best on a retry.
type oracle struct{ s *sim }

func (o *oracle) refresh(context.Context, time.Time, []protocol.Heartbeat) error { return nil }

func (o *oracle) decide(req *policy.Request) (policy.Decision, error) {
	m, _ := o.s.best(req.Type, req.Models)
	if m == "" {
		return policy.Decision{}, errNoCandidate
	}
	var pick *node
	for _, n := range o.s.nodes {
		if !n.alive || !slices.Contains(n.spec.Models, m) {
			continue
		}
		if pick == nil || n.load()*pick.spec.Capacity < pick.load()*n.spec.Capacity {
			pick = n
		}
	}
	return policy.Decision{Model: m, Node: pick.spec.Name}, nil
}

// best returns the model the oracle picks now for a type, and its true
// failure probability ("" and 1 when none is available).
func (s *sim) best(typ string, allow []string) (string, float64) {
	bestM, bestP := "", 1.0
	var bestLat time.Duration
	for i := range s.sc.Models {
		m := &s.sc.Models[i]
		if !s.joined[m.Name] || !slices.Contains(m.Types, typ) || (len(allow) > 0 && !slices.Contains(allow, m.Name)) {
			continue
		}
		if !slices.ContainsFunc(s.nodes, func(n *node) bool { return n.alive && slices.Contains(n.spec.Models, m.Name) }) {
			continue
		}
		p := s.failProb(m.Name)
		lat := m.step(s.now).Latency.mean()
		if bestM == "" || p < bestP-1e-12 || (p < bestP+1e-12 && lat < bestLat) {
			bestM, bestP, bestLat = m.Name, p, lat
		}
	}
	return bestM, bestP
}

// bestFailProb is the oracle's true failure probability for a type now.
func (s *sim) bestFailProb(typ string) float64 {
	_, p := s.best(typ, nil)
	return p
}

package policy

import (
	"sort"
	"time"

	"github.com/mlsched/mlsched/shared/stats"
)

// Transitions evaluates the breaker rules on a fresh snapshot, for every
// model and every (model, node). It only computes: the dispatcher writes each
// transition with stats.Store.SetBreaker, a compare-and-set on From, so that
// when every replica computes the same transition exactly one applies it.
// The result is sorted by model, then node (the model's own breaker first).
func (e *Engine) Transitions(snap *stats.Snapshot, now time.Time) []Transition {
	if snap == nil {
		return nil
	}
	var out []Transition
	models := make([]string, 0, len(snap.Models))
	for name := range snap.Models {
		models = append(models, name)
	}
	sort.Strings(models)
	for _, name := range models {
		ms := snap.Models[name]
		if ms == nil {
			continue
		}
		if to, ok := e.next(&ms.Series, snap.Window, now); ok {
			out = append(out, Transition{Key: stats.BreakerKey{Model: name}, From: ms.Breaker, To: to})
		}
		nodes := make([]string, 0, len(ms.Nodes))
		for n := range ms.Nodes {
			nodes = append(nodes, n)
		}
		sort.Strings(nodes)
		for _, n := range nodes {
			s := ms.Nodes[n]
			if s == nil {
				continue
			}
			if to, ok := e.next(s, snap.Window, now); ok {
				out = append(out, Transition{Key: stats.BreakerKey{Model: name, Node: n}, From: s.Breaker, To: to})
			}
		}
	}
	return out
}

// next is the breaker state machine:
//
//	closed    → open      N consecutive failures, or a failure rate above
//	                      the threshold over at least MinRequests outcomes
//	open      → half-open after Cooldown
//	half-open → closed    an outcome after Since, and no failure since the
//	                      last success (ConsecutiveFailures == 0)
//	half-open → open      an outcome after Since that was a failure
//
// The rate rule only judges a window that starts after the breaker last
// changed, so a breaker that just closed is not reopened by the very
// failures that opened it. Task errors are not failures in stats.Counts, so
// they never open a breaker.
func (e *Engine) next(s *stats.Series, window time.Duration, now time.Time) (stats.Breaker, bool) {
	cfg := e.cfg.Breaker
	b := s.Breaker
	switch b.State {
	case stats.BreakerClosed:
		if cfg.ConsecutiveFailures > 0 && s.ConsecutiveFailures >= int64(cfg.ConsecutiveFailures) {
			return stats.Breaker{State: stats.BreakerOpen, Since: now}, true
		}
		fresh := b.Since.IsZero() || window <= 0 || now.Sub(b.Since) >= window
		if j := s.Judged(); fresh && j > 0 && j >= int64(cfg.MinRequests) &&
			float64(s.Failures())/float64(j) > cfg.FailureRate {
			return stats.Breaker{State: stats.BreakerOpen, Since: now}, true
		}
	case stats.BreakerOpen:
		if now.Sub(b.Since) >= cfg.Cooldown {
			return stats.Breaker{State: stats.BreakerHalfOpen, Since: now}, true
		}
	case stats.BreakerHalfOpen:
		if s.LastOutcome.After(b.Since) {
			if s.ConsecutiveFailures == 0 {
				return stats.Breaker{State: stats.BreakerClosed, Since: now}, true
			}
			return stats.Breaker{State: stats.BreakerOpen, Since: now}, true
		}
	}
	return stats.Breaker{}, false
}

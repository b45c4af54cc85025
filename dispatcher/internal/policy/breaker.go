package policy

import (
	"sort"
	"sync"
	"time"

	"github.com/mlsched/mlsched/dispatcher/stats"
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
	e.marks.mu.Lock()
	defer e.marks.mu.Unlock()
	if e.marks.m == nil {
		e.marks.m = make(map[stats.BreakerKey]*mark)
	}
	e.marks.gen++
	defer e.marks.sweep()
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
		key := stats.BreakerKey{Model: name}
		if to, ok := e.next(key, &ms.Series, snap.Window, now); ok {
			out = append(out, Transition{Key: key, From: ms.Breaker, To: to})
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
			key := stats.BreakerKey{Model: name, Node: n}
			if to, ok := e.next(key, s, snap.Window, now); ok {
				out = append(out, Transition{Key: key, From: s.Breaker, To: to})
			}
		}
	}
	return out
}

// mark is what a series looked like when its breaker went half-open, so
// that an outcome since can be told apart: a success resets the consecutive
// failures or adds a success, a failure adds one. LastOutcome alone cannot
// tell, since a task error or an expired dispatch moves it too.
type mark struct {
	since                       time.Time
	consec, successes, failures int64
	gen                         uint64
}

// marks are the engine's half-open marks, touched only by Transitions.
type marks struct {
	mu  sync.Mutex
	m   map[stats.BreakerKey]*mark
	gen uint64
}

// sweep forgets breakers that were not half-open in the last evaluation.
func (ms *marks) sweep() {
	for k, mk := range ms.m {
		if mk.gen != ms.gen {
			delete(ms.m, k)
		}
	}
}

func (ms *marks) set(key stats.BreakerKey, since time.Time, s *stats.Series) {
	ms.m[key] = &mark{since: since, consec: s.ConsecutiveFailures, successes: s.Successes, failures: s.Failures(), gen: ms.gen}
}

// next is the breaker state machine:
//
//	closed    → open      N consecutive failures, or a failure rate above
//	                      the threshold over at least MinRequests outcomes
//	open      → half-open after Cooldown
//	half-open → closed    a success since it went half-open, and no failure
//	                      after it (ConsecutiveFailures == 0)
//	half-open → open      a failure since it went half-open, not followed
//	                      by a success
//
// The rate rule only judges a window that starts after the breaker last
// changed, so a breaker that just closed is not reopened by the very
// failures that opened it. Task errors and expired dispatches are not
// failures in stats.Counts, so they never open a breaker, nor do they close
// or reopen a half-open one.
//
// Half-open needs to know what happened since it began. The engine marks
// the series when it computes the open → half-open transition; an engine
// that first sees a half-open breaker another replica made marks it then,
// and judges from the next snapshot on (that replica judges meanwhile).
func (e *Engine) next(key stats.BreakerKey, s *stats.Series, window time.Duration, now time.Time) (stats.Breaker, bool) {
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
			e.marks.set(key, now, s)
			return stats.Breaker{State: stats.BreakerHalfOpen, Since: now}, true
		}
	case stats.BreakerHalfOpen:
		mk := e.marks.m[key]
		if mk == nil || !mk.since.Equal(b.Since) {
			e.marks.set(key, b.Since, s)
			return stats.Breaker{}, false
		}
		mk.gen = e.marks.gen
		if !s.LastOutcome.After(b.Since) {
			return stats.Breaker{}, false
		}
		c := s.ConsecutiveFailures
		switch {
		case c == 0 && (mk.consec > 0 || s.Successes > mk.successes):
			return stats.Breaker{State: stats.BreakerClosed, Since: now}, true
		case c > 0 && (c > mk.consec || s.Failures() > mk.failures):
			return stats.Breaker{State: stats.BreakerOpen, Since: now}, true
		}
	}
	return stats.Breaker{}, false
}

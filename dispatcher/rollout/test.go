package rollout

import (
	"math"

	"github.com/mlsched/mlsched/dispatcher/stats"
)

// Counts are first-attempt outcomes of one side of a rollout in one step.
// Only judged outcomes count: a task error says nothing about a model.
// Timeouts are failures too; Timeouts counts them apart for the timeout
// rule.
type Counts struct {
	Successes int64 `json:"successes"`
	Failures  int64 `json:"failures"` // model errors and timeouts
	Timeouts  int64 `json:"timeouts"`
}

// CountsOf is one outcome of a kind as counts; ok is false for a kind that
// says nothing of the model (task errors, expired dispatches).
func CountsOf(kind stats.Kind) (c Counts, ok bool) {
	switch kind {
	case stats.KindSuccess:
		c.Successes = 1
	case stats.KindModelError:
		c.Failures = 1
	case stats.KindTimeout: // lost attempts included
		c.Failures, c.Timeouts = 1, 1
	default:
		return c, false
	}
	return c, true
}

// N is the number of judged outcomes.
func (c Counts) N() int64 { return c.Successes + c.Failures }

// FailureRate is Failures/N (0 with no outcome).
func (c Counts) FailureRate() float64 {
	if c.N() == 0 {
		return 0
	}
	return float64(c.Failures) / float64(c.N())
}

// TimeoutRate is Timeouts/N (0 with no outcome).
func (c Counts) TimeoutRate() float64 {
	if c.N() == 0 {
		return 0
	}
	return float64(c.Timeouts) / float64(c.N())
}

// Add returns c plus d.
func (c Counts) Add(d Counts) Counts {
	return Counts{Successes: c.Successes + d.Successes, Failures: c.Failures + d.Failures, Timeouts: c.Timeouts + d.Timeouts}
}

// Verdict is what the sequential test says of a step's counts.
type Verdict int

const (
	// Continue: not enough evidence either way.
	Continue Verdict = iota
	// NotWorse: the new version's first-attempt failure rate is not above
	// the incumbent's by MaxDrop (H0 accepted).
	NotWorse
	// Worse: it is above by MaxDrop (H1 accepted).
	Worse
)

func (v Verdict) String() string {
	switch v {
	case NotWorse:
		return "not_worse"
	case Worse:
		return "worse"
	}
	return "continue"
}

// SPRT is Wald's sequential probability ratio test on the new version's
// first-attempt failure rate q against the incumbent's p, measured in the
// same step: H0 q = p (the new version is as good) against H1 q = p +
// MaxDrop (worse by the largest drop the operator accepts). Each failure of
// the new version adds ln(p1/p0) to the log-likelihood ratio, each success
// ln((1-p1)/(1-p0)); the test says Worse once the ratio reaches
// ln((1-Beta)/Alpha) and NotWorse once it falls to ln(Beta/(1-Alpha)).
// With p known, Alpha would be the chance of rolling back a version as good
// as the incumbent in one step and Beta that of promoting one worse by
// MaxDrop (Wald's bounds).
//
// p is not known: it is estimated from the incumbent's outcomes in the same
// step (comparing within a step keeps a change of traffic or of the
// cluster from passing for the new version's), and a plain estimate would
// make every unlucky stretch of the incumbent look like a drop of the new
// version. So the ratio that rolls back is computed with the incumbent's
// rate at its one-sided 95% Wilson upper bound (the new version is judged
// worse only against the worst the incumbent may be), and the one that
// promotes with its point estimate, (failures+0.5)/(n+1). The rates this
// gives are measured by simulation (TestMeasureErrorRates) and stated in
// docs/policies.md.
type SPRT struct {
	MaxDrop     float64 // absolute, 0.01 = one percentage point
	Alpha, Beta float64
}

// Bounds are the log-likelihood ratio's thresholds: Worse at or above
// upper, NotWorse at or below lower.
func (s SPRT) Bounds() (lower, upper float64) {
	return math.Log(s.Beta / (1 - s.Alpha)), math.Log((1 - s.Beta) / s.Alpha)
}

// llr is the log-likelihood ratio of H1 against H0 for the new version's
// counts with the incumbent's rate at p0.
func (s SPRT) llr(newc Counts, p0 float64) float64 {
	p0 = min(max(p0, 1e-6), 1-s.MaxDrop-1e-6)
	p1 := p0 + s.MaxDrop
	return float64(newc.Failures)*math.Log(p1/p0) + float64(newc.Successes)*math.Log((1-p1)/(1-p0))
}

// LLRs are the ratios that roll back (incumbent at its upper bound) and
// that promote (at its point estimate).
func (s SPRT) LLRs(newc, inc Counts) (rollback, promote float64) {
	n, f := float64(inc.N()), float64(inc.Failures)
	point := (f + 0.5) / (n + 1)
	_, upper := wilsonZ(f, n, 1.6449)
	return s.llr(newc, max(upper, point)), s.llr(newc, point)
}

// Judge applies the test; llr is the ratio that decided, or the rollback
// one while the test continues.
func (s SPRT) Judge(newc, inc Counts) (v Verdict, llr float64) {
	rb, pr := s.LLRs(newc, inc)
	lo, hi := s.Bounds()
	switch {
	case rb >= hi:
		return Worse, rb
	case pr <= lo:
		return NotWorse, pr
	}
	return Continue, rb
}

// wilsonZ is the Wilson score interval of f failures out of n.
func wilsonZ(f, n, z float64) (lower, upper float64) {
	if n == 0 {
		return 0, 1
	}
	p := f / n
	mid := p + z*z/(2*n)
	half := z * math.Sqrt(p*(1-p)/n+z*z/(4*n*n))
	d := 1 + z*z/n
	return max((mid-half)/d, 0), min((mid+half)/d, 1)
}

// timeoutsAbove reports whether the new version's timeout rate exceeds the
// incumbent's by more than margin: the one-sided 99% Wilson lower bound of
// the new version's rate is above the incumbent's rate plus margin, once
// the new version has 20 outcomes.
func timeoutsAbove(newc, inc Counts, margin float64) bool {
	n := float64(newc.N())
	if n < 20 {
		return false
	}
	lower, _ := wilsonZ(float64(newc.Timeouts), n, 2.3263)
	return lower > inc.TimeoutRate()+margin
}

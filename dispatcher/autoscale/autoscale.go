// Package autoscale decides how many worker replicas each pool needs. It is
// pure: no I/O and no clock of its own (every call is given its time), so
// that the formula, the rate limits, the cooldown and the hold on missing
// data are tested exactly, and the same code judges a live cluster
// (dispatcher/autoscaler), a replay and a unit test.
//
// A pool is a set of interchangeable workers sharing a models file: in
// compose, one service. The formula (docs/operations.md, "Autoscaling"):
//
//	slots  = Σ_t share_t · (λ_t · S_t / s_t / ρ  +  W_t · S_t / s_t / D)
//	needed = ceil(slots / c)
//
// per task type t the pool serves: λ_t its arrival rate (tasks/s), S_t the
// service time of the pool's models of t (p50, weighed by traffic share),
// s_t their success rate (a failed attempt is retried: 1/s_t attempts per
// task, at most 3), W_t its backlog not running yet, share_t the pool's part of t's
// capacity when several pools serve t; ρ the target utilisation, D the time
// within which the backlog should drain, c the slots (concurrency) of one
// replica. The first term is Little's law (busy slots = arrival rate ×
// service time) with headroom 1/ρ; the second drains what is waiting.
//
// Why this rather than KEDA's ceil(lag/10): a lag of 100 tasks of 5 ms each
// needs one replica, of 5 s each needs several, and a steady stream that
// never queues (lag 0) still needs λ·S slots. KEDA's formula is here too
// (KEDA), faithfully, for the replay that compares them.
package autoscale

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"
)

// Observation is what the scaler knows at one moment.
type Observation struct {
	At time.Time
	// Missing says why the statistics could not be read (NATS unreachable,
	// no dispatcher answering): every pool then holds its replicas.
	Missing string
	Pools   []Pool
	// Types maps task types to their load.
	Types map[string]TypeLoad
	// Models maps model names to their statistics.
	Models map[string]ModelStats
}

// Pool is one pool as the backend and the workers' heartbeats show it.
type Pool struct {
	Name string
	// Current is the replicas the backend runs now.
	Current int
	// Capacity is the slots of one replica (its concurrency); 0: unknown
	// (DefaultCapacity is assumed).
	Capacity int
	// Models are the models the pool's workers host (known from their
	// heartbeats; remembered while the pool is at zero).
	Models []Model
}

// Model is a hosted model and the task types it serves.
type Model struct {
	Name  string
	Types []string
}

// TypeLoad is one task type's load.
type TypeLoad struct {
	// Finished counts the final results of the type, cumulatively (any
	// origin: only its increments are used).
	Finished int64
	// Backlog is what waits in the task stream (not finished: running
	// tasks included).
	Backlog int64
	// Running is how many of the backlog run now (the workers'
	// heartbeats): the drain term counts only the rest, since Little's
	// law already counts what runs.
	Running int64
	// Lag is the type's task consumers' num_pending + num_ack_pending:
	// KEDA's input (KEDA); this package's formula does not use it.
	Lag int64
}

// ModelStats are a model's statistics from the dispatchers.
type ModelStats struct {
	// ServiceTime is its typical time per attempt (p50); 0: unknown.
	ServiceTime time.Duration
	// SuccessRate is its windowed success rate; 0: unknown (1 assumed).
	SuccessRate float64
	// Share is its share of the dispatched traffic.
	Share float64
}

// DefaultCapacity is the slots per replica assumed when no heartbeat says:
// the worker's default MLSCHED_CONCURRENCY.
const DefaultCapacity = 8

// Limits bound and pace one pool's scaling.
type Limits struct {
	// Min and Max replicas (Max defaults to 10; the command's -min to 1).
	// Min 0 lets an idle pool go to zero, but never the last worker of a
	// model that has work.
	Min, Max int
	// Utilisation is the target busy share of the slots, in (0, 1]
	// (default 0.7).
	Utilisation float64
	// DrainWithin is the time the backlog should drain in (default 30s):
	// the tasks' deadline, or less.
	DrainWithin time.Duration
	// UpStep and UpFactor bound a scale-up: at most max(current+UpStep,
	// current·UpFactor) replicas per decision (defaults 4 and 2, as
	// Kubernetes' HPA).
	UpStep   int
	UpFactor float64
	// DownFraction bounds a scale-in to that fraction of the replicas per
	// decision, at least one (default 0.5).
	DownFraction float64
	// Cooldown: a scale-in happens only when every recommendation of the
	// last Cooldown was below the current replicas, and not within
	// Cooldown of a scale-up (default 2m): one oscillation per cooldown at
	// most.
	Cooldown time.Duration
}

// WithDefaults fills in the zero fields.
func (l Limits) WithDefaults() Limits {
	if l.Max == 0 {
		l.Max = 10
	}
	if l.Utilisation == 0 {
		l.Utilisation = 0.7
	}
	if l.DrainWithin == 0 {
		l.DrainWithin = 30 * time.Second
	}
	if l.UpStep == 0 {
		l.UpStep = 4
	}
	if l.UpFactor == 0 {
		l.UpFactor = 2
	}
	if l.DownFraction == 0 {
		l.DownFraction = 0.5
	}
	if l.Cooldown == 0 {
		l.Cooldown = 2 * time.Minute
	}
	return l
}

// Validate says what is wrong with limits (after WithDefaults).
func (l Limits) Validate() error {
	switch {
	case l.Min < 0 || l.Max < 1 || l.Min > l.Max:
		return fmt.Errorf("replicas: want 0 <= min <= max and max >= 1, have min %d max %d", l.Min, l.Max)
	case !(l.Utilisation > 0 && l.Utilisation <= 1):
		return fmt.Errorf("utilisation %v: want a fraction in (0, 1]", l.Utilisation)
	case l.DrainWithin <= 0:
		return fmt.Errorf("drain time %v: want a positive duration", l.DrainWithin)
	case l.UpStep < 1 || l.UpFactor < 1:
		return fmt.Errorf("scale-up rate: want step >= 1 and factor >= 1, have %d and %v", l.UpStep, l.UpFactor)
	case !(l.DownFraction > 0 && l.DownFraction <= 1):
		return fmt.Errorf("scale-down fraction %v: want a fraction in (0, 1]", l.DownFraction)
	case l.Cooldown < 0:
		return fmt.Errorf("cooldown %v: want >= 0", l.Cooldown)
	}
	return nil
}

// Decision is what a policy recommends for one pool, and why.
type Decision struct {
	Pool    string `json:"pool"`
	Current int    `json:"current"`
	// Needed is the formula's figure before rate limits and cooldown.
	Needed int `json:"needed"`
	// Target is the replicas to run now (Current when holding).
	Target int `json:"target"`
	// Reason says why, in one line.
	Reason string `json:"reason"`
	// Held is set when the decision holds for want of data.
	Held bool `json:"held,omitempty"`
	// The formula's inputs, for the reason and the dashboard.
	Arrival   float64 `json:"arrival_per_s"`
	ServiceMs float64 `json:"service_ms"`
	Backlog   int64   `json:"backlog"`
	Slots     float64 `json:"slots"`
	Capacity  int     `json:"capacity"`
	// Models are the models the pool hosts (remembered while at zero).
	Models []Model   `json:"models,omitempty"`
	At     time.Time `json:"at"`
}

// Change reports whether the decision scales.
func (d Decision) Change() bool { return d.Target != d.Current }

// Policy turns observations into decisions, one per pool, in pool order.
type Policy interface {
	Decide(obs Observation) []Decision
}

// Scaler is this package's policy: the formula above, rate limits, a
// cooldown and a hold on missing data. It keeps the arrival-rate estimate
// and each pool's recent recommendations between calls; not safe for
// concurrent use.
type Scaler struct {
	limits func(pool string) Limits
	rate   *rateEstimator
	pools  map[string]*poolState
}

type poolState struct {
	since   time.Time // first decided: a fresh scaler waits a cooldown before scaling in
	lastUp  time.Time
	history []sample // the needed figures of the last cooldown
}

type sample struct {
	at     time.Time
	needed int
}

// ScalerParams configures a Scaler.
type ScalerParams struct {
	// Limits gives each pool's limits (defaults filled in); nil: defaults
	// for every pool.
	Limits func(pool string) Limits
	// RateHalfLife smooths the arrival rate (default 10s).
	RateHalfLife time.Duration
}

// NewScaler makes a Scaler.
func NewScaler(p ScalerParams) *Scaler {
	if p.Limits == nil {
		p.Limits = func(string) Limits { return Limits{} }
	}
	if p.RateHalfLife <= 0 {
		p.RateHalfLife = 10 * time.Second
	}
	return &Scaler{limits: func(pool string) Limits { return p.Limits(pool).WithDefaults() },
		rate: newRateEstimator(p.RateHalfLife), pools: map[string]*poolState{}}
}

// maxAttempts bounds the retries the formula counts per task (the default
// max_attempts).
const maxAttempts = 3

// Decide implements Policy.
func (s *Scaler) Decide(obs Observation) []Decision {
	rates, rateErr := s.rate.update(obs)
	out := make([]Decision, 0, len(obs.Pools))
	hosts := hostsByType(obs.Pools)
	for _, p := range obs.Pools {
		lim := s.limits(p.Name)
		if s.pools[p.Name] == nil {
			s.pools[p.Name] = &poolState{since: obs.At}
		}
		d := Decision{Pool: p.Name, Current: p.Current, Target: p.Current, Needed: p.Current, At: obs.At,
			Capacity: capacity(p), Models: p.Models}
		switch {
		case obs.Missing != "":
			d.Held, d.Reason = true, "hold: no statistics ("+obs.Missing+")"
		case rateErr != "":
			d.Held, d.Reason = true, "hold: "+rateErr
		default:
			s.decide(&d, p, lim, obs, rates, hosts)
		}
		out = append(out, d)
	}
	return out
}

// hostsByType maps each task type to the pools hosting a model of it.
func hostsByType(pools []Pool) map[string][]Pool {
	out := map[string][]Pool{}
	for _, p := range pools {
		seen := map[string]bool{}
		for _, m := range p.Models {
			for _, t := range m.Types {
				if !seen[t] {
					seen[t] = true
					out[t] = append(out[t], p)
				}
			}
		}
	}
	return out
}

func capacity(p Pool) int {
	if p.Capacity > 0 {
		return p.Capacity
	}
	return DefaultCapacity
}

// share is pool p's part of type t's work: its share of the replicas of
// the pools serving t (equal parts when none runs).
func share(p Pool, hosts []Pool) float64 {
	var total, mine float64
	for _, h := range hosts {
		c := float64(h.Current * capacity(h))
		total += c
		if h.Name == p.Name {
			mine = c
		}
	}
	if total == 0 {
		return 1 / float64(len(hosts))
	}
	return mine / total
}

func (s *Scaler) decide(d *Decision, p Pool, lim Limits, obs Observation, rates map[string]float64, hosts map[string][]Pool) {
	var slots, work float64
	var svcWeighted, svcWeight float64
	var floorWhy string
	var unknown []string
	for _, t := range poolTypes(p) {
		sh := share(p, hosts[t])
		lambda := rates[t] * sh
		backlog := float64(obs.Types[t].Backlog) * sh
		waiting := float64(max(0, obs.Types[t].Backlog-obs.Types[t].Running)) * sh
		// What arrives and waits is shown whether or not it can be costed.
		d.Arrival += lambda
		d.Backlog += int64(math.Round(waiting))
		svc, succ, ok := serviceOf(p, t, obs.Models)
		if !ok {
			if lambda > 0 || backlog > 0 {
				unknown = append(unknown, t)
			}
			continue
		}
		attempts := min(1/max(succ, 1/float64(maxAttempts)), maxAttempts)
		sec := svc.Seconds()
		slots += lambda*sec*attempts/lim.Utilisation + waiting*sec*attempts/lim.DrainWithin.Seconds()
		svcWeighted += sec * (lambda + backlog)
		svcWeight += lambda + backlog
		work += lambda + backlog
		if (rates[t] > 0 || obs.Types[t].Backlog > 0) && len(hosts[t]) == 1 && floorWhy == "" {
			floorWhy = "the only pool serving " + t + ", which has work"
		}
	}
	for _, t := range unknown {
		if len(hosts[t]) == 1 && floorWhy == "" {
			floorWhy = "the only pool serving " + t + ", which has work"
		}
	}
	if svcWeight > 0 {
		d.ServiceMs = 1000 * svcWeighted / svcWeight
	}
	d.Slots = slots
	needed := int(math.Ceil(slots/float64(d.Capacity) - 1e-9))
	why := fmt.Sprintf("needs %.1f slots (λ=%.2f/s, S=%.0fms, backlog %d, ρ=%.2f, drain %s) = %d × %d",
		slots, d.Arrival, d.ServiceMs, d.Backlog, lim.Utilisation, lim.DrainWithin, needed, d.Capacity)
	if len(unknown) > 0 {
		// Work whose service time is not known yet: at least what runs now.
		needed = max(needed, p.Current, 1)
		why += "; no service time yet for " + strings.Join(unknown, ",") + ": at least the current replicas"
	}
	if floorWhy != "" && needed < 1 {
		needed = 1
		why += "; kept at 1: " + floorWhy
	}
	needed = min(max(needed, lim.Min), lim.Max)
	if floorWhy != "" && needed < 1 {
		needed = 1 // the last worker of a model with work stays, whatever -min says
	}
	d.Needed = needed
	st := s.pools[p.Name]
	st.history = append(st.history, sample{obs.At, needed})
	cut := 0
	for cut < len(st.history) && obs.At.Sub(st.history[cut].at) > lim.Cooldown {
		cut++
	}
	st.history = st.history[cut:]
	cur := p.Current
	switch {
	case needed > cur:
		up := max(cur+lim.UpStep, int(math.Ceil(float64(cur)*lim.UpFactor)))
		d.Target = min(needed, up, lim.Max)
		st.lastUp = obs.At
		d.Reason = fmt.Sprintf("scale up %d→%d: %s", cur, d.Target, why)
		if d.Target < needed {
			d.Reason += fmt.Sprintf(" (rate-limited to %d this step)", d.Target)
		}
	case needed < cur:
		if since := obs.At.Sub(st.lastUp); !st.lastUp.IsZero() && since < lim.Cooldown {
			d.Reason = fmt.Sprintf("hold %d: %s; scaled up %s ago, cooldown %s", cur, why, since.Round(time.Second), lim.Cooldown)
			return
		}
		stable := needed
		for _, h := range st.history {
			stable = max(stable, h.needed)
		}
		if known := obs.At.Sub(st.since); known < lim.Cooldown {
			// Not yet a whole cooldown of recommendations (a scaler just
			// started, perhaps after a crash): hold, as after a scale-up.
			d.Reason = fmt.Sprintf("hold %d: %s; watched for %s of the cooldown %s", cur, why, known.Round(time.Second), lim.Cooldown)
			return
		}
		if stable >= cur {
			d.Reason = fmt.Sprintf("hold %d: %s; needed %d within the cooldown %s", cur, why, stable, lim.Cooldown)
			return
		}
		down := cur - max(1, int(float64(cur)*lim.DownFraction))
		d.Target = max(stable, down)
		d.Reason = fmt.Sprintf("scale in %d→%d: %s; below for the whole cooldown %s", cur, d.Target, why, lim.Cooldown)
	default:
		d.Reason = fmt.Sprintf("steady %d: %s", cur, why)
	}
}

// poolTypes are the task types a pool's models serve, sorted.
func poolTypes(p Pool) []string {
	seen := map[string]bool{}
	var out []string
	for _, m := range p.Models {
		for _, t := range m.Types {
			if !seen[t] {
				seen[t] = true
				out = append(out, t)
			}
		}
	}
	sort.Strings(out)
	return out
}

// serviceOf is the service time and success rate of the pool's models of
// type t, weighed by their traffic share (equally when none has any); ok
// is false when no model of t has a known service time.
func serviceOf(p Pool, t string, models map[string]ModelStats) (svc time.Duration, success float64, ok bool) {
	var sum, succ, w float64
	var n int
	for _, m := range p.Models {
		if !contains(m.Types, t) {
			continue
		}
		st, found := models[m.Name]
		if !found || st.ServiceTime <= 0 {
			continue
		}
		weight := st.Share
		if weight <= 0 {
			weight = 1e-6 // no traffic share: counts only if no other has one
		}
		s := st.SuccessRate
		if s <= 0 {
			s = 1
		}
		sum += weight * st.ServiceTime.Seconds()
		succ += weight * s
		w += weight
		n++
	}
	if n == 0 {
		return 0, 0, false
	}
	return time.Duration(sum / w * float64(time.Second)), succ / w, true
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

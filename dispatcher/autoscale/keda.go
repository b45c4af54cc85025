package autoscale

import (
	"fmt"
	"math"
	"time"
)

// KEDA is KEDA's NATS JetStream scaler with the HPA behind it, implemented
// faithfully so that a replay can compare it with Scaler on the same pools:
//
//   - the metric is the lag of the pool's task consumers (num_pending +
//     num_ack_pending, TypeLoad.Lag of the types the pool serves), read
//     every PollingInterval (30s) and nowhere in between;
//   - the HPA asks for ceil(lag / LagThreshold) replicas (threshold 10),
//     unchanged while within Tolerance (10%) of the current replicas;
//   - a scale-up adds at most max(4 replicas, 100%) per 15s (the HPA's
//     default scale-up policy), a scale-in takes the highest
//     recommendation of the last 300s (its default stabilisation window);
//   - KEDA itself takes a pool from 1 to 0 once the lag has been 0 for
//     CooldownPeriod (300s), and from 0 to 1 as soon as it is not
//     (activation threshold 0).
//
// TimeScale divides every period, for a replay whose time is compressed.
type KEDA struct {
	p      KEDAParams
	limits func(pool string) Limits
	pools  map[string]*kedaState
}

// KEDAParams configures KEDA; zero fields take KEDA's and the HPA's
// defaults.
type KEDAParams struct {
	LagThreshold    int64         // 10
	PollingInterval time.Duration // 30s
	CooldownPeriod  time.Duration // 300s
	Stabilisation   time.Duration // 300s (HPA scaleDown.stabilizationWindowSeconds)
	UpPeriod        time.Duration // 15s (HPA scaleUp policies' periodSeconds)
	Tolerance       float64       // 0.1
	// TimeScale divides every period (default 1).
	TimeScale float64
	// Limits gives each pool's Min and Max (the ScaledObject's
	// minReplicaCount, maxReplicaCount); nil: the defaults.
	Limits func(pool string) Limits
}

type kedaState struct {
	lastPoll, lastActive, lastUp time.Time
	history                      []sample
}

// NewKEDA makes a KEDA policy.
func NewKEDA(p KEDAParams) *KEDA {
	if p.TimeScale <= 0 {
		p.TimeScale = 1
	}
	scale := func(d *time.Duration, def time.Duration) {
		if *d <= 0 {
			*d = def
		}
		*d = time.Duration(float64(*d) / p.TimeScale)
	}
	scale(&p.PollingInterval, 30*time.Second)
	scale(&p.CooldownPeriod, 300*time.Second)
	scale(&p.Stabilisation, 300*time.Second)
	scale(&p.UpPeriod, 15*time.Second)
	if p.LagThreshold <= 0 {
		p.LagThreshold = 10
	}
	if p.Tolerance <= 0 {
		p.Tolerance = 0.1
	}
	if p.Limits == nil {
		p.Limits = func(string) Limits { return Limits{} }
	}
	return &KEDA{p: p, limits: func(pool string) Limits { return p.Limits(pool).WithDefaults() }, pools: map[string]*kedaState{}}
}

// Decide implements Policy.
func (k *KEDA) Decide(obs Observation) []Decision {
	out := make([]Decision, 0, len(obs.Pools))
	for _, p := range obs.Pools {
		st := k.pools[p.Name]
		if st == nil {
			st = &kedaState{}
			k.pools[p.Name] = st
		}
		d := Decision{Pool: p.Name, Current: p.Current, Target: p.Current, Needed: p.Current, At: obs.At,
			Capacity: capacity(p), Models: p.Models}
		switch {
		case obs.Missing != "":
			// KEDA's scaler errors and the HPA keeps the replicas.
			d.Held, d.Reason = true, "hold: metric unavailable ("+obs.Missing+")"
		case !st.lastPoll.IsZero() && obs.At.Sub(st.lastPoll) < k.p.PollingInterval:
			d.Reason = fmt.Sprintf("between polls (every %s)", k.p.PollingInterval)
		default:
			st.lastPoll = obs.At
			k.decide(&d, p, obs, st)
		}
		out = append(out, d)
	}
	return out
}

func (k *KEDA) decide(d *Decision, p Pool, obs Observation, st *kedaState) {
	lim := k.limits(p.Name)
	var lag int64
	for _, t := range poolTypes(p) {
		lag += obs.Types[t].Lag
		d.Backlog += obs.Types[t].Backlog
	}
	cur := p.Current
	if lag > 0 || st.lastActive.IsZero() {
		st.lastActive = obs.At
	}
	// KEDA: activation and scale to zero.
	if cur == 0 {
		if lag > 0 {
			d.Target, d.Needed = max(1, lim.Min), max(1, lim.Min)
			d.Reason = fmt.Sprintf("activate 0→%d: lag %d > 0", d.Target, lag)
		} else {
			d.Reason = "idle at 0: lag 0"
		}
		return
	}
	if lag == 0 && lim.Min == 0 {
		if idle := obs.At.Sub(st.lastActive); idle >= k.p.CooldownPeriod {
			d.Target, d.Needed = 0, 0
			d.Reason = fmt.Sprintf("deactivate %d→0: lag 0 for %s (cooldownPeriod %s)", cur, idle.Round(time.Second), k.p.CooldownPeriod)
			return
		}
	}
	// The HPA, on an AverageValue target of LagThreshold per replica.
	desired := int(math.Ceil(float64(lag) / float64(k.p.LagThreshold)))
	desired = min(max(desired, max(lim.Min, 1)), lim.Max)
	d.Needed = desired
	why := fmt.Sprintf("lag %d / %d per replica", lag, k.p.LagThreshold)
	if ratio := float64(lag) / float64(k.p.LagThreshold) / float64(cur); math.Abs(ratio-1) <= k.p.Tolerance {
		d.Reason = fmt.Sprintf("steady %d: %s within tolerance %.0f%%", cur, why, 100*k.p.Tolerance)
		st.history = append(st.history, sample{obs.At, cur})
		k.trim(st, obs.At)
		return
	}
	st.history = append(st.history, sample{obs.At, desired})
	k.trim(st, obs.At)
	switch {
	case desired > cur:
		limit := cur + max(4, cur) // max(4 pods, 100%) per UpPeriod
		if !st.lastUp.IsZero() && obs.At.Sub(st.lastUp) < k.p.UpPeriod {
			limit = cur
		}
		d.Target = min(desired, limit)
		if d.Target > cur {
			st.lastUp = obs.At
		}
		d.Reason = fmt.Sprintf("scale up %d→%d: %s", cur, d.Target, why)
	case desired < cur:
		stable := desired
		for _, h := range st.history {
			stable = max(stable, h.needed)
		}
		d.Target = min(stable, cur)
		if d.Target < cur {
			d.Reason = fmt.Sprintf("scale in %d→%d: %s, highest in the %s window %d", cur, d.Target, why, k.p.Stabilisation, stable)
		} else {
			d.Reason = fmt.Sprintf("hold %d: %s, stabilisation window %s", cur, why, k.p.Stabilisation)
		}
	default:
		d.Reason = fmt.Sprintf("steady %d: %s", cur, why)
	}
}

func (k *KEDA) trim(st *kedaState, now time.Time) {
	cut := 0
	for cut < len(st.history) && now.Sub(st.history[cut].at) > k.p.Stabilisation {
		cut++
	}
	st.history = st.history[cut:]
}

package autoscale

import (
	"math"
	"time"
)

// rateEstimator estimates each task type's arrival rate from successive
// observations: what arrived between two is what finished plus what the
// backlog grew by. Finished counts are cumulative per dispatcher replica
// and summed, so a replica's restart makes them go back: that interval is
// skipped (the last estimate stands) and counting starts again from there.
//
// The estimate is the larger of the interval's rate and a moving average
// (half-life halfLife): a burst is acted on at once, a lull only once it
// lasts (the cooldown then keeps the replicas a while longer).
type rateEstimator struct {
	halfLife time.Duration
	last     time.Time
	arrived  map[string]int64 // finished + backlog at last
	avg      map[string]float64
}

func newRateEstimator(halfLife time.Duration) *rateEstimator {
	return &rateEstimator{halfLife: halfLife, arrived: map[string]int64{}, avg: map[string]float64{}}
}

// update takes an observation and returns the rate per type, or why there
// is none yet (the first observation, or time going back).
func (r *rateEstimator) update(obs Observation) (map[string]float64, string) {
	if obs.Missing != "" {
		return nil, obs.Missing
	}
	first := r.last.IsZero()
	dt := obs.At.Sub(r.last).Seconds()
	if !first && dt <= 0 {
		return nil, "observation not after the last one"
	}
	out := make(map[string]float64, len(obs.Types))
	alpha := 1 - math.Exp2(-dt/r.halfLife.Seconds())
	for t, l := range obs.Types {
		now := l.Finished + l.Backlog
		prev, seen := r.arrived[t]
		r.arrived[t] = now
		if first || !seen {
			continue
		}
		delta := now - prev
		if delta < 0 { // a replica restarted, its count began again: keep the estimate
			out[t] = r.avg[t]
			continue
		}
		inst := float64(delta) / dt
		r.avg[t] += alpha * (inst - r.avg[t])
		out[t] = max(inst, r.avg[t])
	}
	r.last = obs.At
	if first {
		return nil, "first observation: no arrival rate yet"
	}
	return out, ""
}

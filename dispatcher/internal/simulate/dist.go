package simulate

import (
	"math"
	"time"
)

// Latency distribution names.
const (
	DistFixed     = "fixed"
	DistUniform   = "uniform"
	DistNormal    = "normal"
	DistLognormal = "lognormal"
)

// minLatency bounds drawn latencies from below (a normal can go negative).
const minLatency = 100 * time.Microsecond

// Dist is a latency distribution. Which fields apply depends on Dist:
// fixed{value}, uniform{min,max}, normal{mean,stddev} (truncated at 100µs),
// lognormal{median,sigma}.
type Dist struct {
	Dist   string   `json:"dist"`
	Value  Duration `json:"value,omitempty"`
	Min    Duration `json:"min,omitempty"`
	Max    Duration `json:"max,omitempty"`
	Mean   Duration `json:"mean,omitempty"`
	Stddev Duration `json:"stddev,omitempty"`
	Median Duration `json:"median,omitempty"`
	// Sigma is the standard deviation of the log of the latency.
	Sigma float64 `json:"sigma,omitempty"`
}

func (d *Dist) validate(field string) error {
	pos := func(name string, v Duration) error {
		if v <= 0 {
			return invalid(field+"."+name, "required and > 0 for dist %q", d.Dist)
		}
		return nil
	}
	for _, f := range []struct {
		name string
		v    Duration
	}{{"value", d.Value}, {"min", d.Min}, {"max", d.Max}, {"mean", d.Mean}, {"stddev", d.Stddev}, {"median", d.Median}} {
		if f.v.D() > MaxDuration {
			return invalid(field+"."+f.name, "%v is beyond %v", f.v.D(), MaxDuration)
		}
	}
	if d.Sigma > 20 {
		return invalid(field+".sigma", "%g is above 20", d.Sigma)
	}
	switch d.Dist {
	case DistFixed:
		return pos("value", d.Value)
	case DistUniform:
		if d.Min < 0 {
			return invalid(field+".min", "%v is negative", d.Min.D())
		}
		if d.Max <= d.Min {
			return invalid(field+".max", "%v must be above min (%v)", d.Max.D(), d.Min.D())
		}
	case DistNormal:
		if err := pos("mean", d.Mean); err != nil {
			return err
		}
		if d.Stddev < 0 {
			return invalid(field+".stddev", "%v is negative", d.Stddev.D())
		}
	case DistLognormal:
		if err := pos("median", d.Median); err != nil {
			return err
		}
		if math.IsNaN(d.Sigma) || math.IsInf(d.Sigma, 0) || d.Sigma < 0 {
			return invalid(field+".sigma", "%g: want a finite number >= 0", d.Sigma)
		}
	case "":
		return invalid(field+".dist", "missing (want fixed, uniform, normal or lognormal)")
	default:
		return invalid(field+".dist", "unknown distribution %q (want fixed, uniform, normal or lognormal)", d.Dist)
	}
	return nil
}

// quantile returns the latency at quantile u in (0,1): drawing u uniformly
// draws a latency, and the same u gives comparable draws across models.
func (d *Dist) quantile(u float64) time.Duration {
	var v float64 // nanoseconds
	switch d.Dist {
	case DistFixed:
		v = float64(d.Value)
	case DistUniform:
		v = float64(d.Min) + u*float64(d.Max-d.Min)
	case DistNormal:
		v = float64(d.Mean) + float64(d.Stddev)*normInv(u)
	case DistLognormal:
		v = float64(d.Median) * math.Exp(d.Sigma*normInv(u))
	}
	if v < float64(minLatency) || math.IsNaN(v) {
		return minLatency
	}
	if v > float64(100*time.Hour) {
		return 100 * time.Hour
	}
	return time.Duration(v)
}

// exceed is P(latency > t).
func (d *Dist) exceed(t time.Duration) float64 {
	x := float64(t)
	switch d.Dist {
	case DistFixed:
		if d.Value.D() > t {
			return 1
		}
		return 0
	case DistUniform:
		p := (float64(d.Max) - x) / float64(d.Max-d.Min)
		return math.Min(1, math.Max(0, p))
	case DistNormal:
		if d.Stddev == 0 {
			if d.Mean.D() > t {
				return 1
			}
			return 0
		}
		return 0.5 * math.Erfc((x-float64(d.Mean))/(float64(d.Stddev)*math.Sqrt2))
	case DistLognormal:
		if d.Sigma == 0 {
			if d.Median.D() > t {
				return 1
			}
			return 0
		}
		return 0.5 * math.Erfc((math.Log(x)-math.Log(float64(d.Median)))/(d.Sigma*math.Sqrt2))
	}
	return 0
}

// mean is the expected latency, for the oracle's tie-break.
func (d *Dist) mean() time.Duration {
	switch d.Dist {
	case DistFixed:
		return d.Value.D()
	case DistUniform:
		return (d.Min + d.Max).D() / 2
	case DistNormal:
		return d.Mean.D()
	case DistLognormal:
		return time.Duration(float64(d.Median) * math.Exp(d.Sigma*d.Sigma/2))
	}
	return 0
}

// normInv is the standard normal quantile function.
func normInv(u float64) float64 {
	if u <= 0 {
		u = 1e-12
	} else if u >= 1 {
		u = 1 - 1e-12
	}
	return math.Sqrt2 * math.Erfinv(2*u-1)
}

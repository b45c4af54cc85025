package policy

import (
	"math"
	"math/bits"
)

// Rand is a small, fast pseudo-random generator (wyrand) owned by one
// decision at a time. Policies get one from the engine: it is seeded per
// decision from Config.Seed (reproducible) or from math/rand/v2 (the
// default), so that concurrent decisions share no generator state and need
// no lock, and drawing allocates nothing.
type Rand struct {
	s     uint64
	spare float64
	has   bool
}

// NewRand returns a generator seeded with seed.
func NewRand(seed uint64) *Rand { return &Rand{s: seed} }

// Seed resets the generator.
func (r *Rand) Seed(seed uint64) { r.s, r.has = seed, false }

// Uint64 returns a uniformly distributed 64-bit value.
func (r *Rand) Uint64() uint64 {
	r.s += 0xa0761d6478bd642f
	hi, lo := bits.Mul64(r.s, r.s^0xe7037ed1a0b428db)
	return hi ^ lo
}

// Float64 returns a uniform value in [0, 1).
func (r *Rand) Float64() float64 { return float64(r.Uint64()>>11) / (1 << 53) }

// IntN returns a value in [0, n); n must be positive. The bias of the
// multiply-shift reduction is below 2^-32 for the small n used here.
func (r *Rand) IntN(n int) int {
	hi, _ := bits.Mul64(r.Uint64(), uint64(n))
	return int(hi)
}

// NormFloat64 returns a standard normal value (Marsaglia's polar method; the
// second value of each pair is kept for the next call).
func (r *Rand) NormFloat64() float64 {
	if r.has {
		r.has = false
		return r.spare
	}
	for {
		u := 2*r.Float64() - 1
		v := 2*r.Float64() - 1
		s := u*u + v*v
		if s > 0 && s < 1 {
			m := math.Sqrt(-2 * math.Log(s) / s)
			r.spare, r.has = v*m, true
			return u * m
		}
	}
}

// Gamma returns a Gamma(shape, 1) value (Marsaglia and Tsang), shape > 0.
func (r *Rand) Gamma(shape float64) float64 {
	if shape < 1 {
		// Gamma(a) = Gamma(a+1) * U^(1/a)
		u := r.Float64()
		for u == 0 {
			u = r.Float64()
		}
		return r.Gamma(shape+1) * math.Pow(u, 1/shape)
	}
	d := shape - 1.0/3
	c := 1 / math.Sqrt(9*d)
	for {
		x := r.NormFloat64()
		v := 1 + c*x
		if v <= 0 {
			continue
		}
		v = v * v * v
		u := r.Float64()
		x2 := x * x
		if u < 1-0.0331*x2*x2 {
			return d * v
		}
		if u > 0 && math.Log(u) < 0.5*x2+d*(1-v+math.Log(v)) {
			return d * v
		}
	}
}

// Beta returns a Beta(a, b) value from two Gamma draws.
func (r *Rand) Beta(a, b float64) float64 {
	x := r.Gamma(a)
	y := r.Gamma(b)
	if x+y == 0 {
		return 0.5
	}
	return x / (x + y)
}

// splitmix64 turns a counter into a well-mixed seed.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

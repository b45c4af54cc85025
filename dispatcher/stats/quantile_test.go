package stats_test

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/mlsched/mlsched/dispatcher/stats"
)

// Quantiles are interpolated within their bucket: for a lognormal like a
// simulated model's (median 30 ms) p50 and p95 come within a few percent of
// the sample's own, where the bucket's upper bound said 43.8 ms for p50
// (issue 22); latencies under the first bound (100 µs) no longer all read
// 0.100 ms; an empty histogram says 0.
func TestQuantileInterpolatesWithinTheBucket(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var h stats.Histogram
	var xs []float64
	for range 20000 {
		ms := 30 * math.Exp(0.3*r.NormFloat64())
		xs = append(xs, ms)
		h.Observe(time.Duration(ms * float64(time.Millisecond)))
	}
	sort.Float64s(xs)
	for _, q := range []float64{0.5, 0.95, 0.99} {
		want := xs[int(q*float64(len(xs)))]
		got := float64(h.Quantile(q)) / float64(time.Millisecond)
		t.Logf("p%.0f: interpolated %.2f ms, sample %.2f ms (%+.1f%%)", 100*q, got, want, 100*(got-want)/want)
		if math.Abs(got-want)/want > 0.05 {
			t.Errorf("p%.0f = %.2f ms, the sample's is %.2f ms: more than 5%% off", 100*q, got, want)
		}
	}
	var fast stats.Histogram
	for i := range 100 {
		fast.Observe(time.Duration(i%50+1) * time.Microsecond) // 1..50 µs
	}
	if p50 := fast.Quantile(0.5); p50 >= 100*time.Microsecond || p50 <= 0 {
		t.Errorf("p50 of 1-50 µs latencies = %v, want under 100 µs", p50)
	}
	var empty stats.Histogram
	if empty.Quantile(0.5) != 0 {
		t.Error("empty histogram has a quantile")
	}
	// Monotonic in q.
	prev := time.Duration(0)
	for q := 0.0; q <= 1; q += 0.01 {
		if v := h.Quantile(q); v < prev {
			t.Fatalf("Quantile(%.2f) = %v < Quantile below it %v", q, v, prev)
		} else {
			prev = v
		}
	}
}

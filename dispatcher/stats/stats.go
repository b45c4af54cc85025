package stats

import (
	"context"
	"math"
	"time"
)

// Kind is what an Event records.
type Kind uint8

const (
	// KindDispatched: an attempt was sent to a node (in-flight +1).
	KindDispatched Kind = iota
	// KindSuccess: the model produced an output (in-flight -1).
	KindSuccess
	// KindModelError: the model failed (in-flight -1). Counts as a failure.
	KindModelError
	// KindTimeout: no answer in time, or the attempt was lost (in-flight -1).
	// Counts as a failure.
	KindTimeout
	// KindTaskError: bad input (in-flight -1). Never counts against a model.
	KindTaskError
	// KindExpired: the worker skipped a stale dispatch (in-flight -1).
	// Neither a success nor a failure of the model.
	KindExpired
)

// Event is one thing that happened to a (model, node).
type Event struct {
	Model string
	Node  string
	Kind  Kind
	// Latency of the attempt, for outcome kinds.
	Latency time.Duration
	// Late marks an outcome of an attempt that had already been superseded:
	// it is counted as usual and also in Counts.Late.
	Late bool
	// At is when it happened; the zero time means the store's clock.
	At time.Time
}

// Counts are windowed event counts.
type Counts struct {
	Dispatched  int64 `json:"dispatched"`
	Successes   int64 `json:"successes"`
	ModelErrors int64 `json:"model_errors"`
	Timeouts    int64 `json:"timeouts"`
	TaskErrors  int64 `json:"task_errors"`
	Expired     int64 `json:"expired"`
	Late        int64 `json:"late"`
}

// Failures counts the outcomes that count against a model.
func (c Counts) Failures() int64 { return c.ModelErrors + c.Timeouts }

// Judged counts the outcomes that say something about a model's reliability.
func (c Counts) Judged() int64 { return c.Successes + c.Failures() }

// Add adds o to c.
func (c *Counts) Add(o Counts) {
	c.Dispatched += o.Dispatched
	c.Successes += o.Successes
	c.ModelErrors += o.ModelErrors
	c.Timeouts += o.Timeouts
	c.TaskErrors += o.TaskErrors
	c.Expired += o.Expired
	c.Late += o.Late
}

// NumLatencyBuckets is the number of histogram buckets.
const NumLatencyBuckets = 40

// latencyBounds[i] is the upper bound of bucket i, in microseconds: a
// geometric series from 100µs growing by 1.5x (the last bucket is +Inf).
// Quantile interpolates within a bucket, so its estimates are accurate to
// well within one 1.5x step (see Quantile).
var latencyBounds = func() [NumLatencyBuckets]float64 {
	var b [NumLatencyBuckets]float64
	v := 100.0
	for i := range b {
		b[i] = v
		v *= 1.5
	}
	b[NumLatencyBuckets-1] = math.Inf(1)
	return b
}()

// BucketOf returns the histogram bucket of a latency.
func BucketOf(d time.Duration) int {
	us := float64(d) / float64(time.Microsecond)
	// binary search over the bounds
	lo, hi := 0, NumLatencyBuckets-1
	for lo < hi {
		mid := (lo + hi) / 2
		if us <= latencyBounds[mid] {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo
}

// BucketBound returns the upper bound of bucket i (the last is very large).
func BucketBound(i int) time.Duration {
	if i >= NumLatencyBuckets-1 {
		return time.Duration(latencyBounds[NumLatencyBuckets-2]*1.5) * time.Microsecond
	}
	return time.Duration(latencyBounds[i] * float64(time.Microsecond))
}

// Histogram counts latencies of successful attempts in fixed buckets.
type Histogram [NumLatencyBuckets]int64

// Observe adds one latency.
func (h *Histogram) Observe(d time.Duration) { h[BucketOf(d)]++ }

// Add adds o to h.
func (h *Histogram) Add(o *Histogram) {
	for i := range h {
		h[i] += o[i]
	}
}

// Count is the number of observations.
func (h *Histogram) Count() int64 {
	var n int64
	for _, v := range h {
		n += v
	}
	return n
}

// Quantile estimates quantile q (0..1) of the observed latencies, or 0 when
// the histogram is empty. It finds the bucket holding rank q·n and
// interpolates within it: the bucket's observations are spread over it
// with a density that slopes as its neighbours' counts do (more towards the
// fuller neighbour; flat when they are alike), on a log scale since the
// bounds grow by 1.5x, linearly from 0 in the first bucket. The bucket's
// upper bound alone, as before, overstated a latency by up to 50% (a 30 ms
// model read 43.8 ms) and gave every latency under 100 µs as 0.100 ms; this
// estimate is within a few percent for smooth distributions and never
// leaves the bucket. The overflow bucket answers its lower bound.
func (h *Histogram) Quantile(q float64) time.Duration {
	n := h.Count()
	if n == 0 {
		return 0
	}
	q = min(max(q, 0), 1)
	rank := q * float64(n)
	var seen int64
	for i, v := range h {
		if v == 0 {
			continue
		}
		if float64(seen+v) < rank {
			seen += v
			continue
		}
		x := h.within(i, (rank-float64(seen))/float64(v))
		hi := latencyBounds[i]
		if i == 0 {
			return time.Duration(x * hi * float64(time.Microsecond))
		}
		lo := latencyBounds[i-1]
		if math.IsInf(hi, 1) {
			return time.Duration(lo * float64(time.Microsecond))
		}
		return time.Duration(lo * math.Pow(hi/lo, x) * float64(time.Microsecond))
	}
	return BucketBound(NumLatencyBuckets - 1)
}

// within is where, from 0 to 1 across bucket i, the fraction frac of its
// observations is reached when their density is linear across the bucket,
// d + s·(x − ½), with d its count and s the slope its neighbours' counts
// give (kept so that the density stays positive).
func (h *Histogram) within(i int, frac float64) float64 {
	d := float64(h[i])
	var left, right float64
	if i > 0 {
		left = float64(h[i-1])
	}
	if i < NumLatencyBuckets-1 {
		right = float64(h[i+1])
	}
	slope := (right - left) / 2
	slope = min(max(slope, -2*d), 2*d)
	if math.Abs(slope) < 1e-9*d {
		return frac
	}
	// Solve d·x + slope·(x² − x)/2 = frac·d for x in [0, 1].
	a, b, c := slope/2, d-slope/2, -frac*d
	x := (-b + math.Sqrt(b*b-4*a*c)) / (2 * a)
	return min(max(x, 0), 1)
}

// BreakerState is a circuit breaker's state.
type BreakerState uint8

const (
	BreakerClosed BreakerState = iota
	BreakerOpen
	BreakerHalfOpen
)

func (s BreakerState) String() string {
	switch s {
	case BreakerOpen:
		return "open"
	case BreakerHalfOpen:
		return "half-open"
	default:
		return "closed"
	}
}

// Breaker is the stored state of one circuit breaker.
type Breaker struct {
	State BreakerState `json:"state"`
	// Since is when the breaker entered State.
	Since time.Time `json:"since"`
}

// BreakerKey names a breaker: a model (Node "") or a (model, node).
type BreakerKey struct {
	Model string
	Node  string
}

// Series is the statistics of one model or one (model, node).
type Series struct {
	Counts
	// Recent are the counts of the most recent buckets only (Window.Recent),
	// a subset of Counts: a change in a model's behaviour shows there long
	// before it moves counts over the whole window.
	Recent Counts `json:"recent"`
	// Latency of successful attempts in the window.
	Latency Histogram `json:"-"`
	// FailLatencySum is the summed latency of failed attempts in the window,
	// in microseconds, so that a fast failure can be charged for.
	FailLatencySumUs int64 `json:"fail_latency_sum_us"`
	// InFlight is dispatched minus finished, over all time (not windowed).
	InFlight int64 `json:"in_flight"`
	// ConsecutiveFailures since the last success (not windowed).
	ConsecutiveFailures int64 `json:"consecutive_failures"`
	// LastOutcome is when the last outcome was recorded.
	LastOutcome time.Time `json:"last_outcome"`
	Breaker     Breaker   `json:"breaker"`
}

// ModelStats is a model's series and its per-node series.
type ModelStats struct {
	Series
	Nodes map[string]*Series `json:"nodes"`
}

// Snapshot is a consistent-enough copy of every model's statistics.
type Snapshot struct {
	Taken  time.Time              `json:"taken"`
	Window time.Duration          `json:"window"`
	Models map[string]*ModelStats `json:"models"`
}

// Window configures the rolling window.
type Window struct {
	// Size of the window (default 5m).
	Size time.Duration
	// Bucket granularity (default 10s). Size is rounded up to whole buckets.
	Bucket time.Duration
	// Recent is the span of Series.Recent (default 2 buckets), rounded up
	// to whole buckets and capped at the window: the current bucket and the
	// ones before it, so that it never covers less than one full bucket.
	Recent time.Duration
}

// WithDefaults fills zero fields.
func (w Window) WithDefaults() Window {
	if w.Size <= 0 {
		w.Size = 5 * time.Minute
	}
	if w.Bucket <= 0 {
		w.Bucket = 10 * time.Second
	}
	if w.Bucket > w.Size {
		w.Bucket = w.Size
	}
	if w.Recent <= 0 {
		w.Recent = 2 * w.Bucket
	}
	if w.Recent > w.Size {
		w.Recent = w.Size
	}
	return w
}

// Store records events and returns snapshots. Implementations are safe for
// concurrent use.
type Store interface {
	// Record applies events atomically as one batch.
	Record(ctx context.Context, events []Event) error
	// Snapshot returns the statistics of every model seen in the window or
	// with a non-zero gauge.
	Snapshot(ctx context.Context) (*Snapshot, error)
	// SetBreaker moves a breaker from state `from` to `to` only if it is in
	// `from` now (compare-and-set on State and Since), so that replicas do not
	// fight over a transition. It reports whether it did.
	SetBreaker(ctx context.Context, key BreakerKey, from, to Breaker) (bool, error)
	// Close releases resources.
	Close() error
}

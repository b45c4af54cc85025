package stats

import (
	"errors"
	"fmt"
	"time"
)

// The helpers below define the window once for every backend, so that the
// in-memory and Redis stores agree on which events a snapshot shows.

// Buckets is the number of buckets the window spans (Size rounded up).
func (w Window) Buckets() int64 {
	w = w.WithDefaults()
	return int64((w.Size + w.Bucket - 1) / w.Bucket)
}

// Span is the effective window: Buckets() whole buckets.
func (w Window) Span() time.Duration {
	w = w.WithDefaults()
	return time.Duration(w.Buckets()) * w.Bucket
}

// Index is the bucket holding t: floor(t.UnixNano() / Bucket).
func (w Window) Index(t time.Time) int64 {
	w = w.WithDefaults()
	n, b := t.UnixNano(), int64(w.Bucket)
	q := n / b
	if n%b < 0 {
		q--
	}
	return q
}

// Range is the inclusive range of bucket indexes a snapshot taken at now
// reads: the current bucket, the Buckets()-1 before it, and one bucket
// ahead that absorbs small clock skew between replicas.
func (w Window) Range(now time.Time) (first, last int64) {
	cur := w.Index(now)
	return cur - w.Buckets() + 1, cur + 1
}

// RecentBuckets is the number of buckets Series.Recent spans (Recent
// rounded up, at least 1, at most Buckets()).
func (w Window) RecentBuckets() int64 {
	w = w.WithDefaults()
	return min(max(int64((w.Recent+w.Bucket-1)/w.Bucket), 1), w.Buckets())
}

// RecentFirst is the first bucket index of Series.Recent in a snapshot
// taken at now; Recent ends where the window does (Range's last).
func (w Window) RecentFirst(now time.Time) int64 {
	return w.Index(now) - w.RecentBuckets() + 1
}

// EventBucket is the bucket an event dated at is counted in, given the
// store's clock now: events from further in the future than one bucket are
// counted now (a skewed clock must not poison a future bucket), and events
// that are already out of the window report ok=false (they still move the
// gauges).
func (w Window) EventBucket(at, now time.Time) (idx int64, ok bool) {
	first, last := w.Range(now)
	return w.WithDefaults().eventBucket(at, first, last)
}

// eventBucket is EventBucket for a window with defaults and a precomputed
// Range.
func (w Window) eventBucket(at time.Time, first, last int64) (idx int64, ok bool) {
	if at.IsZero() {
		return last - 1, true
	}
	n, b := at.UnixNano(), int64(w.Bucket)
	idx = n / b
	if n%b < 0 {
		idx--
	}
	switch {
	case idx > last:
		return last - 1, true
	case idx < first:
		return idx, false
	}
	return idx, true
}

// UnixNanos encodes a time for storage: 0 for the zero time.
func UnixNanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// FromUnixNanos decodes UnixNanos.
func FromUnixNanos(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

// IsFailure reports whether k counts against a model.
func (k Kind) IsFailure() bool { return k == KindModelError || k == KindTimeout }

// IsOutcome reports whether k finishes an attempt (every kind but
// KindDispatched).
func (k Kind) IsOutcome() bool { return k != KindDispatched && k <= KindExpired }

// Valid reports whether k is one of the defined kinds.
func (k Kind) Valid() bool { return k <= KindExpired }

func (k Kind) String() string {
	switch k {
	case KindDispatched:
		return "dispatched"
	case KindSuccess:
		return "success"
	case KindModelError:
		return "model_error"
	case KindTimeout:
		return "timeout"
	case KindTaskError:
		return "task_error"
	case KindExpired:
		return "expired"
	}
	return "invalid"
}

// countOf returns the counter of c that kind k increments.
func (c *Counts) countOf(k Kind) *int64 {
	switch k {
	case KindDispatched:
		return &c.Dispatched
	case KindSuccess:
		return &c.Successes
	case KindModelError:
		return &c.ModelErrors
	case KindTimeout:
		return &c.Timeouts
	case KindTaskError:
		return &c.TaskErrors
	case KindExpired:
		return &c.Expired
	}
	return nil
}

// Count adds one event of kind k (and one late event if late).
func (c *Counts) Count(k Kind, late bool) {
	if p := c.countOf(k); p != nil {
		*p++
	}
	if late {
		c.Late++
	}
}

// ErrInvalidEvent is returned for an event a store cannot record (unknown
// kind, empty model, or a name that is not a protocol token); the rest of
// the batch is not applied.
var ErrInvalidEvent = errors.New("invalid stats event")

// Validate checks the parts of an event every store relies on.
func (e *Event) Validate() error {
	if !e.Kind.Valid() {
		return fmt.Errorf("%w: kind %d", ErrInvalidEvent, e.Kind)
	}
	if err := validName(e.Model); err != nil {
		return fmt.Errorf("%w: model %q: %v", ErrInvalidEvent, e.Model, err)
	}
	if e.Node != "" {
		if err := validName(e.Node); err != nil {
			return fmt.Errorf("%w: node %q: %v", ErrInvalidEvent, e.Node, err)
		}
	}
	return nil
}

// validName accepts what protocol.ValidToken accepts, minus the length
// limit: stores rely only on names being non-empty printable ASCII without
// spaces (the Redis store separates names with a space).
func validName(s string) error {
	if s == "" {
		return errors.New("is empty")
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f {
			return fmt.Errorf("has a space, control or non-ASCII byte at %d", i)
		}
	}
	return nil
}

// ValidateBatch validates every event of a batch.
func ValidateBatch(events []Event) error {
	for i := range events {
		if err := events[i].Validate(); err != nil {
			return fmt.Errorf("event %d: %w", i, err)
		}
	}
	return nil
}

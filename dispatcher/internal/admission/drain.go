package admission

import (
	"sync"
	"time"

	"github.com/mlsched/mlsched/shared/protocol"
)

// expiredError is the error of a task whose deadline passed before it
// could start.
func expiredError(t *protocol.Task, expiry time.Time, where string) error {
	return protocol.Errorf(protocol.CodeExpired, "the task's deadline (%s after submission) passed at %s %s; it was not started",
		time.Duration(t.DeadlineMs)*time.Millisecond, expiry.UTC().Format(time.RFC3339Nano), where)
}

// drainMeter measures how fast this replica sends held work on (dispatches
// per second, smoothed), for the retry_after_ms of a task it sheds, rejects
// or lets expire.
type drainMeter struct {
	mu    sync.Mutex
	start time.Time
	n     int
	rate  float64 // per second, exponentially smoothed over 1 s windows
}

// dispatched counts one dispatch (a nil meter measures nothing).
func (m *drainMeter) dispatched(now time.Time) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.start.IsZero() {
		m.start = now
	}
	m.n++
	if el := now.Sub(m.start); el >= time.Second {
		r := float64(m.n) / el.Seconds()
		if m.rate == 0 {
			m.rate = r
		} else {
			m.rate = 0.7*m.rate + 0.3*r
		}
		m.start, m.n = now, 0
	}
}

// perSecond is the measured drain rate (0: none yet).
func (m *drainMeter) perSecond() float64 {
	if m == nil {
		return 0
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.rate
}

// retryAfter estimates when waiting work of the given size is drained: at
// least 100 ms, at most a minute; a second when nothing is measured yet.
func (m *drainMeter) retryAfter(waiting int) time.Duration {
	if m == nil {
		return time.Second
	}
	m.mu.Lock()
	rate := m.rate
	m.mu.Unlock()
	if rate <= 0 {
		return time.Second
	}
	d := time.Duration(float64(waiting+1) / rate * float64(time.Second))
	return min(max(d, 100*time.Millisecond), time.Minute)
}

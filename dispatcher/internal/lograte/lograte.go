// Package lograte bounds the rate of a log line: a flood of bad messages
// must not become a flood of log lines.
package lograte

import (
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
)

// Sometimes logs at most once per interval: a flood of bad messages must
// not become a flood of log lines. Suppressed lines are counted and the
// count is reported with the next one logged.
type Sometimes struct {
	Every      time.Duration
	next       atomic.Int64 // unix nanos
	suppressed atomic.Int64
}

func (s *Sometimes) Log(l *zerolog.Logger, fn func(*zerolog.Event) *zerolog.Event, msg string) {
	now := time.Now().UnixNano()
	n := s.next.Load()
	if now < n || !s.next.CompareAndSwap(n, now+int64(s.Every)) {
		s.suppressed.Add(1)
		return
	}
	fn(l.Warn()).Int64("suppressed_since_last", s.suppressed.Swap(0)).Msg(msg)
}

package dispatcher

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// supersededSet knows which attempts were declared lost and re-dispatched.
// It is rare (only lost attempts), so every replica keeps all of it in memory,
// fed by a watch on the MLSCHED_SUPERSEDED bucket: checking an outcome costs
// no round trip.
type supersededSet struct {
	kv  jetstream.KeyValue
	log zerolog.Logger

	mu sync.RWMutex
	m  map[string]int // task id → highest superseded attempt
}

func newSupersededSet(kv jetstream.KeyValue, log zerolog.Logger) *supersededSet {
	return &supersededSet{kv: kv, log: log, m: map[string]int{}}
}

// Is reports whether the attempt was superseded.
func (s *supersededSet) Is(task string, attempt int) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.m[task] >= attempt
}

// Mark records that the attempt was superseded, here and for every replica.
func (s *supersededSet) Mark(task string, attempt int) {
	s.set(task, attempt)
	if s.kv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := s.kv.Put(ctx, task, []byte(strconv.Itoa(attempt))); err != nil {
		s.log.Warn().Err(err).Str("task_id", task).Msg("cannot record a superseded attempt for other replicas")
	}
}

func (s *supersededSet) set(task string, attempt int) {
	s.mu.Lock()
	if s.m[task] < attempt {
		s.m[task] = attempt
	}
	s.mu.Unlock()
}

// Run follows the bucket until ctx is done.
func (s *supersededSet) Run(ctx context.Context) {
	for ctx.Err() == nil {
		w, err := s.kv.WatchAll(ctx)
		if err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		for e := range w.Updates() {
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			if n, err := strconv.Atoi(string(e.Value())); err == nil {
				s.set(e.Key(), n)
			}
		}
		_ = w.Stop()
	}
}

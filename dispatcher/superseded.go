package dispatcher

import (
	"context"
	"encoding/base64"
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
	m  map[string]int // supersededKey → highest superseded attempt
}

func newSupersededSet(kv jetstream.KeyValue, log zerolog.Logger) *supersededSet {
	return &supersededSet{kv: kv, log: log, m: map[string]int{}}
}

// supersededKey names one submission of a task in the bucket. Task ids may
// hold characters KV keys do not allow, so the key is base64url.
func supersededKey(task, submission string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(task + "\x00" + submission))
}

// Is reports whether the attempt of that submission of the task was
// superseded.
func (s *supersededSet) Is(task, submission string, attempt int) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.m[supersededKey(task, submission)] >= attempt
}

// Mark records that the attempt was superseded, here and for every replica.
func (s *supersededSet) Mark(task, submission string, attempt int) {
	key := supersededKey(task, submission)
	s.set(key, attempt)
	if s.kv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := s.kv.Put(ctx, key, []byte(strconv.Itoa(attempt))); err != nil {
		s.log.Warn().Err(err).Str("task_id", task).Msg("cannot record a superseded attempt for other replicas")
	}
}

func (s *supersededSet) set(key string, attempt int) {
	s.mu.Lock()
	if s.m[key] < attempt {
		s.m[key] = attempt
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

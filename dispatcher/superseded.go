package dispatcher

import (
	"context"
	"encoding/base64"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/shared/jsplumb"
	"github.com/mlsched/mlsched/shared/lifecycle"
)

// supersededSet knows which attempts were declared lost and re-dispatched.
// It is rare (only lost attempts), so every replica keeps all of it in memory,
// fed by a watch on the MLSCHED_SUPERSEDED bucket: checking an outcome costs
// no round trip.
type supersededSet struct {
	lifecycle.Loop
	kv  jetstream.KeyValue
	log zerolog.Logger

	mu sync.RWMutex
	m  map[string]int // supersededKey → highest superseded attempt
	// cancelled holds the ids of tasks with a cancelled submission, so that
	// intake checks a task with one map lookup and no key encoding.
	cancelled map[string]struct{}
	// lost holds the attempts lost with the attempt streams, by
	// supersededKey (lost.go).
	lost map[string]attemptRecord
	// at is when each key was last written; keys older than retention (the
	// bucket's TTL, after which the bucket forgets them without telling its
	// watchers) are pruned, so the set does not grow for ever.
	at        map[string]time.Time
	retention time.Duration
	lastPrune time.Time
	now       func() time.Time
}

// supersededRetention is how long the MLSCHED_SUPERSEDED bucket keeps an
// entry (topology.EnsureSupersededBucket), far longer than any attempt.
const supersededRetention = 24 * time.Hour

func newSupersededSet(kv jetstream.KeyValue, log zerolog.Logger) *supersededSet {
	return &supersededSet{kv: kv, log: log, m: map[string]int{}, cancelled: map[string]struct{}{}, lost: map[string]attemptRecord{},
		at: map[string]time.Time{}, retention: supersededRetention, now: time.Now}
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

// cancelledAttempt marks a cancelled submission: every attempt of it, past
// and future, is superseded.
const cancelledAttempt = math.MaxInt32

// Cancelled reports whether that submission of the task was cancelled.
func (s *supersededSet) Cancelled(task, submission string) bool {
	s.mu.RLock()
	_, some := s.cancelled[task]
	s.mu.RUnlock()
	return some && s.Is(task, submission, cancelledAttempt)
}

// CancelledAny reports whether any submission of the task was cancelled:
// a pipeline's later steps are submissions of their own (pipeline.go).
func (s *supersededSet) CancelledAny(task string) bool {
	s.mu.RLock()
	_, some := s.cancelled[task]
	s.mu.RUnlock()
	return some
}

// Mark records that the attempt was superseded, here and for every replica.
func (s *supersededSet) Mark(task, submission string, attempt int) {
	if err := s.put(context.Background(), task, submission, attempt); err != nil {
		s.log.Warn().Err(err).Str("task_id", task).Msg("cannot record a superseded attempt for other replicas")
	}
}

// Cancel records, here and for every replica, that the submission was
// cancelled: it is not dispatched again and its outcomes are late.
func (s *supersededSet) Cancel(ctx context.Context, task, submission string) error {
	return s.put(ctx, task, submission, cancelledAttempt)
}

func (s *supersededSet) put(ctx context.Context, task, submission string, attempt int) error {
	key := supersededKey(task, submission)
	s.set(key, attempt, s.now())
	if s.kv == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := s.kv.Put(ctx, key, []byte(strconv.Itoa(attempt)))
	return err
}

func (s *supersededSet) set(key string, attempt int, at time.Time) {
	s.mu.Lock()
	if s.m[key] < attempt {
		s.m[key] = attempt
	}
	if at.After(s.at[key]) {
		s.at[key] = at
	}
	s.pruneLocked()
	if attempt == cancelledAttempt {
		if raw, err := base64.RawURLEncoding.DecodeString(key); err == nil {
			task, _, _ := strings.Cut(string(raw), "\x00")
			s.cancelled[task] = struct{}{}
		}
	}
	s.mu.Unlock()
}

// Start follows the bucket until Stop; it is started once the bucket's
// current contents are loaded.
func (s *supersededSet) Start(ctx context.Context) error {
	return s.Go(ctx, func(ctx context.Context, ready func()) error {
		jsplumb.Follow(ctx, s.kv, s.apply, ready, jsplumb.FollowOptions{Log: s.log})
		return nil
	})
}

func (s *supersededSet) apply(e jetstream.KeyValueEntry) {
	if e.Operation() != jetstream.KeyValuePut {
		return
	}
	if key, ok := strings.CutPrefix(e.Key(), lostKeyPrefix); ok {
		s.applyLost(key, e.Value(), e.Created())
		return
	}
	if n, err := strconv.Atoi(string(e.Value())); err == nil {
		s.set(e.Key(), n, e.Created())
	}
}

// pruneLocked drops, at most once a minute, the keys older than the
// retention. Called with mu held.
func (s *supersededSet) pruneLocked() {
	now := s.now()
	if now.Sub(s.lastPrune) < time.Minute {
		return
	}
	s.lastPrune = now
	cut := now.Add(-s.retention)
	for key, at := range s.at {
		if !at.Before(cut) {
			continue
		}
		delete(s.at, key)
		if s.m[key] == cancelledAttempt {
			if raw, err := base64.RawURLEncoding.DecodeString(key); err == nil {
				task, _, _ := strings.Cut(string(raw), "\x00")
				delete(s.cancelled, task)
			}
		}
		delete(s.m, key)
		delete(s.lost, key)
	}
}

// size is how many keys the set holds (for tests).
func (s *supersededSet) size() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.m)
}

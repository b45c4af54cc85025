package dispatcher

import (
	"context"
	"encoding/json"
	"time"

	"github.com/mlsched/mlsched/dispatcher/internal/admission"
)

// Attempts lost with the attempt streams (issue 39). MLSCHED_DISPATCH and
// MLSCHED_OUTCOMES live in memory by default: a nats-server restart loses
// them, and with them every attempt in flight and its history (the history
// travels in the dispatch). The task itself is safe in MLSCHED_TASKS and is
// delivered again, but it would start over at attempt 1 with an empty
// history, so that max_attempts no longer bounded what it costs.
//
// Writing each attempt somewhere durable would cost every task an fsync.
// Instead the replica that dispatched an attempt remembers it in memory
// while it keeps the task (taskKeeper), and when its sweeper sees
// MLSCHED_DISPATCH re-created, it writes the attempts it dispatched before
// then to the MLSCHED_SUPERSEDED bucket (file storage, watched by every
// replica): a write per attempt in flight, once per restart. The replica
// that gets the task again looks the record up: the attempt ends as lost
// (not counted against its model: the server's restart was not its fault),
// it is marked superseded so that its late outcome, should one come, is
// not final, and the task goes on at the next attempt with its history, or
// ends attempts_exhausted when none is left.
//
// What it does not cover: a replica that restarted with the server has
// nothing to record (its tasks start over as before), and an attempt
// dispatched in the moment between the stream's loss and the sweep that
// notices it is recorded only if dispatched before the new stream's
// creation.

// attemptRecord is one attempt a replica dispatched, as lost.go records it.
type attemptRecord = admission.Record

// recordLost writes the attempts this replica dispatched before the
// attempt streams were re-created at created.
func recordLost(ctx context.Context, k *taskKeeper, s *supersededSet, created time.Time) (int, error) {
	recs := k.inFlight(created)
	var firstErr error
	for _, r := range recs {
		if err := s.RecordLost(ctx, r); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	return len(recs), firstErr
}

// lostKeyPrefix marks a lost attempt's record in MLSCHED_SUPERSEDED (the
// other keys hold a superseded attempt's number; a replica of an earlier
// version ignores a value that is not a number).
const lostKeyPrefix = "lost."

// RecordLost records, here and for every replica, an attempt lost with the
// attempt streams.
func (s *supersededSet) RecordLost(ctx context.Context, r attemptRecord) error {
	key := supersededKey(r.Task, r.Submission)
	if !s.setLost(key, r, s.now()) || s.kv == nil {
		return nil // a later attempt of it is recorded already
	}
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = s.kv.Put(ctx, lostKeyPrefix+key, data)
	return err
}

// LostAttempt returns the record of the task's attempt lost with the
// attempt streams, unless that attempt is superseded already (the task went
// on from it).
func (s *supersededSet) LostAttempt(task, submission string) (attemptRecord, bool) {
	key := supersededKey(task, submission)
	s.mu.RLock()
	defer s.mu.RUnlock()
	r, ok := s.lost[key]
	if !ok || s.m[key] >= r.Attempt {
		return attemptRecord{}, false
	}
	return r, true
}

// setLost keeps the latest attempt's record of a submission (replicas may
// record an earlier attempt of a task another replica went on with); it
// reports whether r was kept.
func (s *supersededSet) setLost(key string, r attemptRecord, at time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.lost[key]; ok && old.Attempt >= r.Attempt {
		return false
	}
	s.lost[key] = r
	if at.After(s.at[key]) {
		s.at[key] = at
	}
	s.pruneLocked()
	return true
}

// applyLost is a lost attempt's record seen in the bucket.
func (s *supersededSet) applyLost(key string, value []byte, at time.Time) {
	var r attemptRecord
	if err := json.Unmarshal(value, &r); err != nil || r.Attempt <= 0 {
		s.log.Warn().Err(err).Str("key", key).Msg("unreadable lost-attempt record ignored")
		return
	}
	s.setLost(key, r, at)
}

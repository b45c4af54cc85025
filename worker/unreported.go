package worker

import (
	"sync"
	"sync/atomic"
)

// Outcomes not stored. When the outcome of a run cannot be stored (the
// server partitioned, restarting, or slow past the publish timeout), its
// dispatch is nak'ed and comes back. Running it again would run the task
// once more than its attempt: a cluster fault could make a task run more
// times than its max_attempts (issue 39, counted by the chaos runs' workers:
// 17 tasks ran 4 times with max_attempts 3). So the node keeps the outcomes
// it could not store, by their message id (one per attempt), and a
// redelivered dispatch whose outcome is kept is reported again, not run.
// A process that dies loses them: what it ran and could not report is run
// again after its restart (a kill -9 between the run and the report).

// unreportedMax bounds the kept outcomes; the oldest goes first. A kept
// outcome whose dispatch never comes back (the dispatcher failed the
// attempt over at its deadline) waits here until it is pushed out.
const unreportedMax = 4096

// unreported is the node's outcomes not stored yet.
type unreported struct {
	mu    sync.Mutex
	byID  map[string][]byte
	order []string // insertion order, for the bound
	// again counts the outcomes taken to be reported again.
	again atomic.Int64
	// kept mirrors len(byID), so that the hot path (every dispatch asks)
	// takes no lock while nothing is kept, which is nearly always.
	kept atomic.Int64
}

func newUnreported() *unreported { return &unreported{byID: map[string][]byte{}} }

// keep remembers the encoded outcome of msgID.
func (u *unreported) keep(msgID string, body []byte) {
	if msgID == "" {
		return
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if _, ok := u.byID[msgID]; !ok {
		u.order = append(u.order, msgID)
	}
	u.byID[msgID] = body
	for len(u.byID) > unreportedMax && len(u.order) > 0 {
		delete(u.byID, u.order[0])
		u.order = u.order[1:]
	}
	u.kept.Store(int64(len(u.byID)))
	if len(u.order) > 2*unreportedMax { // taken ones left in order
		kept := u.order[:0]
		for _, id := range u.order {
			if _, ok := u.byID[id]; ok {
				kept = append(kept, id)
			}
		}
		u.order = kept
	}
}

// take returns and forgets the kept outcome of msgID.
func (u *unreported) take(msgID string) ([]byte, bool) {
	if u.kept.Load() == 0 {
		return nil, false
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	body, ok := u.byID[msgID]
	if ok {
		delete(u.byID, msgID)
		u.kept.Store(int64(len(u.byID)))
		u.again.Add(1)
	}
	return body, ok
}

// len is how many outcomes are kept.
func (u *unreported) len() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.byID)
}

package admission

import (
	"time"

	"github.com/mlsched/mlsched/dispatcher/internal/policy"
	"github.com/mlsched/mlsched/shared/jsplumb"
)

// Shedding order (docs/policies.md, "Shedding"): sheddable (negative
// priority) work goes first. No non-sheddable task of a candidate set may
// end for want of capacity (expired, or failed saturated) while a
// sheddable task of the same set still waits in the hold: the hold's order
// would have served the sheddable one after it anyway, so it cannot start
// in time either. Before the hold ends a non-sheddable task so, it sheds
// every sheddable task of the set it holds; a non-sheddable task ended
// while one held before it is still held (one another goroutine had in
// hand) is a shedding inversion, counted (ShedInversions, which must stay
// 0). One held after the ending began is not: it arrived after.
//
// Only the tasks held for capacity count (those the room counts per
// candidate set): a task held over its tenant's quota or cap competes with
// nobody's slots.

// sheddableHeld reports whether a sheddable task of the candidate set key
// is held for capacity (those taken out for a pass included).
func (h *holdRoom) sheddableHeld(key string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.fair.HeldBelow(key, 0)
}

// shedFirst is called by a pass of the hold as a non-sheddable task of the
// candidate set key, q[i], is about to end for want of capacity: it sheds
// the sheddable tasks of the set held for capacity, those of the pass's q
// after i (marked gone, the pass skips them) and those held since the pass
// began, then counts a shedding inversion if one is still held.
func (in *Stage) shedFirst(q []*heldTask, i int, key string) {
	h := in.held
	if h.n.Load() == 0 && h.inPass.Load() == 0 {
		return
	}
	if !h.sheddableHeld(key) {
		return
	}
	now := time.Now()
	sheddable := func(o *heldTask) bool { return o.counted && o.key == key && o.a.Task.Priority < 0 }
	var drop []*heldTask
	for _, o := range q[min(i+1, len(q)):] {
		if !o.gone && sheddable(o) {
			o.gone = true
			drop = append(drop, o)
		}
	}
	h.mu.Lock()
	n := 0
	for _, o := range h.q {
		if sheddable(o) {
			drop = append(drop, o)
			continue
		}
		h.q[n] = o
		n++
	}
	clear(h.q[n:])
	h.q = h.q[:n]
	h.n.Store(int64(n))
	h.mu.Unlock()
	for _, o := range drop {
		h.leave(o)
	}
	// One held before now and held still (one another goroutine had in
	// hand) is an inversion; one held since came after this ending.
	inverted := false
	h.mu.Lock()
	for _, o := range h.q {
		inverted = inverted || (sheddable(o) && o.since.Before(now))
	}
	h.mu.Unlock()
	for _, o := range drop {
		in.shed(o, 0, "a task of its candidate set that may not be shed ran out of time before it: sheddable work goes first")
	}
	if inverted {
		in.Counters.ShedInversions.Add(1)
	}
}

// expireAfterShed: a non-sheddable task found expired at intake while
// sheddable tasks of its set are held is handed to the hold, which ends it
// at its next pass (woken now) after shedding them: only a pass sees the
// tasks it has taken out. It reports whether the hold took it.
func (in *Stage) expireAfterShed(a *Attempt, msg jsplumb.Msg, expiry time.Time) bool {
	if a.Task.Priority < 0 || !in.held.any() || !in.held.sheddableHeld(candidateKey(&a.Task)) {
		return false
	}
	if a.heldSince.IsZero() {
		a.heldSince = time.Now() // not counted as saturated: it is held only to end
	}
	if !in.hold(*a, msg, policy.Decision{}, 0, expiry) {
		return false
	}
	in.held.wake()
	return true
}

package simulate

import "github.com/mlsched/mlsched/dispatcher/internal/fairorder"

// shedFirst is the dispatcher's shedding order (dispatcher/internal/admission/shedorder.go):
// a non-sheddable task of typ is about to end for want of capacity
// (expired, or saturated), so the sheddable tasks of its type held are
// shed first (they come after it in the hold's order): those of the
// running pass not yet decided (marked gone, the pass skips them), those
// held between passes and those held during this pass. One still held
// after that is a shedding inversion, counted (FlowSummary.ShedInversions,
// which must stay 0).
func (s *sim) shedFirst(typ string) {
	f := s.fc
	key := fairorder.Key(typ, nil)
	if !f.order.HeldBelow(key, 0) {
		return
	}
	sheddable := func(t *task) bool { return !t.gone && t.typ == typ && t.priority < 0 }
	var drop []*task
	for _, t := range f.passQ { // the pass's tasks: the decided ones left already
		if sheddable(t) && t.counted {
			t.gone = true
			drop = append(drop, t)
		}
	}
	f.q = dropShed(f.q, sheddable, &drop)
	f.pending = dropShed(f.pending, sheddable, &drop)
	for _, t := range drop {
		f.leave(t)
		s.endFlow(t, endShed)
	}
	if f.order.HeldBelow(key, 0) {
		f.shedInversions++
	}
}

// dropShed moves the tasks of q that match to drop, keeping the order of
// the rest.
func dropShed(q []*task, match func(*task) bool, drop *[]*task) []*task {
	n := 0
	for _, t := range q {
		if match(t) {
			*drop = append(*drop, t)
			continue
		}
		q[n] = t
		n++
	}
	clear(q[n:])
	return q[:n]
}

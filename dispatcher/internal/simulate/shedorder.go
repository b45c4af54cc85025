package simulate

import "github.com/mlsched/mlsched/shared/protocol"

// shedFirst is the dispatcher's shedding order (dispatcher/shedorder.go):
// a non-sheddable task of typ is about to end for want of capacity
// (expired, or saturated), so the sheddable tasks of its type held are
// shed first (they come after it in the hold's order); one still held
// after that is a shedding inversion, counted (FlowSummary.ShedInversions,
// which must stay 0).
func (s *sim) shedFirst(typ string) {
	f := s.fc
	if !f.sheddableHeld(typ) {
		return
	}
	var drop []*task
	for p := protocol.MinPriority; p < 0; p++ {
		b := &f.bands[p-protocol.MinPriority]
		for _, tq := range b.tenants {
			n := 0
			for _, t := range tq.q {
				if t.typ == typ {
					drop = append(drop, t)
					b.n--
					f.n--
					continue
				}
				tq.q[n] = t
				n++
			}
			clear(tq.q[n:])
			tq.q = tq.q[:n]
		}
	}
	n := 0
	for _, t := range f.pending { // held during this pass
		if t.typ == typ && t.priority < 0 {
			drop = append(drop, t)
			continue
		}
		f.pending[n] = t
		n++
	}
	clear(f.pending[n:])
	f.pending = f.pending[:n]
	for _, t := range drop {
		f.leave(t)
		s.endFlow(t, endShed)
	}
	if f.sheddableHeld(typ) {
		f.shedInversions++
	}
}

// sheddableHeld: a sheddable task of the type is held.
func (f *flowControl) sheddableHeld(typ string) bool {
	c := f.counts[typ]
	if c == nil {
		return false
	}
	for _, n := range c[:-protocol.MinPriority] {
		if n > 0 {
			return true
		}
	}
	return false
}

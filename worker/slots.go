package worker

import "sync"

// slots hands the node's task slots to the dispatches waiting for one, in
// the order the dispatcher's flow control serves tasks: the highest priority
// first; within a priority, tenants in turn; within a tenant, oldest first.
//
// Why at the node: the dispatcher sends a node up to its queue target of
// work (MLSCHED_QUEUE_TARGET), and the node used to start it in arrival
// order. An urgent task, or a quiet tenant's, then waited behind the queue
// that the dispatcher had already sent: the last wait the dispatcher's own
// order could not shorten (docs/policies.md, "Flow control"). The node
// pulls up to Prefetch dispatches beyond its slots, so that the queue it
// orders is the queue it was sent.
//
// Tenants take turns by start-time fair queuing with equal weights and a
// burst credit: a waiter's tag is one more than the later of its tenant's
// last tag and the tag last granted less the node's slot count, and the
// lowest tag of the highest priority is granted next. A tenant that sent a
// hundred dispatches gets tags far ahead; a tenant that sends a few, well
// under its share, is tagged just behind what is being granted now, so a
// burst of up to as many dispatches as the node has slots starts before
// the flooding tenant's next. Without the credit a quiet tenant's burst of
// three took turns with the flood's backlog, and its last dispatch waited
// two turns of every other tenant (issue 20's noisy tenant: a p50 of 18 ms
// for a slot, 9.5 ms with it). The credit is bounded: a tenant that sends more than its
// share runs its tags ahead and gets none, so the shares of saturating
// tenants do not move. It is work-conserving: a slot never waits while a
// dispatch does.
type slots struct {
	mu      sync.Mutex
	free    int
	waiting []*slotWaiter
	// Tags are per priority, so that an urgent dispatch does not move a
	// band's clock. vtime is each priority's tag last granted; last is each
	// tenant's last tag in a priority (only those ahead of their priority's
	// vtime matter: the others are forgotten when the map grows).
	vtime map[int]uint64
	last  map[slotFlow]uint64
	seq   uint64
	// burst is the credit of a tenant under its share: the node's slots.
	burst uint64
}

// slotFlow is one tenant's dispatches of one priority.
type slotFlow struct {
	priority int
	tenant   string
}

type slotWaiter struct {
	slotTicket
	ready chan struct{}
}

// slotTenantsKept bounds the tenants remembered before the idle ones are
// forgotten (a forgotten tenant's next tag is the floor's anyway).
const slotTenantsKept = 1024

func newSlots(n int) *slots {
	return &slots{free: n, vtime: map[int]uint64{}, last: map[slotFlow]uint64{}, burst: uint64(max(n, 0))}
}

// floor is the lowest last tag a tenant of the priority can have: the tag
// last granted less the burst credit.
func (s *slots) floor(priority int) uint64 {
	return s.vtime[priority] - min(s.vtime[priority], s.burst)
}

// slotTicket is a dispatch's place in the node's order: its priority, its
// tenant's tag, and its arrival.
type slotTicket struct {
	priority int
	tag, seq uint64
}

// ticket gives a dispatch its place in the order, when it arrives.
// onMessage takes it on the consumer's goroutine, in delivery order; the
// dispatch's own goroutine, which the scheduler may run after a later
// one's, then waits with it. Tagged there instead, a tenant's dispatches
// could start out of the order they came in.
func (s *slots) ticket(priority int, tenant string) slotTicket {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := slotFlow{priority, tenant}
	tag := max(s.floor(priority), s.last[f]) + 1
	s.last[f] = tag
	if len(s.last) > slotTenantsKept {
		for f, l := range s.last {
			if l <= s.floor(f.priority) {
				delete(s.last, f)
			}
		}
	}
	s.seq++
	return slotTicket{priority: priority, tag: tag, seq: s.seq}
}

// wait blocks until the ticket's holder may take a slot. A slot that is
// free while nobody waits is taken at once.
func (s *slots) wait(t slotTicket) {
	s.mu.Lock()
	if s.free > 0 && len(s.waiting) == 0 {
		s.free--
		s.vtime[t.priority] = max(s.vtime[t.priority], t.tag)
		s.mu.Unlock()
		return
	}
	w := &slotWaiter{slotTicket: t, ready: make(chan struct{})}
	s.waiting = append(s.waiting, w)
	s.grantLocked()
	s.mu.Unlock()
	<-w.ready
}

// acquire takes a ticket and waits with it.
func (s *slots) acquire(priority int, tenant string) { s.wait(s.ticket(priority, tenant)) }

// release frees a slot: the best waiter, if any, takes it.
func (s *slots) release() {
	s.mu.Lock()
	s.free++
	s.grantLocked()
	s.mu.Unlock()
}

// grantLocked gives free slots to the best waiters. The waiters are few
// (at most the prefetch), so a scan is cheaper than keeping a heap.
func (s *slots) grantLocked() {
	for s.free > 0 && len(s.waiting) > 0 {
		best := 0
		for i, w := range s.waiting[1:] {
			if w.before(s.waiting[best]) {
				best = i + 1
			}
		}
		w := s.waiting[best]
		s.waiting = append(s.waiting[:best], s.waiting[best+1:]...)
		s.free--
		s.vtime[w.priority] = max(s.vtime[w.priority], w.tag)
		close(w.ready)
	}
}

// before orders waiters: higher priority, then lower tag, then arrival.
func (w *slotWaiter) before(o *slotWaiter) bool {
	if w.priority != o.priority {
		return w.priority > o.priority
	}
	if w.tag != o.tag {
		return w.tag < o.tag
	}
	return w.seq < o.seq
}

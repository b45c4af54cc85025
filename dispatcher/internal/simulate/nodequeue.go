package simulate

import (
	"slices"
	"time"

	"github.com/mlsched/mlsched/shared/protocol"
)

// A simulated node starts the work sent to it in the worker's order
// (worker/slots.go): the highest priority first; within a priority,
// tenants in turn by start-time fair queuing with equal weights and a
// burst credit of the node's capacity; within a tenant, oldest first.
//
// Why: the dispatcher's flow control orders what it sends, but a node is
// sent up to its queue target of work, and if it started that in arrival
// order an urgent task, or a quiet tenant's, would wait behind it: the
// last wait the dispatcher's order cannot shorten. So a worker takes up to
// MLSCHED_PREFETCH (the scenario's prefetch) dispatches beyond its running
// tasks and orders those; the rest wait in its stream in arrival order and
// are taken as room frees. With one priority and one tenant the order is
// arrival order, so such runs are what they were with a FIFO queue.
type node struct {
	spec      *Node
	alive     bool
	crashedAt time.Duration
	startedAt time.Duration
	running   int
	// waiting are the dispatches the node has taken (running plus waiting
	// is at most capacity plus prefetch), in arrival order; stream is the
	// rest, which it takes in order as room frees.
	waiting, stream []*attempt
	// The fair order's clocks, as slots.go's, per priority (index
	// priority-MinPriority) so that an urgent task does not move a band's:
	// the tag last granted, and each tenant's last tag.
	vtime [priorityLevels]uint64
	last  map[nodeFlow]uint64
	// meanRun is each hosted model's moving mean of successful runs here
	// (weight 1/8, 0 until the first), as the worker's (worker.go
	// observeRun): a dispatch whose deadline leaves less is not started.
	meanRun map[string]time.Duration
}

// observeRun folds a successful run's duration into its model's mean, in
// the worker's integer steps.
func (n *node) observeRun(model string, d time.Duration) {
	if old := n.meanRun[model]; old > 0 {
		d = old + (d-old)/8
	}
	n.meanRun[model] = d
}

// nodeFlow is one tenant's work of one priority on a node.
type nodeFlow struct {
	priority int
	tenant   string
}

// queued is the work sent to the node and not started (its heartbeat's
// Queued).
func (n *node) queued() int { return len(n.waiting) + len(n.stream) }

func (n *node) load() int { return n.running + n.queued() }

// take receives the next dispatch of the node's stream and tags it: one
// more than the later of its tenant's last tag and the tag last granted in
// its priority less the node's capacity (the burst credit of a tenant under
// its share). A tenant that sent many is tagged far ahead; one that sends a
// few is tagged just behind what starts now.
func (n *node) take() {
	a := n.stream[0]
	n.stream[0] = nil
	n.stream = n.stream[1:]
	f := nodeFlow{a.t.priority, a.t.tenant}
	v := n.vtime[f.priority-protocol.MinPriority]
	a.tag = max(v-min(v, uint64(max(n.spec.Capacity, 0))), n.last[f]) + 1
	n.last[f] = a.tag
	n.waiting = append(n.waiting, a)
}

// startQueued gives the node's free slots to its best waiting dispatches
// (higher priority, then lower tag, then older), then takes the next from
// its stream while there is room, one at a time as the worker receives
// them: a freed slot is granted before the room its task leaves is taken
// (the worker acks a task after its outcome). It returns the dispatches
// found past their deadline when their turn came, or with less of it left
// than their model's mean successful run on the node, which the worker
// reports expired without running them (worker/task.go): started, the
// latter would more likely be cut at the deadline than finish, a timeout
// charged to the model for time spent queued (the last of a band, which
// the node's order starts late), in a slot that work able to finish could
// use.
func (s *sim) startQueued(n *node) (expired []*attempt) {
	room := n.spec.Capacity + max(s.sc.Prefetch, 0)
	for {
		for n.running < n.spec.Capacity && len(n.waiting) > 0 {
			best := 0
			for i, a := range n.waiting {
				if a.t.priority > n.waiting[best].t.priority ||
					a.t.priority == n.waiting[best].t.priority && a.tag < n.waiting[best].tag {
					best = i
				}
			}
			a := n.waiting[best]
			n.waiting = slices.Delete(n.waiting, best, best+1)
			v := &n.vtime[a.t.priority-protocol.MinPriority]
			*v = max(*v, a.tag)
			if s.now > a.deadline || a.deadline-s.now < n.meanRun[a.model] {
				expired = append(expired, a)
				continue
			}
			if b := s.models[a.model].Batch; b != nil && b.MaxSize > 1 {
				expired = append(expired, s.startBatch(n, a, b)...)
				continue
			}
			s.start(a)
		}
		if len(n.stream) == 0 || n.running+len(n.waiting) >= room {
			return expired
		}
		n.take()
	}
}

// toNode delivers a dispatch to its node: lost on a dead node, else into
// its stream. Only the dispatch itself may expire here (while a slot is
// free nothing else waits): one sent with less of its task's deadline left
// than its model's mean run on the node. The worker reports it at once,
// after the dispatch that sent it: an event, not a call inside it.
func (s *sim) toNode(a *attempt) {
	n := a.node
	if !n.alive {
		s.lose(a)
		return
	}
	n.stream = append(n.stream, a)
	for _, x := range s.startQueued(n) {
		s.push(s.now, evExpired, s.eventA(x))
	}
}

// crashQueue empties a crashed node's queue, in arrival order, and resets
// its order and run means: a restarted worker starts with fresh clocks and
// none.
func (n *node) crashQueue() []*attempt {
	lost := append(n.waiting, n.stream...)
	n.waiting, n.stream = nil, nil
	n.vtime = [priorityLevels]uint64{}
	clear(n.last)
	clear(n.meanRun)
	return lost
}

// startBatch starts a batching model's call on one slot: a and up to
// MaxSize-1 more of the model's waiting attempts, best first, skipping
// (and returning as expired) those too late to start. The call's latency
// is a's drawn latency plus PerItem per attempt; each attempt keeps its
// own failure and its own deadline.
func (s *sim) startBatch(n *node, a *attempt, b *ModelBatch) (expired []*attempt) {
	call := []*attempt{a}
	for len(call) < b.MaxSize {
		best := -1
		for i, w := range n.waiting {
			if w.model != a.model {
				continue
			}
			if best < 0 || w.t.priority > n.waiting[best].t.priority ||
				w.t.priority == n.waiting[best].t.priority && w.tag < n.waiting[best].tag {
				best = i
			}
		}
		if best < 0 {
			break
		}
		w := n.waiting[best]
		n.waiting = slices.Delete(n.waiting, best, best+1)
		v := &n.vtime[w.t.priority-protocol.MinPriority]
		*v = max(*v, w.tag)
		if s.now > w.deadline || w.deadline-s.now < n.meanRun[w.model] {
			expired = append(expired, w)
			continue
		}
		call = append(call, w)
	}
	c := &simCall{left: len(call)}
	lat := time.Duration(0)
	for i, w := range call {
		w.call = c
		drawn := s.prepare(w) // each draws its own failure
		if i == 0 {
			lat = drawn + time.Duration(len(call))*b.PerItem.D() // the call's fixed cost, once
		} else {
			n.running-- // the call's one slot is a's
		}
		w.timeout, w.missed, w.latency = false, false, lat
		s.limit(w)
		s.push(s.now+w.latency, evDone, s.eventA(w))
	}
	return expired
}

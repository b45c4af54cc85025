package worker

import (
	"sync"
	"sync/atomic"
	"time"
)

// Dispatches delivered again. JetStream delivers a dispatch again when its
// ack wait passes without an ack or a progress signal from the node. In a
// cluster fault an ack or a signal can be lost: the server it was sent to
// dies, or a consumer leader just elected, behind on its stream, drops acks
// above its delivery pointer; the dispatcher's ack of a direct report can
// be lost the same way. The dispatch is then delivered again at every ack
// wait until the sweeper deletes it after its deadline, and each delivery
// used to run the task again: make chaos-cluster counted plain tasks run 4
// times with max_attempts 3, one attempt run up to four times an ack wait
// apart (issue 45). A delivery is not an attempt; only the dispatcher
// makes attempts.
//
// So the node remembers the dispatches it has, by their outcome's message
// id (one per attempt), with the stream sequence and store time of the
// dispatch message (a redelivery is the same message; after the attempt
// streams were lost a new dispatch of the same attempt is another one),
// until the dispatch's deadline, after which no delivery of it runs
// (notStarted). A delivery of one it has:
//
//   - still running, waiting for a slot or for its outcome to be stored:
//     left alone. The first delivery's progress signals and ack name the
//     same stream sequence, which is what the server keeps and acks;
//   - whose outcome is settled (stored, or the dispatcher's direct report
//     answer said so): acked, not run, nothing reported again.
//
// An outcome that could not be stored is forgotten here, so that the
// dispatch's redelivery reports the kept outcome again (unreported.go). A
// node that restarts remembers nothing: what it ran and could not ack runs
// again, the one way left for a task to run more often than its attempts
// (at-least-once execution, docs/protocol.md).

// deliveredMax bounds the dispatches remembered; beyond it the oldest are
// forgotten first (they lose only this protection).
const deliveredMax = 1 << 17

// deliveryState is where a remembered dispatch is.
type deliveryState uint8

const (
	deliveryRunning deliveryState = iota // delivered, its outcome not settled yet
	deliverySettled                      // its outcome is stored or settled by a dispatcher
)

// deliveryKey is one dispatch message: its stream sequence and store time.
type deliveryKey struct {
	seq    uint64
	stored int64 // Unix ns
}

type delivery struct {
	key   deliveryKey
	until int64 // Unix ns: the dispatch's deadline
	state deliveryState
}

// deliveries is the node's dispatches, by outcome message id.
type deliveries struct {
	mu    sync.Mutex
	byID  map[string]delivery
	order []string // insertion order, for the deadline and the bound
	head  int
	now   func() time.Time

	// running counts the deliveries left to the one running; acked those
	// acked without a run.
	running, acked atomic.Int64
}

func newDeliveries() *deliveries {
	return &deliveries{byID: map[string]delivery{}, now: time.Now}
}

// deliveryVerdict is what to do with a delivery.
type deliveryVerdict uint8

const (
	deliveryNew       deliveryVerdict = iota // run it
	deliveryDuplicate                        // the node has it running: leave it
	deliveryDone                             // its outcome is settled: ack it, do not run it
)

// begin is a delivery of the dispatch of outcome msgID, message key, whose
// deadline is until: a new one (remembered as running from now on), or
// one the node has.
func (ds *deliveries) begin(msgID string, key deliveryKey, until time.Time) deliveryVerdict {
	if msgID == "" {
		return deliveryNew
	}
	ds.mu.Lock()
	defer ds.mu.Unlock()
	now := ds.now().UnixNano()
	ds.pruneLocked(now)
	if d, ok := ds.byID[msgID]; ok && d.key == key && now < d.until {
		if d.state == deliverySettled {
			ds.acked.Add(1)
			return deliveryDone
		}
		ds.running.Add(1)
		return deliveryDuplicate
	}
	if _, ok := ds.byID[msgID]; !ok {
		ds.order = append(ds.order, msgID)
	}
	ds.byID[msgID] = delivery{key: key, state: deliveryRunning, until: until.UnixNano()}
	return deliveryNew
}

// settled: the outcome of msgID is stored, or settled by a dispatcher.
func (ds *deliveries) settled(msgID string) {
	ds.mu.Lock()
	if d, ok := ds.byID[msgID]; ok {
		d.state = deliverySettled
		ds.byID[msgID] = d
	}
	ds.mu.Unlock()
}

// forget: the dispatch of msgID goes back to the server unsettled (nak'ed:
// its outcome not stored, or the node stopping), to be handled afresh.
func (ds *deliveries) forget(msgID string) {
	ds.mu.Lock()
	delete(ds.byID, msgID)
	ds.mu.Unlock()
}

// pruneLocked forgets, from the oldest, the dispatches past their deadline
// and those beyond the bound. Called with mu held.
func (ds *deliveries) pruneLocked(now int64) {
	for ds.head < len(ds.order) {
		id := ds.order[ds.head]
		d, ok := ds.byID[id]
		if ok && now < d.until && len(ds.byID) < deliveredMax {
			break
		}
		if ok {
			delete(ds.byID, id)
		}
		ds.order[ds.head] = ""
		ds.head++
	}
	if ds.head > 1024 && ds.head > len(ds.order)/2 {
		ds.order = append(ds.order[:0], ds.order[ds.head:]...)
		ds.head = 0
	}
}

// size is how many dispatches are remembered (for tests).
func (ds *deliveries) size() int {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	return len(ds.byID)
}

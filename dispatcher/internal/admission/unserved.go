package admission

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/mlsched/mlsched/shared/jsplumb"
	"github.com/mlsched/mlsched/shared/lifecycle"
	"github.com/mlsched/mlsched/shared/protocol"
)

// Tasks no node serves. A task whose type (or allow-list) no live node
// announces waits up to MLSCHED_NO_NODE_WAIT for one, since nodes may be
// starting or restarting. While it waits its message stays unacknowledged
// and takes one of the consumer's MaxAckPending slots, which every type
// shares: left unbounded, a flood of tasks of a type nobody serves (junk,
// or a type whose nodes are all gone) would fill them and stall every other
// type until the wait ran out. So a replica keeps at most
// MLSCHED_UNSERVED_MAX such tasks at once, here, kept alive with
// InProgress and decided again every unservedRetry. When the room is full,
// the type keeping the most tasks gives way: its newest waiting task, or
// else the task just arrived, is rejected at once with code no_model and a
// message saying why, so no type can keep another from waiting its turn.
// Nothing is dropped: every task gets its result. On shutdown the tasks are
// nak'ed for another replica.
//
// The bound is there so that one type cannot stall the others, and while no
// node at all is live there is nothing to stall: that is an outage (every
// heartbeat missed at once: a partition, a paused or restarted NATS, a
// registry watch being re-created), not a type nobody serves. So while the
// registry is empty the room takes every such task, bounded only by the
// consumer's MaxAckPending, and valid tasks wait out the outage instead of
// being rejected as no_model. The same holds for twice the node TTL after
// this replica's NATS connection comes back: while it was down no
// heartbeat could arrive and nodes expired for it; a registry watch that
// died with the server is re-read after a node TTL of silence, and every
// node announces itself within another (the chaos failure of seed
// 29198843: after a nats-server kill some types' nodes were back and
// others not yet, and valid tasks of the latter were rejected at once).
// The same holds for one type whose every node went within the no-node
// wait plus the node TTL (typeOutage): some nodes of the cluster may be
// live while that type's have all gone at once, or the registry, blind,
// is about to forget every node together (registry.Silent). Such tasks
// wait without the bound, and no other type's task evicts them.
// Once nodes have been live again for the node TTL (time for every node to
// announce itself), or twice that after a reconnection, a room still over
// its bound is cut back to it by the same rule: the type keeping the most
// gives way.

// unservedRetry is how often waiting tasks are decided again.
const unservedRetry = 250 * time.Millisecond

type unservedTask struct {
	a        Attempt
	msg      jsplumb.Msg
	err      error     // why no node serves it, as last decided
	progress time.Time // last InProgress
}

// unservedRoom is the replica's list of tasks waiting for a node, oldest
// first.
type unservedRoom struct {
	mu      sync.Mutex
	q       []*unservedTask
	inPass  int // tasks taken out of q by retryUnserved, still counted
	stopped bool
	// outage is the last time a task found no live node at all;
	// reconnected the last time the NATS connection was found to have come
	// back (reconnects: its count then).
	outage, reconnected time.Time
	reconnects          uint64
}

// outageLocked reports whether no node at all is live, and notes when an
// outage was last seen: now, if none is live, and when the connection has
// come back since the last look.
func (r *unservedRoom) outageLocked(in *Stage, now time.Time) bool {
	none := len(in.Reg.Live()) == 0
	if in.Reconnects != nil {
		if n := in.Reconnects(); n != r.reconnects {
			r.reconnects, r.reconnected = n, now
		}
	}
	if none {
		r.outage = now
	}
	return none
}

// typeOutage reports whether a live node served typ a short while ago (the
// no-node wait plus the node TTL): every node of the type gone at once, or
// the registry unable to tell (registry.Silent), is an outage of what this
// replica can see, not a type nobody serves. Its tasks wait without the
// room's bound (the band consumer's MaxAckPending bounds them), and no
// other type's task takes their place; a type not served for longer is
// bounded as before.
func (in *Stage) typeOutage(typ string, now time.Time) bool {
	served := in.Reg.Served(typ)
	return !served.IsZero() && now.Sub(served) < in.Config.NoNodeWait+in.Config.NodeTTL
}

// Outage says what outage of the nodes this replica sees, "" when none:
// the registry silent, or types whose every node went within the no-node
// wait plus the node TTL (their tasks wait without the room's bound).
func (in *Stage) Outage(now time.Time) (why string, types int) {
	live := map[string]bool{}
	for _, hb := range in.Reg.Live() {
		for _, m := range hb.Models {
			for _, t := range m.Types {
				live[t] = true
			}
		}
	}
	var gone []string
	for t := range in.Reg.ServedTypes() {
		if !live[t] && in.typeOutage(t, now) {
			gone = append(gone, t)
		}
	}
	sort.Strings(gone)
	switch {
	case in.Reg.Silent():
		why = "the node registry is silent (no node heard from for half the node TTL): nodes are kept, tasks that find none wait"
	case len(gone) > 0:
		why = fmt.Sprintf("no live node serves %d type(s) served within the no-node wait (%s): their tasks wait for nodes", len(gone), strings.Join(firstN(gone, 5), ", "))
	}
	return why, len(gone)
}

func firstN(s []string, n int) []string {
	if len(s) > n {
		return append(s[:n:n], "…")
	}
	return s
}

// recoveringLocked: an outage was seen within the node TTL, or a
// reconnection within twice that; nodes may still be announcing
// themselves.
func (r *unservedRoom) recoveringLocked(in *Stage, now time.Time) bool {
	return !r.outage.IsZero() && now.Sub(r.outage) < in.Config.NodeTTL ||
		!r.reconnected.IsZero() && now.Sub(r.reconnected) < 2*in.Config.NodeTTL
}

func (r *unservedRoom) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.q) + r.inPass
}

// leave uncounts a task of the pass that leaves the room.
func (r *unservedRoom) leave() {
	r.mu.Lock()
	r.inPass--
	r.mu.Unlock()
}

// waitForNode keeps a task that no live node serves (err has code
// no_model or unknown_model) until one does or MLSCHED_NO_NODE_WAIT has
// passed since this attempt first found no node (a.noNodeSince). It
// returns nil when the task waits (or was given back to the stream), or the
// error to reject it with now.
func (in *Stage) waitForNode(a Attempt, msg jsplumb.Msg, err error) error {
	now := time.Now()
	if a.noNodeSince.IsZero() {
		a.noNodeSince = now
	}
	p := in.unserved.place(in, &unservedTask{a: a, msg: msg, err: err, progress: now}, now)
	switch {
	case p.closed: // shutting down: another replica decides
		in.Complete.Retry(msg, time.Second)
		return nil
	case !p.placed:
		in.Counters.UnservedRefused.Add(1)
		return in.unservedFull(err, a.Task.Type, p.counts[a.Task.Type])
	}
	// A retry's task stays in progress while it waits (the Keeper).
	in.Keeper.Keep(msg, a.TaskAck, a.noNodeSince.Add(in.Config.NoNodeWait+unservedRetry))
	if p.evicted != nil {
		in.Counters.UnservedRefused.Add(1)
		in.rejectUnserved(p.evicted, in.unservedFull(p.evicted.err, p.top, p.counts[p.top]))
	}
	return nil
}

// placement is where the waiting room put a task (place).
type placement struct {
	closed, placed bool
	// evicted is the task that gave w its place (nil: none), of type top;
	// counts are the bounded tasks per type the room judged by.
	evicted *unservedTask
	top     string
	counts  map[string]int
}

// place gives a waiting task a place: at once while the room has one, or
// an outage lets it grow (the band consumer's MaxAckPending bounds it
// then); when full, in place of the newest task of the type keeping the
// most, if that type keeps more than this task's would after taking a
// place.
func (r *unservedRoom) place(in *Stage, w *unservedTask, now time.Time) (p placement) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		return placement{closed: true}
	}
	typ := w.a.Task.Type
	if r.outageLocked(in, now) || r.recoveringLocked(in, now) || in.typeOutage(typ, now) ||
		r.boundedLocked(in, now) < in.Config.UnservedMax {
		r.q = append(r.q, w)
		return placement{placed: true}
	}
	p.counts = in.boundedByType(r.q, now)
	p.top = keptMost(p.counts)
	if p.top == "" || p.counts[p.top] <= p.counts[typ]+1 {
		return p
	}
	for i := len(r.q) - 1; i >= 0; i-- {
		if r.q[i].a.Task.Type == p.top {
			p.evicted = r.q[i]
			r.q = append(r.q[:i], r.q[i+1:]...)
			break
		}
	}
	r.q = append(r.q, w)
	p.placed = true
	return p
}

// takePass takes the waiting tasks out for a pass; they still count as
// waiting (len) until each leaves or the pass puts it back.
func (r *unservedRoom) takePass() []*unservedTask {
	r.mu.Lock()
	defer r.mu.Unlock()
	q := r.q
	r.q, r.inPass = nil, len(q)
	return q
}

// open opens the room; close closes it (place refuses from then on) and
// returns what it held.
func (r *unservedRoom) open() {
	r.mu.Lock()
	r.stopped = false
	r.mu.Unlock()
}

func (r *unservedRoom) close() []*unservedTask {
	r.mu.Lock()
	defer r.mu.Unlock()
	q := r.q
	r.q, r.stopped = nil, true
	return q
}

// unservedFull is the error of a task refused a place in the full room.
func (in *Stage) unservedFull(err error, typ string, ofType int) error {
	return protocol.Errorf(protocol.CodeOf(err), "%s; rejected at once: this dispatcher already keeps %d tasks waiting for a node (MLSCHED_UNSERVED_MAX), %d of them of type %q",
		msgOf(err), in.Config.UnservedMax, ofType, typ)
}

func msgOf(err error) string {
	if pe, ok := err.(*protocol.Error); ok {
		return pe.Msg
	}
	return err.Error()
}

// rejectUnserved ends a waiting task with err.
func (in *Stage) rejectUnserved(w *unservedTask, err error) {
	a := &w.a
	status := protocol.StatusRejected
	if a.Attempt > 1 {
		status = protocol.StatusFailed
	}
	in.Log.Warn().Err(err).Str("task_id", a.Task.ID).Int("attempt", a.Attempt).Msg("no model for task")
	in.Fin.End(a.Ends(w.msg, err, status))
}

// UnservedService runs the waiting room as a component.
func (in *Stage) UnservedService() lifecycle.Service {
	return lifecycle.Run(func(ctx context.Context, ready func()) error {
		in.unserved.open()
		ready()
		t := time.NewTicker(unservedRetry)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				for _, w := range in.unserved.close() {
					in.Complete.Retry(w.msg, 0)
				}
				return nil
			case <-t.C:
			}
			in.retryUnserved()
		}
	})
}

// retryUnserved decides again for the waiting tasks, oldest first: those
// now served are dispatched, those past MLSCHED_NO_NODE_WAIT rejected,
// those cancelled meanwhile dropped.
func (in *Stage) retryUnserved() {
	r := in.unserved
	q := r.takePass()
	if len(q) == 0 {
		return
	}
	now := time.Now()
	table := in.Tables.Table()
	var unserved []string // types no node serves at all, in this pass
	var keep []*unservedTask
	for _, w := range q {
		a := &w.a
		if in.Superseded.Cancelled(a.Task.ID, a.Submission) { // it has its result
			r.leave()
			in.Fin.End(a.EndsStored(w.msg))
			continue
		}
		if expiry := in.Rules.Expiry(&a.Task, a.Submitted); !expiry.IsZero() && !now.Before(expiry) {
			// Its own deadline_ms came first: it ends expired, as in the
			// hold, not after the whole no-node wait.
			r.leave()
			in.expire(a, w.msg, expiry, "while it waited for a node that serves its type")
			continue
		}
		if now.Sub(a.noNodeSince) >= in.Config.NoNodeWait {
			r.leave()
			in.rejectUnserved(w, protocol.Errorf(protocol.CodeOf(w.err), "%s (waited %s for a node)", msgOf(w.err), in.Config.NoNodeWait))
			continue
		}
		if !containsStr(unserved, a.Task.Type) {
			req := in.request(a)
			dec, err := in.Engine.Decide(table, &req)
			switch code := protocol.CodeOf(err); {
			case code == protocol.CodeNoModel:
				unserved = append(unserved, a.Task.Type)
				w.err = err
			case code == protocol.CodeUnknownModel:
				w.err = err
			default: // served now: admission goes on from the hold step with this decision (and handles an error)
				r.leave()
				in.resume(*a, w.msg, table, &req, dec, err)
				continue
			}
		}
		if now.Sub(w.progress) >= in.Config.AckWait/3 {
			in.Complete.Progress(w.msg)
			w.progress = now
		}
		keep = append(keep, w)
	}
	over, why := r.endPass(in, keep, now)
	for i, w := range over {
		in.Counters.UnservedRefused.Add(1)
		in.rejectUnserved(w, why[i])
	}
}

// endPass returns the tasks a pass kept to the room, before those that
// came meanwhile (newer), and cuts the room back to MLSCHED_UNSERVED_MAX
// once no outage lets it grow (trimLocked): it returns the tasks cut, and
// the error each is rejected with.
func (r *unservedRoom) endPass(in *Stage, keep []*unservedTask, now time.Time) (over []*unservedTask, why []error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.q, r.inPass = append(keep, r.q...), 0
	if len(r.q) > in.Config.UnservedMax && !r.outageLocked(in, now) && !r.recoveringLocked(in, now) {
		over, why = r.trimLocked(in.Config.UnservedMax, in, now)
	}
	return over, why
}

// trimLocked cuts the room back to max after an outage let it grow: the
// type keeping the most gives way, newest first. It returns the tasks cut
// and the error each is rejected with.
func (r *unservedRoom) trimLocked(max int, in *Stage, now time.Time) (cut []*unservedTask, errs []error) {
	counts := in.boundedByType(r.q, now)
	for total := sum(counts); total > max; total-- {
		top := keptMost(counts)
		for i := len(r.q) - 1; i >= 0; i-- {
			if w := r.q[i]; w.a.Task.Type == top {
				errs = append(errs, in.unservedFull(w.err, top, counts[top]))
				cut = append(cut, w)
				r.q = append(r.q[:i], r.q[i+1:]...)
				counts[top]--
				break
			}
		}
	}
	return cut, errs
}

// boundedByType counts the waiting tasks the room's bound applies to by
// type: those of types not in an outage (typeOutage).
func (in *Stage) boundedByType(q []*unservedTask, now time.Time) map[string]int {
	counts := map[string]int{}
	outage := map[string]bool{}
	for _, w := range q {
		t := w.a.Task.Type
		o, ok := outage[t]
		if !ok {
			o = in.typeOutage(t, now)
			outage[t] = o
		}
		if !o {
			counts[t]++
		}
	}
	return counts
}

// boundedLocked is how many waiting tasks count against the room's bound:
// those of types not in an outage, and the tasks of the pass under way.
func (r *unservedRoom) boundedLocked(in *Stage, now time.Time) int {
	return sum(in.boundedByType(r.q, now)) + r.inPass
}

func sum(counts map[string]int) int {
	n := 0
	for _, c := range counts {
		n += c
	}
	return n
}

// keptMost is the type keeping the most waiting tasks ("" for none); of
// types keeping as many, the first by name, so that the choice is stable.
func keptMost(counts map[string]int) string {
	top := ""
	for t, n := range counts {
		if n > 0 && (top == "" || n > counts[top] || n == counts[top] && t < top) {
			top = t
		}
	}
	return top
}

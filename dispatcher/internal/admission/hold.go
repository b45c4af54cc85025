package admission

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mlsched/mlsched/dispatcher/internal/fairorder"
	"github.com/mlsched/mlsched/dispatcher/internal/policy"
	"github.com/mlsched/mlsched/shared/jsplumb"
	"github.com/mlsched/mlsched/shared/lifecycle"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// Backpressure. When every candidate of a task is saturated (its nodes hold
// more work than they can start before the dispatch's deadline), sending it
// would only bury a node: the attempt would expire in the queue or be cut
// by its deadline, and count against a model that did nothing wrong. So the
// dispatcher keeps the task instead: the message stays unacknowledged in
// MLSCHED_TASKS (or MLSCHED_OUTCOMES for a retry), kept alive with
// InProgress, and is decided again, oldest first, whenever an outcome frees
// a slot or the table is refreshed. Held messages count against the
// consumer's MaxAckPending, so a saturated replica pulls less. A task waits
// at most its own deadline (timeout plus slack), then fails with
// CodeSaturated. On shutdown held messages are nak'ed for another replica.
//
// Flow control (docs/policies.md, "Flow control"): held tasks are decided
// again in the fair order of package fairorder, which the simulator uses
// too: highest priority first and, inside one priority, in start-time fair
// order between tenants by weight (MLSCHED_TENANT_WEIGHTS). While a task
// of some priority is held for a candidate set (type and allow-list), a
// new task of that set with no higher priority is held behind it: no
// lower-priority task takes a slot a higher one could use (the inversions
// counter, which must stay 0, counts the dispatches that did). A sheddable
// (negative-priority) task that cannot start before its deadline at the
// measured drain rate is shed at once (code shed), the most-over-share
// tenants' first, so that the replica's slots go to work that can finish.

// holdRetry is how often held tasks are decided again without an outcome
// to prompt it.
const holdRetry = 100 * time.Millisecond

// holdPassGap is the least time from one pass of the hold to the next.
const holdPassGap = 5 * time.Millisecond

// holdLogEvery bounds the rate of the saturation log line.
const holdLogEvery = 5 * time.Second

type heldTask struct {
	a        Attempt
	msg      jsplumb.Msg
	since    time.Time // when it was first held
	until    time.Time // its deadline: fail after
	expiry   time.Time // the task's own deadline (zero: none)
	progress time.Time // last InProgress
	key      string    // its candidate set: type, and allow-list if any
	tenant   string
	// tags are its fair-order start and finish tags in a pass.
	tags fairorder.Tags
	// counted: it is in the room's counts (not while over its quota or
	// cap).
	counted bool
	// inTenant: it is in the room's per band and tenant counts (parking).
	inTenant bool
	// gone: shed in this pass ahead of a non-sheddable task (shedorder.go).
	gone bool
}

// Fair is the held task as the fair order sorts it.
func (ht *heldTask) Fair() (int, string, time.Time, *fairorder.Tags) {
	return ht.a.Task.Priority, ht.tenant, ht.since, &ht.tags
}

// bandTenant keys the held tasks of one tenant in one priority band.
type bandTenant struct {
	band   int
	tenant string
}

// candidateKey names a task's candidate set: tasks of one key compete for
// the same slots.
func candidateKey(t *protocol.Task) string { return fairorder.Key(t.Type, t.Models) }

// holdRoom is the replica's list of held tasks, oldest first.
type holdRoom struct {
	mu      sync.Mutex
	q       []*heldTask
	kick    chan struct{}
	stopped bool
	// n is len(q), readable without mu: wake costs nothing while nothing
	// is held (every outcome calls it); inPass the tasks taken out for a
	// pass of retryHeld.
	n, inPass atomic.Int64

	lastLog  time.Time
	unlogged int64

	// fair is the fair order (package fairorder): its clocks, the held
	// tasks per candidate key and priority (those taken out for a pass
	// included, until each leaves the hold), and per band and tenant (over
	// their quota too: what parking weighs, internal/intake/park.go).
	fair *fairorder.Order
}

func newHoldRoom() *holdRoom {
	return &holdRoom{kick: make(chan struct{}, 1), fair: fairorder.New()}
}

// any reports whether the room holds a task (those a pass has taken out
// included), without its lock.
func (h *holdRoom) any() bool { return h.n.Load() > 0 || h.inPass.Load() > 0 }

// tenantHeld is how many tasks of the tenant's band the room holds.
func (h *holdRoom) tenantHeld(band int, tenant string) int {
	if h.n.Load() == 0 && h.inPass.Load() == 0 {
		return 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.fair.TenantHeld(band, tenant)
}

// countLocked adds d to the held count of the key and priority.
func (h *holdRoom) countLocked(key string, priority, d int) { h.fair.Count(key, priority, d) }

// leave: a held task leaves the hold (dispatched, ended or released).
func (h *holdRoom) leave(ht *heldTask) {
	if !ht.counted && !ht.inTenant {
		return
	}
	h.mu.Lock()
	if ht.counted {
		h.countLocked(ht.key, ht.a.Task.Priority, -1)
		ht.counted = false
	}
	if ht.inTenant {
		h.fair.CountTenant(ht.a.Task.Priority, ht.tenant, -1)
		ht.inTenant = false
	}
	h.mu.Unlock()
}

// heldAtLeast reports whether a task of the key with at least (strict:
// more than) the priority is held (fairorder.Order.HeldAtLeast). Free
// while nothing is held.
func (h *holdRoom) heldAtLeast(key string, priority int, strict bool) bool {
	if h.n.Load() == 0 && h.inPass.Load() == 0 {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.fair.HeldAtLeast(key, priority, strict)
}

// leads reports whether a task of the key, priority and tenant goes first
// at a node that orders its queue (policy.Request.Ahead), so that it need
// not wait in the hold for the queue target (fairorder.Order.Leads). Free
// while nothing is held.
func (h *holdRoom) leads(key string, priority int, tenant string, fromHold bool) bool {
	if h.n.Load() == 0 && h.inPass.Load() == 0 {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.fair.Leads(key, priority, tenant, fromHold)
}

// bandHeld reports whether a task of the key in the priority's band is
// held (fairorder.Order.BandHeld). Free while nothing is held.
func (h *holdRoom) bandHeld(key string, priority int) bool {
	if h.n.Load() == 0 && h.inPass.Load() == 0 {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.fair.BandHeld(key, priority)
}

// sentPlain records the priority of a task of the key sent on without the
// ahead credit, while tasks of the key are held (leads).
func (h *holdRoom) sentPlain(key string, priority int) {
	h.mu.Lock()
	h.fair.SentPlain(key, priority)
	h.mu.Unlock()
}

// wake prompts the hold loop (an outcome freed a slot). While nothing is
// held it does nothing: waking the loop for every outcome cost a goroutine
// switch each. A task held at the same moment is retried within holdRetry.
func (h *holdRoom) wake() {
	if h.n.Load() == 0 {
		return
	}
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

func (h *holdRoom) reopen() {
	h.mu.Lock()
	h.stopped = false
	h.mu.Unlock()
}

// len is how many tasks the room holds, those a pass has taken out
// included: it does not dip while a pass runs.
func (h *holdRoom) len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.fair.Held()
}

// hold keeps a saturated task; it reports false when the room is closed
// (shutting down), and the caller then naks the message.
func (in *Stage) hold(a Attempt, msg jsplumb.Msg, dec policy.Decision, wait time.Duration, expiry time.Time) bool {
	now := time.Now()
	first := a.heldSince.IsZero()
	if first {
		a.heldSince = now
	}
	until := a.heldSince.Add(wait)
	if !expiry.IsZero() && expiry.Before(until) {
		until = expiry
	}
	ht := &heldTask{a: a, msg: msg, since: a.heldSince, until: until, expiry: expiry, progress: now,
		key: candidateKey(&a.Task), tenant: a.Task.TenantName()}
	newly, held, ok := in.held.put(ht, now)
	if !ok {
		return false
	}
	if first && !a.overLimit() {
		in.Counters.Saturated.Add(1)
	}
	in.Keeper.Keep(msg, a.TaskAck, until) // a retry's task stays in progress while it is held (the Keeper)
	if newly > 0 {
		in.Log.Warn().Str("type", a.Task.Type).Str("model", dec.Model).Str("node", dec.Node).Int64("newly_held", newly).Int("held", held).
			Msg("saturated: every candidate's nodes hold more work than they can start before the deadline; keeping tasks in the stream")
	}
	return true
}

// put adds a task to the room, counted for the fair order (a task over its
// tenant's quota or cap holds back no other tenant's, and counts for its
// tenant only); ok is false when the room is closed. When the saturation
// line is due (once per holdLogEvery), newly is how many tasks were held
// since the last one and held how many the room holds; else newly is 0.
func (h *holdRoom) put(ht *heldTask, now time.Time) (newly int64, held int, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopped {
		return 0, 0, false
	}
	h.q = append(h.q, ht)
	h.fair.CountTenant(ht.a.Task.Priority, ht.tenant, 1)
	ht.inTenant = true
	if !ht.a.overLimit() {
		h.countLocked(ht.key, ht.a.Task.Priority, 1)
		ht.counted = true
	}
	h.n.Store(int64(len(h.q)))
	h.unlogged++
	if now.Sub(h.lastLog) < holdLogEvery || ht.a.overLimit() {
		return 0, 0, true
	}
	newly, held = h.unlogged, len(h.q)
	h.lastLog, h.unlogged = now, 0
	return newly, held, true
}

// takePass takes the held tasks out for a pass, in the fair order (order);
// they still count as held (len, and the fair order's counts) until each
// leaves or endPass puts it back.
func (h *holdRoom) takePass(rules Rules) []*heldTask {
	h.mu.Lock()
	defer h.mu.Unlock()
	q := h.q
	h.q = nil
	h.n.Store(0)
	h.inPass.Store(int64(len(q)))
	h.order(q, rules)
	return q
}

// endPass puts back the tasks a pass kept, before those held meanwhile (the
// next pass orders them all).
func (h *holdRoom) endPass(keep []*heldTask) {
	h.mu.Lock()
	h.q = append(keep, h.q...)
	h.n.Store(int64(len(h.q)))
	h.mu.Unlock()
	h.inPass.Store(0)
}

// counted: a task held over its tenant's quota was let in, and now holds
// back its set's lower priorities like any held task.
func (h *holdRoom) count(ht *heldTask) {
	h.mu.Lock()
	h.countLocked(ht.key, ht.a.Task.Priority, 1)
	ht.counted = true
	h.mu.Unlock()
}

// HoldService runs the hold loop as a component.
func (in *Stage) HoldService() lifecycle.Service {
	return lifecycle.Run(func(ctx context.Context, ready func()) error {
		in.held.reopen()
		ready()
		in.holdLoop(ctx)
		return nil
	})
}

// holdLoop decides again for held tasks until ctx is done, then naks
// whatever is still held.
func (in *Stage) holdLoop(ctx context.Context) {
	t := time.NewTicker(holdRetry)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			in.releaseHeld()
			return
		case <-t.C:
		case <-in.held.kick:
		}
		start := time.Now()
		in.retryHeld()
		// A pass orders the whole hold: under overload an outcome wakes it
		// hundreds of times a second, so passes are spaced by at least
		// holdPassGap; the slots freed meanwhile are filled by the next.
		if gap := holdPassGap - time.Since(start); gap > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(gap):
			}
		}
	}
}

// retryHeld takes the held tasks, highest priority first and in fair
// order between tenants inside a priority (order), and dispatches those
// whose candidate set is no longer saturated; a set found saturated is not
// decided again in this pass, so no lower-priority task of it goes before
// a higher one. A task saturated only because little of its own deadline
// is left stays held without marking its set (ownDeadlineOnly): it still
// counts as held, so no lower priority passes it, but the younger tasks
// of its priority may go. Tasks past their deadline fail; tasks cancelled meanwhile
// are dropped (their result is stored), never dispatched; sheddable tasks
// that cannot start in time are shed.
func (in *Stage) retryHeld() {
	q := in.held.takePass(in.Rules)
	if len(q) == 0 {
		in.held.endPass(nil)
		return
	}
	p := &holdPass{in: in, q: q, now: time.Now(), table: in.Tables.Table(), rate: in.drain.perSecond()}
	for i, ht := range q {
		if ht.gone {
			continue // shed already (shedorder.go)
		}
		if p.ends(i, ht) {
			continue
		}
		if ht.a.overQuota {
			if ht = p.quotaToken(i, ht); ht == nil {
				continue
			}
		}
		p.sendOn(ht)
	}
	in.held.endPass(p.keep)
}

// holdPass is one pass of the hold over its tasks, in order.
type holdPass struct {
	in    *Stage
	q     []*heldTask // the tasks, in the pass's order
	now   time.Time
	table *policy.Table
	rate  float64 // the measured drain rate, tasks/s
	// candidate sets found saturated, tenants over their rate quota,
	// tenants at their concurrency cap, in this pass
	saturated, refused, capped []string
	keep                       []*heldTask // still held after the pass
}

// stay keeps a task held, alive.
func (p *holdPass) stay(ht *heldTask) {
	p.in.keepAlive(ht, p.now)
	p.keep = append(p.keep, ht)
}

// ends ends the i-th task if its time in the hold is over: cancelled
// meanwhile (it has its result), past its own deadline, past its hold
// time, or sheddable and unable to start in time at the drain rate. It
// reports whether the task left the hold.
func (p *holdPass) ends(i int, ht *heldTask) bool {
	in, h, t, now := p.in, p.in.held, &ht.a.Task, p.now
	switch {
	case in.Superseded.Cancelled(t.ID, ht.a.Submission):
		h.leave(ht)
		in.Fin.End(ht.a.EndsStored(ht.msg))
	case !ht.expiry.IsZero() && !now.Before(ht.expiry):
		h.leave(ht)
		if t.Priority < 0 {
			in.shed(ht, len(p.keep), "its deadline passed while it was held")
		} else {
			in.shedFirst(p.q, i, ht.key)
			in.expire(&ht.a, ht.msg, ht.expiry, "while it was held for want of capacity")
		}
	case now.After(ht.until) && in.Config.QueueTargetOn && !ht.a.overLimit() && t.Priority >= 0 && p.onlyWaiting(ht):
		p.stay(ht)
	case now.After(ht.until):
		h.leave(ht)
		if ht.a.overLimit() {
			in.rejectQuota(&ht.a, ht.msg, in.drain.retryAfter(len(p.keep)))
		} else if t.Priority < 0 {
			in.shed(ht, len(p.keep), "it waited its whole deadline with every candidate saturated")
		} else {
			in.shedFirst(p.q, i, ht.key)
			in.failSaturated(ht)
		}
	case t.Priority < 0 && p.rate > 0 && !ht.expiry.IsZero() &&
		now.Add(time.Duration(float64(len(p.keep)+1)/p.rate*float64(time.Second))).After(ht.expiry):
		// At the measured drain rate it would start after its deadline.
		h.leave(ht)
		in.shed(ht, len(p.keep), "at the measured drain rate it could not start before its deadline")
	default:
		return false
	}
	return true
}

// onlyWaiting: a task held for the queue target whose hold time ran out
// is not saturated if a node could still start it within its own
// deadline, only waiting its turn (the pulled part of the backlog): it
// waits on, for another hold time (a task with a deadline_ms ends at it
// all the same).
func (p *holdPass) onlyWaiting(ht *heldTask) bool {
	in := p.in
	req := in.requestAs(&ht.a, fullDeadline)
	if dec, err := in.Engine.Decide(p.table, &req); err != nil || dec.Saturated {
		return false
	}
	ht.until = p.now.Add(in.holdWait(&ht.a))
	if !ht.expiry.IsZero() && ht.expiry.Before(ht.until) {
		ht.until = ht.expiry
	}
	in.Keeper.Keep(ht.msg, ht.a.TaskAck, ht.until)
	return true
}

// quotaToken asks the tenant's rate quota for a task held over it; a
// tenant refused is not asked again in the pass. The token goes to the
// tenant's newest task of the priority (newestOverQuota), which takes the
// i-th place. It returns the task that goes on, nil if none.
func (p *holdPass) quotaToken(i int, ht *heldTask) *heldTask {
	in, q := p.in, p.q
	if containsStr(p.refused, ht.tenant) {
		p.stay(ht)
		return nil
	}
	if ok, _ := in.Quota.Allow(context.Background(), ht.tenant); !ok {
		p.refused = append(p.refused, ht.tenant)
		p.stay(ht)
		return nil
	}
	if j := newestOverQuota(q, i, p.now); j > i {
		q[i], q[j] = q[j], q[i]
		q[i].tags, q[j].tags = q[j].tags, q[i].tags
		ht = q[i]
	}
	ht.a.admitted, ht.a.overQuota = true, false
	in.held.count(ht)
	return ht
}

// sendOn decides a held task again, unless its candidate set was found
// saturated in this pass, and sends it on when it is not saturated now
// (and, held at its tenant's cap, its tenant has room).
func (p *holdPass) sendOn(ht *heldTask) {
	in, h := p.in, p.in.held
	if containsStr(p.saturated, ht.key) {
		p.stay(ht)
		return
	}
	// Asked without the ahead credit (Request.Ahead): saturated for every
	// task of the set. resume asks again when the task, once out of the
	// hold, would have the credit.
	req := in.request(&ht.a)
	dec, err := in.Engine.Decide(p.table, &req)
	if err != nil || !dec.Saturated {
		if ht.a.overCap && !in.capRoom(ht, &p.capped) {
			p.stay(ht)
			return
		}
		h.leave(ht)
		h.served(ht)
		ht.a.fromHold = true // sent on in the pass's order
		// admission goes on from the hold step with this decision (and
		// handles an error)
		in.resume(ht.a, ht.msg, p.table, &req, dec, err)
		return
	}
	if ht.expiry.IsZero() || !in.ownDeadlineOnly(p.table, &ht.a) {
		p.saturated = append(p.saturated, ht.key)
	}
	// else saturated only because too little of its own deadline is left:
	// it waits here to go or expire (or be shed), and does not hold back
	// the younger tasks of its set, which could still finish (issue 20).
	p.stay(ht)
}

// newestOverQuota returns the index of the newest task after q[i] held over
// the same tenant's rate quota at the same priority, both with a deadline,
// or -1. Over its quota a tenant with deadlines is served newest first
// (adaptive LIFO): offered more than its rate, the oldest of its held tasks
// would be started with little of their deadline left and expire before or
// as they run, while the newest have all of it (issue 20: served oldest
// first, 39% of the tasks a 100/s quota let in ended expired). The oldest
// end at their deadlines, as that many would anyway.
func newestOverQuota(q []*heldTask, i int, now time.Time) int {
	ht := q[i]
	if ht.expiry.IsZero() {
		return -1
	}
	for j := len(q) - 1; j > i; j-- {
		o := q[j]
		if o.a.overQuota && o.tenant == ht.tenant && o.a.Task.Priority == ht.a.Task.Priority &&
			!o.expiry.IsZero() && now.Before(o.expiry) && o.since.After(ht.since) {
			return j
		}
	}
	return -1
}

// ownDeadlineOnly reports whether a held task found saturated would not be
// with a full deadline (its timeout plus slack, and the queue target): only
// its own deadline_ms, nearly spent, makes it so. Such a task does not mark
// its candidate set saturated for the pass, as the simulator's hold
// (dispatcher/internal/simulate/flow.go).
func (in *Stage) ownDeadlineOnly(table *policy.Table, a *Attempt) bool {
	req := in.requestAs(a, noExpiry)
	dec, err := in.Engine.Decide(table, &req)
	return err == nil && !dec.Saturated
}

// capRoom reports whether a task held at its tenant's concurrency cap may
// go now: its place is taken (until its hold time; dispatch counts it again
// until the attempt's deadline). A tenant found at its cap is not asked
// again in the pass.
func (in *Stage) capRoom(ht *heldTask, capped *[]string) bool {
	if containsStr(*capped, ht.tenant) {
		return false
	}
	if ok, _ := in.Quota.Acquire(context.Background(), ht.tenant, ht.a.Task.ID, in.holdWait(&ht.a), false); !ok {
		*capped = append(*capped, ht.tenant)
		return false
	}
	ht.a.overCap = false
	return true
}

// keepAlive keeps a held message from redelivery.
func (in *Stage) keepAlive(ht *heldTask, now time.Time) {
	if now.Sub(ht.progress) >= in.Config.AckWait/3 {
		in.Complete.Progress(ht.msg)
		ht.progress = now
	}
}

// order sorts q for a pass in the fair order (fairorder.Sort: priority
// descending, then start-time fair between tenants by weight, then age).
// Called with mu held.
func (h *holdRoom) order(q []*heldTask, rules Rules) {
	fairorder.Sort(h.fair, q, rules.Weight)
}

// served: a held task goes on; the fair order's clocks advance.
func (h *holdRoom) served(ht *heldTask) {
	h.mu.Lock()
	h.fair.Served(ht.tenant, ht.tags)
	h.mu.Unlock()
}

// shed ends a sheddable held task that cannot start in time: failed with
// CodeShed, not dead-lettered (the producer's to retry, after
// retry_after_ms), counted.
func (in *Stage) shed(ht *heldTask, ahead int, why string) {
	a := &ht.a
	in.Counters.ShedFlow.Add(1)
	err := protocol.Errorf(protocol.CodeShed, "priority %d is sheddable and %s (%d tasks of this replica ahead of it); retry after retry_after_ms",
		a.Task.Priority, why, ahead)
	in.Log.Debug().Err(err).Str("task_id", a.Task.ID).Str("tenant", ht.tenant).Msg("task shed")
	e := a.Ends(ht.msg, err, protocol.StatusFailed)
	e.RetryAfter = in.drain.retryAfter(ahead)
	in.Fin.End(e)
}

func (in *Stage) failSaturated(ht *heldTask) {
	a := &ht.a
	waited := time.Since(ht.since).Round(time.Millisecond)
	models := make([]string, 0, 4)
	if table := in.Tables.Table(); table != nil {
		for _, c := range table.Candidates(a.Task.Type) {
			if protocol.AllowedBy(a.Task.Models, c.Model) {
				models = append(models, c.Model)
			}
		}
	}
	err := protocol.Errorf(protocol.CodeSaturated, "no node could start the task before its deadline: every candidate for type %q (%s) stayed saturated for %s, the task's timeout plus the deadline slack",
		a.Task.Type, strings.Join(models, ", "), waited)
	in.Log.Warn().Err(err).Str("task_id", a.Task.ID).Int("attempt", a.Attempt).Msg("task failed: saturated")
	in.Fin.End(a.Ends(ht.msg, err, protocol.StatusFailed))
}

// releaseHeld naks every held message, for another replica or a restart.
func (in *Stage) releaseHeld() {
	for _, ht := range in.held.close() {
		in.held.leave(ht)
		in.Complete.Retry(ht.msg, 0)
	}
}

// close closes the room (put refuses from now on) and returns what it
// held.
func (h *holdRoom) close() []*heldTask {
	h.mu.Lock()
	defer h.mu.Unlock()
	q := h.q
	h.q, h.stopped = nil, true
	h.n.Store(0)
	return q
}

func containsStr(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// bandName names a priority's band for metrics and the stats report.
func bandName(priority int) string { return bandLabel(topology.BandOf(priority)) }

// bandLabel names a band (topology.BandOf) for metrics and the stats report.
func bandLabel(band int) string {
	switch band {
	case topology.BandHigh:
		return "high"
	case topology.BandLow:
		return "low"
	}
	return "normal"
}

// waiting counts the held tasks by band and tenant, the top tenants by
// tasks held and the rest as "other": bounded labels. Read from the
// room's counts, it includes the tasks a pass has taken out.
func (h *holdRoom) waiting(top int) []protocol.HeldCount {
	h.mu.Lock()
	type bt struct{ band, tenant string }
	n := map[bt]int{}
	per := map[string]int{}
	h.fair.EachTenant(func(band int, tenant string, c int) {
		n[bt{bandLabel(band), tenant}] += c
		per[tenant] += c
	})
	h.mu.Unlock()
	tenants := make([]string, 0, len(per))
	for t := range per {
		tenants = append(tenants, t)
	}
	slices.SortFunc(tenants, func(a, b string) int { return cmp.Or(cmp.Compare(per[b], per[a]), cmp.Compare(a, b)) })
	keepName := map[string]bool{}
	for _, t := range tenants[:min(top, len(tenants))] {
		keepName[t] = true
	}
	merged := map[bt]int{}
	for k, v := range n {
		if !keepName[k.tenant] {
			k.tenant = "other"
		}
		merged[k] += v
	}
	out := make([]protocol.HeldCount, 0, len(merged))
	for k, v := range merged {
		out = append(out, protocol.HeldCount{Band: k.band, Tenant: k.tenant, Held: v})
	}
	slices.SortFunc(out, func(a, b protocol.HeldCount) int {
		return cmp.Or(cmp.Compare(a.Band, b.Band), cmp.Compare(a.Tenant, b.Tenant))
	})
	return out
}

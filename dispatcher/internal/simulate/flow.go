package simulate

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/mlsched/mlsched/dispatcher/internal/fairorder"
	"github.com/mlsched/mlsched/dispatcher/internal/policy"
	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// Flow control in the simulator: a scenario with arrival.flows gives its
// tasks a priority, a tenant and a deadline, and the simulated dispatcher
// applies the dispatcher's flow-control rules (docs/policies.md, "Flow
// control"; dispatcher/internal/admission, dispatcher/flow.go) to every policy's run,
// the oracle's included. The order of the held tasks, with its counts (no
// inversion, who goes first), is the dispatcher's own: package fairorder,
// keyed as the dispatcher keys it (a simulated task has no allow-list, so
// its candidate set is its type). The rest of the dispatcher's hold is
// tied to its messages, its clock and its quota store, so it is mirrored
// here; keep the two in step:
//
//   - a task past its deadline is never started: at dispatch or in the
//     hold it ends expired (a sheddable one held: shed); the attempt's
//     deadline is capped at the task's, so a node does not start it late;
//     a failed attempt past the deadline is not retried (settle: expired);
//   - the engine's deadline is the time left (and MLSCHED_QUEUE_TARGET,
//     the scenario's queue_target, when set), so a task that cannot start
//     in time anywhere is held, not sent to expire on a node;
//   - while a task of a type is held with a priority at least a new
//     task's, the new one is held behind it (no overtaking), unless it
//     goes first (leads: none held of a higher priority, none of its
//     tenant in its band), when only a higher priority holds it back; such
//     a task asks the engine with Request.Ahead (one slot's wait on a node
//     that orders its queue, Heartbeat.Prefetch);
//   - a pass of the hold (after each outcome, at most every 5 ms, and
//     every 100 ms) takes the held tasks in the fair order (fairorder.Sort:
//     highest priority first and, inside a priority, start-time fair
//     between tenants by weight); a type found saturated
//     is not decided again in the pass, unless only the task's own
//     deadline makes it so (it would not be with the full deadline): that
//     task stays held and the pass goes on;
//   - in the pass a task past its deadline ends expired (sheddable: shed),
//     one past its hold time (timeout plus slack) fails saturated
//     (sheddable: shed) unless, with a queue target, a node could still
//     start it within the full deadline; a sheddable task that at the
//     measured drain rate (dispatches per second, smoothed over 1 s) cannot
//     start before its deadline from its place in the pass is shed, so the
//     most-over-share tenants' tasks, last in the order, go first;
//   - what the dispatchers have pulled of a band and not finished (held,
//     in flight or retrying: a task is acked after its result) is bounded
//     by the band consumer's MaxAckPending (the scenario's
//     max_ack_pending, default 2048: 2 x MLSCHED_MAX_IN_FLIGHT); the rest
//     waits in the stream, in stream order, and is pulled as tasks finish;
//   - tenant parking (the scenario's park_above, default 256; -1: off): a
//     task pulled from a band's stream is parked when its tenant already
//     has at least park_above tasks held in that band (any priority of
//     it) and another tenant's task was pulled from the band's stream in
//     the last 60 s (so a single-tenant workload never parks). A parked
//     task leaves the band's pull window at once (it is acked: the band
//     pulls the next) and waits in a FIFO per band and tenant, which is
//     pulled while fewer than 2 x park_above of its tasks are pulled and
//     not finished; a task pulled from it is taken in like any other and
//     never parked again. Parking takes no simulated time;
//   - an inversion is a dispatch while a task of the same type with a
//     higher priority is held; the dispatcher counts them and so does this.
//
// Two simplifications: the pass sends a task on with the decision it made
// (the dispatcher decides once more in dispatch), and there are no quotas.

// endKind is how a task ended, for the flow figures.
type endKind uint8

const (
	endNormal    endKind = iota // a result from its attempts
	endShed                     // shed (sheddable, could not start in time)
	endExpired                  // its deadline passed before it started, or before a retry
	endSaturated                // held its whole hold time, every candidate saturated
)

// The hold's pacing, as the dispatcher's (hold.go).
const (
	holdPassGap = 5 * time.Millisecond
	holdRetry   = 100 * time.Millisecond
)

// flowControl is the simulated dispatcher's hold and flow-control state.
type flowControl struct {
	flows   []Flow
	cum     []float64 // cumulative shares, to draw a flow
	weights map[string]float64
	qt      time.Duration // queue target (0: automatic, < 0: off)

	// q are the held tasks, in holding order between passes; order is
	// their fair order, with the held counts per candidate set and
	// priority, and per band and tenant (the dispatcher's, hold.go).
	q     []*task
	order *fairorder.Order
	// passQ is the running pass's tasks (shedFirst marks the sheddable
	// ones it sheds gone, and the pass skips them).
	passQ []*task

	inPass   bool
	pending  []*task // held during a pass: after the kept ones
	lastPass time.Duration
	nextPass time.Duration // a pass is due then (-1: none)

	drain      drainMeter
	inversions int
	// shedInversions: non-sheddable tasks ended for want of capacity
	// while a sheddable one of their type was held (shedorder.go)
	shedInversions int

	// the pull bound per band (high, normal, low): tasks pulled and not
	// finished, and the stream's backlog in stream order
	maxPending int
	pulled     [3]int
	stream     [3][]*task
	// tenant parking per band (parkAbove 0: off): the last pulls from the
	// stream, the parked queues by tenant (the held tasks by tenant are
	// order's)
	parkAbove, parkedPending int
	lastPull                 [3]pullMark
	parked                   [3]map[string]*parkedQueue
	// ownBlocks: Options.OwnDeadlineBlocks
	ownBlocks bool
	// fullOK are the types a node could start within the full deadline, in
	// this pass (one decision per type and pass, not per task).
	fullOK []string
}

// intake takes a new task from the stream if its band's consumer has room
// (and parks it, or takes it in), else the task waits in the stream.
func (s *sim) intake(ctx context.Context, t *task) error {
	f := s.fc
	b := topology.BandIndex(t.priority)
	if f.pulled[b] >= f.maxPending {
		f.stream[b] = append(f.stream[b], t)
		return nil
	}
	if s.park(t, b) {
		return nil
	}
	f.pulled[b]++
	t.pulled = true
	return s.dispatchFlow(ctx, t, false)
}

// finished: a pulled task has its result; its band, or its parked queue,
// pulls the next.
func (s *sim) finishedFlow(t *task) {
	f := s.fc
	b := topology.BandIndex(t.priority)
	switch {
	case t.fromPark:
		pq := f.parked[b][t.tenant]
		pq.pending--
		s.pullParked(pq)
	case t.pulled:
		f.pulled[b]--
		for len(f.stream[b]) > 0 && f.pulled[b] < f.maxPending {
			next := f.stream[b][0]
			f.stream[b][0] = nil
			f.stream[b] = f.stream[b][1:]
			if s.park(next, b) {
				continue // acked: the band pulls on
			}
			f.pulled[b]++
			next.pulled = true
			s.push(s.now, evRedecide, s.eventT(next))
		}
	}
}

// parkMemory is how long a pull of another tenant's task from a band
// keeps parking on for the band's other tenants.
const parkMemory = 60 * time.Second

// pullMark is a band's last pull from its stream, and the last one of
// another tenant than that pull's.
type pullMark struct {
	tenant  string
	at      time.Duration
	otherAt time.Duration // of a tenant other than tenant
}

// parkedQueue is a band's parked tasks of one tenant, in parking order,
// and how many it has pulled that have not finished.
type parkedQueue struct {
	q       []*task
	pending int
}

// park is the parking rule for a task just pulled from band b's stream:
// it reports whether the task was parked (and is out of the band's pull
// window).
func (s *sim) park(t *task, b int) bool {
	f := s.fc
	m := &f.lastPull[b]
	other := m.otherAt // the last pull of a tenant other than t's
	if m.tenant != t.tenant {
		other = m.at
		m.otherAt, m.tenant = m.at, t.tenant
	}
	m.at = s.now
	if f.parkAbove <= 0 || f.order.TenantHeld(fairorder.Band(t.priority), t.tenant) < f.parkAbove || s.now-other > parkMemory {
		return false
	}
	pq := f.parked[b][t.tenant]
	if pq == nil {
		pq = &parkedQueue{}
		f.parked[b][t.tenant] = pq
	}
	pq.q = append(pq.q, t)
	s.pullParked(pq)
	return true
}

// pullParked takes tasks from a parked queue, oldest first, while fewer
// than parkedPending of its tasks are pulled and not finished.
func (s *sim) pullParked(pq *parkedQueue) {
	for len(pq.q) > 0 && pq.pending < s.fc.parkedPending {
		t := pq.q[0]
		pq.q[0] = nil
		pq.q = pq.q[1:]
		pq.pending++
		t.fromPark = true
		s.push(s.now, evRedecide, s.eventT(t))
	}
}

const priorityLevels = protocol.MaxPriority - protocol.MinPriority + 1

func newFlowControl(sc *Scenario, opt Options) *flowControl {
	f := &flowControl{flows: sc.Arrival.Flows, weights: sc.TenantWeights, qt: cmp.Or(sc.QueueTarget.D(), opt.Engine.QueueTarget),
		order: fairorder.New(), nextPass: -1, maxPending: sc.MaxAckPending, ownBlocks: opt.OwnDeadlineBlocks}
	f.order.FinishFirst = opt.FairByFinishTag
	if sc.ParkAbove > 0 {
		f.parkAbove, f.parkedPending = sc.ParkAbove, 2*sc.ParkAbove
	}
	for b := range f.lastPull {
		f.parked[b] = map[string]*parkedQueue{}
		f.lastPull[b] = pullMark{at: -parkMemory - 1, otherAt: -parkMemory - 1} // none yet
	}
	var sum float64
	for _, fl := range f.flows {
		sum += fl.Share
		f.cum = append(f.cum, sum)
	}
	return f
}

func (f *flowControl) weight(tenant string) float64 {
	if w, ok := f.weights[tenant]; ok {
		return w
	}
	return 1
}

// pickFlow draws the task's flow from the arrival stream (only scenarios
// with flows draw it, so the others' streams are unchanged).
func (s *sim) pickFlow(t *task) {
	f := s.fc
	u := s.arrive.Float64() * f.cum[len(f.cum)-1]
	i, _ := slices.BinarySearch(f.cum, u)
	i = min(i, len(f.flows)-1)
	fl := &f.flows[i]
	t.flow, t.priority, t.tenant = i, fl.Priority, fl.Tenant
	if fl.Deadline > 0 {
		t.expiry = t.submit + fl.Deadline.D()
	}
}

// drainMeter is the dispatcher's measure of how fast held work is sent on
// (flow.go), on the simulated clock.
type drainMeter struct {
	start time.Duration
	began bool
	n     int
	rate  float64
}

func (m *drainMeter) dispatched(now time.Duration) {
	if !m.began {
		m.start, m.began = now, true
	}
	m.n++
	if el := now - m.start; el >= time.Second {
		r := float64(m.n) / el.Seconds()
		if m.rate == 0 {
			m.rate = r
		} else {
			m.rate = 0.7*m.rate + 0.3*r
		}
		m.start, m.n = now, 0
	}
}

// key is the task's candidate set, as the dispatcher keys it: a simulated
// task has no allow-list.
func (t *task) key() string { return fairorder.Key(t.typ, nil) }

// Fair is the held task as the fair order sorts it: its age is when it
// started to wait.
func (t *task) Fair() (int, string, time.Time, *fairorder.Tags) {
	return t.priority, t.tenant, epoch.Add(t.waitFrom), &t.tags
}

// heldAtLeast: a task of t's candidate set with at least (strict: more
// than) its priority is held (hold.go's heldAtLeast).
func (f *flowControl) heldAtLeast(t *task, strict bool) bool {
	return f.order.HeldAtLeast(t.key(), t.priority, strict)
}

// leads: t goes first at a node that orders its queue (hold.go's leads).
func (f *flowControl) leads(t *task, fromHold bool) bool {
	return f.order.Leads(t.key(), t.priority, t.tenant, fromHold)
}

// leave: a held task leaves the hold's counts.
func (f *flowControl) leave(t *task) {
	if t.counted {
		f.order.Count(t.key(), t.priority, -1)
		f.order.CountTenant(t.priority, t.tenant, -1)
		t.counted = false
	}
}

// holdWait is how long a task may be held for want of capacity.
func (s *sim) holdWait() time.Duration { return s.deadline() }

// hold keeps a task whose candidates are saturated (or that must wait
// behind a held task of no lower priority).
func (s *sim) hold(t *task) {
	f := s.fc
	if t.waitFrom < 0 {
		t.waitFrom = s.now
	}
	t.until = t.waitFrom + s.holdWait()
	if t.expiry > 0 && t.expiry < t.until {
		t.until = t.expiry
	}
	if !t.counted {
		f.order.Count(t.key(), t.priority, 1)
		f.order.CountTenant(t.priority, t.tenant, 1)
		t.counted = true
	}
	if f.inPass {
		f.pending = append(f.pending, t)
		return
	}
	f.q = append(f.q, t)
}

// requestPass schedules a pass of the hold at the earliest at, and no
// sooner than holdPassGap after the last.
func (s *sim) requestPass(at time.Duration) {
	f := s.fc
	at = max(at, f.lastPass+holdPassGap)
	if f.nextPass >= 0 && f.nextPass <= at {
		return
	}
	f.nextPass = at
	s.push(at, evPass, nil)
}

// retryHeldFlow: a slot may have freed (an outcome, a refresh): the hold
// makes a pass, paced as the dispatcher's.
func (s *sim) retryHeldFlow(context.Context) error {
	if len(s.fc.q) > 0 {
		s.requestPass(s.now)
	}
	return nil
}

// flowRequest is the engine's request for the task: the deadline is the
// time left, and the queue target when set (full: without it).
func (s *sim) flowRequest(t *task, full bool) policy.Request {
	s.size = t.size // the oracle's true failure probability depends on it
	deadline := s.deadline()
	if t.expiry > 0 {
		deadline = max(0, min(deadline, t.expiry-s.now))
	}
	// the engine applies the queue target (Options.Engine.QueueTarget,
	// from the scenario's) per (model, node); full asks without it
	return policy.Request{Type: t.typ, Size: t.size, Tried: t.history, Timeout: s.sc.Timeout.D(), Deadline: deadline, FullDeadline: full,
		Priority: t.priority}
}

// dispatchFlow is dispatch under flow control (admission's chain).
func (s *sim) dispatchFlow(ctx context.Context, t *task, fromHold bool) error {
	if t.expiry > 0 && s.now >= t.expiry {
		if t.priority >= 0 {
			s.shedFirst(t.typ)
		}
		s.endFlow(t, endExpired)
		return nil
	}
	req := s.flowRequest(t, false)
	// A task that goes first in flow control's order overtakes the held
	// ones, and a node that orders its queue starts it next: the engine
	// counts one slot's wait for it there, not the queue target's worth
	// (admission's chain).
	req.Ahead = s.fc.leads(t, fromHold)
	req.AheadInBand = req.Ahead && s.fc.order.BandHeld(t.key(), t.priority)
	d, err := s.dec.peek(&req)
	if err == nil && (d.Saturated || s.fc.heldAtLeast(t, fromHold || req.Ahead)) {
		s.hold(t)
		if !d.Saturated {
			s.requestPass(s.now) // a slot is free: the hold sends on what goes first
		}
		return nil
	}
	if err == nil && !req.Ahead {
		s.fc.order.SentPlain(t.key(), t.priority)
	}
	return s.send(ctx, t, d, err)
}

// send publishes the decided attempt (or handles the decision's error).
func (s *sim) send(ctx context.Context, t *task, d policy.Decision, err error) error {
	f := s.fc
	n := len(t.history) + 1
	nd := s.byNode[d.Node]
	if err == nil && (nd == nil || !slices.Contains(nd.spec.Models, d.Model)) {
		return fmt.Errorf("policy %s chose model %q on node %q, which does not host it", s.name, d.Model, d.Node)
	}
	res := &s.tasks[t.idx]
	if n == 1 && !res.firstSet {
		res.firstSet, res.pFirst = true, s.firstFailProb(d, nd, err)
	}
	if err != nil {
		s.awaitCandidate(t)
		return nil
	}
	if f.heldAtLeast(t, true) {
		f.inversions++
	}
	t.waitFrom = -1
	if s.ro != nil && n == 1 && t.step == 0 {
		s.ro.dispatched(d.Model)
	}
	deadline := s.now + s.deadline()
	if t.expiry > 0 && t.expiry < deadline {
		deadline = t.expiry // the worker does not start it past the task's own
	}
	a := &attempt{t: t, n: n, model: d.Model, node: nd, dispatched: s.now, deadline: deadline}
	s.rec[0] = stats.Event{Model: a.model, Node: nd.spec.Name, Kind: stats.KindDispatched, At: s.clock()}
	if err := s.store.Record(ctx, s.rec[:]); err != nil {
		return fmt.Errorf("record dispatch: %w", err)
	}
	s.dec.sent(d.Model, d.Node)
	f.drain.dispatched(s.now)
	s.toNode(a)
	return nil
}

// endFlow ends a task that was never started again: shed, expired or
// saturated. A first attempt never sent counts as a failed one.
func (s *sim) endFlow(t *task, k endKind) {
	res := &s.tasks[t.idx]
	if len(t.history) == 0 && !res.firstSet {
		res.firstSet, res.pFirst, res.queueFailed = true, 1, true
	}
	res.end = k
	s.finish(t, false)
}

// passFlow is one pass of the hold (hold.go's retryHeld): the held tasks
// in the fair order, each decided in turn.
func (s *sim) passFlow(ctx context.Context) error {
	f := s.fc
	f.lastPass = s.now
	f.inPass = true
	f.fullOK = f.fullOK[:0]
	var saturated []string
	rate := f.drain.rate
	q := f.q
	f.q = nil
	fairorder.Sort(f.order, q, f.weight)
	f.passQ = q
	kept := q[:0] // in place: a task is kept at or before its own index
	for i := range q {
		t := q[i]
		if t.gone {
			continue
		}
		keep, err := s.passTask(ctx, t, rate, len(kept), &saturated)
		if err != nil {
			f.inPass, f.passQ = false, nil
			return err
		}
		if keep {
			kept = append(kept, t)
		}
	}
	kept = slices.DeleteFunc(kept, func(t *task) bool { return t.gone }) // shed after they were kept
	clear(q[len(kept):])
	f.inPass, f.passQ = false, nil
	f.q = append(kept, f.pending...) // held meanwhile: after the kept ones
	clear(f.pending)
	f.pending = f.pending[:0]
	if len(f.q) > 0 {
		s.requestPass(s.now + holdRetry)
	}
	return nil
}

// passTask decides one held task in a pass; it reports whether the task
// stays held.
func (s *sim) passTask(ctx context.Context, t *task, rate float64, ahead int, saturated *[]string) (bool, error) {
	f := s.fc
	if t.expiry > 0 && s.now >= t.expiry {
		f.leave(t)
		if t.priority < 0 {
			s.endFlow(t, endShed)
		} else {
			s.shedFirst(t.typ)
			s.endFlow(t, endExpired)
		}
		return false, nil
	}
	if s.now > t.until && f.qt >= 0 && t.priority >= 0 {
		// Held for the queue target: waits on while a node could still
		// start it within its own deadline.
		ok := slices.Contains(f.fullOK, t.typ)
		if !ok {
			req := s.flowRequest(t, true)
			d, err := s.dec.peek(&req)
			if ok = err == nil && !d.Saturated; ok {
				f.fullOK = append(f.fullOK, t.typ)
			}
		}
		if ok {
			t.until = s.now + s.holdWait()
			if t.expiry > 0 && t.expiry < t.until {
				t.until = t.expiry
			}
			return true, nil
		}
	}
	if s.now > t.until {
		f.leave(t)
		if t.priority < 0 {
			s.endFlow(t, endShed)
		} else {
			s.shedFirst(t.typ)
			s.endFlow(t, endSaturated)
		}
		return false, nil
	}
	if t.priority < 0 && rate > 0 && t.expiry > 0 &&
		s.now+time.Duration(float64(ahead+1)/rate*float64(time.Second)) > t.expiry {
		f.leave(t) // at the measured drain rate it would start after its deadline
		s.endFlow(t, endShed)
		return false, nil
	}
	if slices.Contains(*saturated, t.typ) {
		return true, nil
	}
	req := s.flowRequest(t, false)
	d, err := s.dec.peek(&req)
	if err == nil && d.Saturated {
		if !f.ownBlocks && t.expiry > 0 {
			// Saturated only by its own deadline (too little time left to
			// finish anywhere)? Then it waits to go or expire without
			// holding back the younger tasks of its type (hold.go's
			// ownDeadlineOnly).
			own := req
			own.Deadline = s.flowRequest(&task{typ: t.typ, history: t.history, size: t.size}, false).Deadline
			if d2, err2 := s.dec.peek(&own); err2 == nil && !d2.Saturated {
				return true, nil
			}
		}
		*saturated = append(*saturated, t.typ)
		return true, nil
	}
	if f.heldAtLeast(t, true) {
		return true, nil // a higher one of its type waits: this one waits behind it
	}
	f.leave(t)
	f.order.Served(t.tenant, t.tags)
	return false, s.send(ctx, t, d, err)
}

// FlowResult is one flow's figures in a policy's run.
type FlowResult struct {
	Flow     string `json:"flow"`
	Priority int    `json:"priority"`
	Tenant   string `json:"tenant"`
	Tasks    int    `json:"tasks"`
	// Success is the share of the flow's tasks that succeeded.
	Success float64 `json:"success"`
	// VsOracle is Success minus the oracle run's, in percentage points.
	VsOracle float64 `json:"vs_oracle_pp"`
	// Latency from submission to the result of the tasks that succeeded.
	P50Ms float64 `json:"p50_ms"`
	P95Ms float64 `json:"p95_ms"`
	P99Ms float64 `json:"p99_ms"`
	// Shed, Expired and Saturated count the tasks that ended so.
	Shed      int `json:"shed"`
	Expired   int `json:"expired"`
	Saturated int `json:"saturated"`
	// WithinDeadline is the share of the flow's tasks that succeeded
	// within their deadline (flows with one; else Success).
	WithinDeadline float64 `json:"within_deadline"`
	// Share is the flow's share of the successes that ended while tasks
	// were still arriving, after the first tenth of that time (the
	// steady state of a saturated run).
	Share float64 `json:"share"`
}

// FlowSummary is a policy's flow-control figures.
type FlowSummary struct {
	Flows []FlowResult `json:"flows"`
	// Inversions: dispatches while a task of the same type with a higher
	// priority was held (the dispatcher's counter; must be 0).
	Inversions int `json:"inversions"`
	// ShedInversions: tasks that may not be shed (priority >= 0) ended
	// for want of capacity while a sheddable task of their type was held
	// (the dispatcher's shed_inversions; must be 0).
	ShedInversions int `json:"shed_inversions"`
	// StartedLate: attempts started after their task's deadline (must be
	// 0).
	StartedLate int `json:"started_late"`
	// ShedOrExpiredSheddable is the share of the shed or expired tasks
	// that were sheddable (priority < 0).
	ShedOrExpiredSheddable float64 `json:"shed_or_expired_sheddable"`
}

// summarizeFlows computes the per-flow figures of a run.
func summarizeFlows(sc *Scenario, ts []taskResult, inversions int) *FlowSummary {
	flows := sc.Arrival.Flows
	out := &FlowSummary{Flows: make([]FlowResult, len(flows)), Inversions: inversions}
	lats := make([][]time.Duration, len(flows))
	within := make([]int, len(flows))
	okIn := make([]int, len(flows))
	var lastArrival time.Duration
	for _, t := range ts {
		lastArrival = max(lastArrival, t.submit)
	}
	from := lastArrival / 10
	var okAll, endedBad, endedBadSheddable int
	for _, t := range ts {
		if t.flow < 0 {
			continue
		}
		fl := &flows[t.flow]
		r := &out.Flows[t.flow]
		r.Tasks++
		if t.startedLate {
			out.StartedLate++
		}
		switch t.end {
		case endShed:
			r.Shed++
		case endExpired:
			r.Expired++
		case endSaturated:
			r.Saturated++
		}
		if t.end == endShed || t.end == endExpired {
			endedBad++
			if fl.Priority < 0 {
				endedBadSheddable++
			}
		}
		if !t.succeeded {
			continue
		}
		lats[t.flow] = append(lats[t.flow], t.latency)
		if fl.Deadline == 0 || t.latency <= fl.Deadline.D() {
			within[t.flow]++
		}
		if end := t.submit + t.latency; end >= from && end <= lastArrival {
			okIn[t.flow]++
			okAll++
		}
	}
	for i := range out.Flows {
		r := &out.Flows[i]
		r.Flow, r.Priority, r.Tenant = flows[i].Name, flows[i].Priority, flows[i].Tenant
		if r.Tasks > 0 {
			r.Success = float64(len(lats[i])) / float64(r.Tasks)
			r.WithinDeadline = float64(within[i]) / float64(r.Tasks)
		}
		if okAll > 0 {
			r.Share = float64(okIn[i]) / float64(okAll)
		}
		l := lats[i]
		slices.Sort(l)
		q := func(p float64) float64 {
			if len(l) == 0 {
				return 0
			}
			return float64(l[max(0, int(math.Ceil(p*float64(len(l))))-1)]) / float64(time.Millisecond)
		}
		r.P50Ms, r.P95Ms, r.P99Ms = q(0.50), q(0.95), q(0.99)
	}
	if endedBad > 0 {
		out.ShedOrExpiredSheddable = float64(endedBadSheddable) / float64(endedBad)
	} else {
		out.ShedOrExpiredSheddable = 1
	}
	return out
}

// aggregateFlows averages the flow figures of several runs.
func aggregateFlows(rs []Result) *FlowSummary {
	if rs[0].FlowControl == nil {
		return nil
	}
	n := float64(len(rs))
	out := &FlowSummary{Flows: slices.Clone(rs[0].FlowControl.Flows)}
	for i := range out.Flows {
		out.Flows[i] = FlowResult{Flow: out.Flows[i].Flow, Priority: out.Flows[i].Priority, Tenant: out.Flows[i].Tenant}
	}
	nf := len(out.Flows)
	tasks, shed, expired, saturated := make([]float64, nf), make([]float64, nf), make([]float64, nf), make([]float64, nf)
	for _, r := range rs {
		fs := r.FlowControl
		out.Inversions += fs.Inversions
		out.ShedInversions += fs.ShedInversions
		out.StartedLate += fs.StartedLate
		out.ShedOrExpiredSheddable += fs.ShedOrExpiredSheddable / n
		for i, f := range fs.Flows {
			o := &out.Flows[i]
			tasks[i] += float64(f.Tasks) / n
			shed[i] += float64(f.Shed) / n
			expired[i] += float64(f.Expired) / n
			saturated[i] += float64(f.Saturated) / n
			o.Success += f.Success / n
			o.VsOracle += f.VsOracle / n
			o.P50Ms += f.P50Ms / n
			o.P95Ms += f.P95Ms / n
			o.P99Ms += f.P99Ms / n
			o.WithinDeadline += f.WithinDeadline / n
			o.Share += f.Share / n
		}
	}
	for i := range out.Flows {
		o := &out.Flows[i]
		o.Tasks, o.Shed = int(math.Round(tasks[i])), int(math.Round(shed[i]))
		o.Expired, o.Saturated = int(math.Round(expired[i])), int(math.Round(saturated[i]))
	}
	return out
}

// writeFlows writes, for a scenario with flows, a table per policy of the
// figures per flow.
func (r *Report) writeFlows(w io.Writer) error {
	for i := range r.Results {
		res := &r.Results[i]
		fs := res.FlowControl
		if fs == nil {
			continue
		}
		if _, err := fmt.Fprintf(w, "\n%s: flow control, %d inversions, %d shedding inversions, %d attempts started after their deadline, %.1f%% of shed or expired tasks sheddable\n",
			res.Policy, fs.Inversions, fs.ShedInversions, fs.StartedLate, fs.ShedOrExpiredSheddable*100); err != nil {
			return err
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "flow\tpriority\ttenant\ttasks\tsuccess %\tvs oracle\tp50 ms\tp95 ms\tp99 ms\tshed\texpired\tsaturated\tin deadline %\tshare %\t")
		for _, f := range fs.Flows {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%.2f\t%+.2f\t%.1f\t%.1f\t%.1f\t%d\t%d\t%d\t%.2f\t%.1f\t\n", f.Flow, f.Priority, f.Tenant, f.Tasks,
				f.Success*100, f.VsOracle, f.P50Ms, f.P95Ms, f.P99Ms, f.Shed, f.Expired, f.Saturated, f.WithinDeadline*100, f.Share*100)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}

// Package fairorder is the order in which a dispatcher's held tasks go on:
// strict by priority, start-time fair between tenants by weight inside a
// priority, and no priority inversion inside a candidate set. The
// dispatcher's hold (dispatcher/internal/admission: hold.go) and the simulator
// (dispatcher/internal/simulate/flow.go) both use it, so that what the
// simulator measures is the order the dispatcher applies (the simulator
// used to mirror it, and the copies drifted: it keyed by type only).
//
// It is pure: no clock, no messages, no store, no locks. Its holder locks
// it (the dispatcher's hold does, under the room's mutex) and tells it
// which tasks are held (Count, CountTenant) and which went on (Served).
//
// The rules (docs/policies.md, "Flow control"):
//
//   - Priority first: Sort puts a higher priority before a lower one.
//   - Inside a priority, start-time fair queuing between tenants by
//     weight: a tenant's k-th oldest held task of a priority starts at
//     max(virtual time, the tenant's last finish tag) + (k-1)/weight and
//     finishes 1/weight later; the smallest start goes first, then the
//     smallest finish, then the oldest. The virtual time is the start of
//     the last task that went on (Served), so a tenant that leaves its
//     share unused gives it to the others (work-conserving) and gets no
//     credit for its idle time, and one that floods waits behind its own
//     tasks. Serving the smallest finish tag instead, while the virtual
//     time follows start tags, starved a backlogged low-weight tenant
//     whenever a pass sent one or two tasks: its start fell behind the
//     virtual time and was reset to it, losing its credit (3:1:1 gave
//     72/15/13; issue 20). FinishFirst keeps that order, to measure it.
//   - No inversion: while a task of some priority is held for a candidate
//     set (Key: the type and the allow-list), a task of that set with no
//     higher priority waits behind it (HeldAtLeast), except that a task
//     that goes first (Leads) waits only behind a higher priority.
package fairorder

import (
	"cmp"
	"slices"
	"strings"
	"time"
)

// The priorities, as shared/protocol's MinPriority and MaxPriority (a test
// holds them equal: this package imports nothing that talks to NATS).
const (
	MinPriority = -10
	MaxPriority = 10
	levels      = MaxPriority - MinPriority + 1
)

// Bands of priorities, as shared/topology's BandOf (a test holds them
// equal): tenants are counted per band, as each band has its own consumer.
const (
	BandLow    = -1 // priority < 0: sheddable
	BandNormal = 0
	BandHigh   = 1 // priority > 0
)

// Band is the band of a priority.
func Band(priority int) int {
	switch {
	case priority > 0:
		return BandHigh
	case priority < 0:
		return BandLow
	}
	return BandNormal
}

// Key names a task's candidate set: tasks of one key compete for the same
// slots, so a task must not overtake a held one of its key with a higher
// priority. The type alone when the task allows every model of it.
func Key(typ string, models []string) string {
	if len(models) == 0 {
		return typ
	}
	return typ + "|" + strings.Join(models, ",")
}

// Tags are a held task's start and finish tags in the last Sort.
type Tags struct {
	Start, Finish float64
}

// Item is a held task as Sort sees it.
type Item interface {
	// Fair returns the task's priority, its tenant, when it was first
	// held, and where Sort writes its tags.
	Fair() (priority int, tenant string, since time.Time, tags *Tags)
}

// bandTenant keys the held tasks of one tenant in one band.
type bandTenant struct {
	band   int
	tenant string
}

// Order is a hold's fair order: its clocks and what it holds. The zero
// value is not usable: call New.
type Order struct {
	// FinishFirst serves the smallest finish tag first inside a priority,
	// as the dispatcher did before issue 20's fix: for the simulator to
	// measure that order (default false: the smallest start tag).
	FinishFirst bool

	// counts are the held tasks per candidate key and priority.
	counts map[string]*[levels]int
	// tenants are the held tasks per band and tenant, held their sum.
	tenants map[bandTenant]int
	held    int
	// plain is, per candidate key with held tasks, the priority of the
	// last task sent without the ahead credit (Leads).
	plain map[string]int
	// vtime is the virtual time, last each tenant's last finish tag.
	vtime float64
	last  map[string]float64

	// Sort's scratch, kept from one pass to the next
	flowIdx map[flowKey]int
	flows   []flowRecs
	of      []int
	ages    []time.Duration
	tags    []*Tags
	recs    []rec
}

// New returns an empty order.
func New() *Order {
	return &Order{counts: map[string]*[levels]int{}, tenants: map[bandTenant]int{}, plain: map[string]int{},
		last: map[string]float64{}, flowIdx: map[flowKey]int{}}
}

// Count adds d to the held tasks of the key and priority (the ones that
// hold back lower priorities of their key: the dispatcher leaves out a task
// held over its tenant's quota, which holds back no other tenant's).
func (o *Order) Count(key string, priority, d int) {
	c := o.counts[key]
	if c == nil {
		c = new([levels]int)
		o.counts[key] = c
	}
	c[priority-MinPriority] += d
	if d < 0 && *c == ([levels]int{}) {
		delete(o.counts, key)
		delete(o.plain, key)
	}
}

// CountTenant adds d to the held tasks of the tenant in the priority's
// band.
func (o *Order) CountTenant(priority int, tenant string, d int) {
	k := bandTenant{Band(priority), tenant}
	o.held += d
	if o.tenants[k] += d; o.tenants[k] <= 0 {
		delete(o.tenants, k)
	}
}

// Held is how many tasks the bands hold, every tenant's (CountTenant's
// sum).
func (o *Order) Held() int { return o.held }

// EachTenant calls f with each band and tenant that holds tasks, and how
// many.
func (o *Order) EachTenant(f func(band int, tenant string, n int)) {
	for k, n := range o.tenants {
		f(k.band, k.tenant, n)
	}
}

// TenantHeld is how many tasks of the tenant the band holds.
func (o *Order) TenantHeld(band int, tenant string) int {
	return o.tenants[bandTenant{band, tenant}]
}

// BandHeld reports whether a task of the key with a priority in the
// priority's band is held: a task of that band that leads (Leads) then
// leads tasks of its own band (a quiet tenant's), not only lower bands.
func (o *Order) BandHeld(key string, priority int) bool {
	c := o.counts[key]
	if c == nil {
		return false
	}
	b := Band(priority)
	for i, n := range c {
		if n > 0 && Band(i+MinPriority) == b {
			return true
		}
	}
	return false
}

// HeldAtLeast reports whether a task of the key with at least (strict:
// more than) the priority is held: a task of the key and priority that is
// sent on now would overtake it.
func (o *Order) HeldAtLeast(key string, priority int, strict bool) bool {
	c := o.counts[key]
	if c == nil {
		return false
	}
	from := priority - MinPriority
	if strict {
		from++
	}
	for _, n := range c[from:] {
		if n > 0 {
			return true
		}
	}
	return false
}

// HeldBelow reports whether a task of the key with a priority under the
// given one is held: with 0, a sheddable task, which the shedding order
// ends before a non-sheddable task of its key ends for want of capacity.
func (o *Order) HeldBelow(key string, priority int) bool {
	c := o.counts[key]
	if c == nil {
		return false
	}
	for _, n := range c[:max(0, priority-MinPriority)] {
		if n > 0 {
			return true
		}
	}
	return false
}

// Leads reports whether a task of the key, priority and tenant goes first
// at a node that orders its queue, so that it need not wait in the hold
// for the queue target: tasks of the key are held and none with a higher
// priority, and either the task is new and none of its tenant's is held in
// its band (the first urgent task, or a quiet tenant's: it overtakes the
// held ones), or it is a held one (fromHold) of a higher priority than the
// last task sent on without the credit, which is what fills the nodes'
// queues. A held task of that same priority gets no credit: at the node it
// would wait behind its like.
func (o *Order) Leads(key string, priority int, tenant string, fromHold bool) bool {
	c := o.counts[key]
	if c == nil {
		return false
	}
	for _, n := range c[priority-MinPriority+1:] {
		if n > 0 {
			return false
		}
	}
	if fromHold {
		p, ok := o.plain[key]
		return ok && priority > p
	}
	return o.tenants[bandTenant{Band(priority), tenant}] == 0
}

// SentPlain records the priority of a task of the key sent on without the
// ahead credit, while tasks of the key are held (Leads).
func (o *Order) SentPlain(key string, priority int) {
	if o.counts[key] != nil {
		o.plain[key] = priority
	}
}

// Served advances the clocks: a task of the tenant with these tags (from
// the last Sort) went on.
func (o *Order) Served(tenant string, t Tags) {
	o.last[tenant] = max(o.last[tenant], t.Finish)
	o.vtime = max(o.vtime, t.Start)
}

// keptTenants bounds the tenants whose last tags are kept: beyond it those
// with no credit left are forgotten (they are as new ones).
const keptTenants = 4096

// rec is an item as Sort orders it.
type rec struct {
	age           time.Duration // since the first item's since: the order of since, without its pointer
	start, finish float64
	i             int // its index in q
}

// flowKey is one tenant's tasks of one priority.
type flowKey struct {
	priority int
	tenant   string
}

// flowRecs is a flow's recs in Sort: recs[from:to] of Sort's scratch,
// oldest first, and the next one to merge.
type flowRecs struct {
	flowKey
	from, to, next int
}

// Sort orders q for a pass of the hold: priority descending, then the fair
// order's tags (the package's doc), then age, then the order in q; it sets
// each item's tags. A pass sorts the whole hold, often: so Sort takes each
// tenant's tasks of a priority apart (usually oldest first already) and
// merges those runs by their tags, as the simulator's hold did, rather than
// sort everything twice (which made the simulator's tenant-weights scenario
// ten times slower).
func Sort[T Item](o *Order, q []T, weight func(tenant string) float64) {
	if len(q) == 0 {
		return
	}
	// The flows, and each item's flow.
	clear(o.flowIdx)
	flows := o.flows[:0]
	of, ages, tags := o.of[:0], o.ages[:0], o.tags[:0]
	var ref time.Time
	for i, it := range q {
		p, tenant, since, t := it.Fair()
		if i == 0 {
			ref = since
		}
		k := flowKey{p, tenant}
		f := o.flowOf(flows, k)
		if f < 0 {
			f = len(flows)
			flows = append(flows, flowRecs{flowKey: k})
			switch {
			case len(flows) == fewFlows+1: // from now on by the map
				for g := range flows {
					o.flowIdx[flows[g].flowKey] = g
				}
			case len(flows) > fewFlows+1:
				o.flowIdx[k] = f
			}
		}
		flows[f].to++ // its size, for now
		of, ages, tags = append(of, f), append(ages, since.Sub(ref)), append(tags, t)
	}
	// Each flow's recs together, in q's order, then oldest first.
	n := 0
	for f := range flows {
		size := flows[f].to
		flows[f].from, flows[f].to, flows[f].next = n, n, n
		n += size
	}
	rs := slices.Grow(o.recs[:0], len(q))[:len(q)]
	for i, f := range of {
		rs[flows[f].to] = rec{age: ages[i], i: i}
		flows[f].to++
	}
	for _, fl := range flows {
		run := rs[fl.from:fl.to]
		if !slices.IsSortedFunc(run, byAge) {
			slices.SortStableFunc(run, byAge)
		}
		// Its k-th (from 0) starts k/weight after its first, where its
		// (k-1)-th finishes: computed so, not summed, so that tags equal in
		// exact arithmetic (a weight-3 tenant's fourth start and a weight-1
		// tenant's second) are equal, and the older task goes first, rather
		// than the one rounding favours.
		base, w := max(o.vtime, o.last[fl.tenant]), weight(fl.tenant)
		for k := range run {
			run[k].start, run[k].finish = base+float64(k)/w, base+float64(k+1)/w
		}
	}
	// Priorities high to low; inside one, the flows' runs merged by tags.
	slices.SortFunc(flows, func(a, b flowRecs) int {
		return cmp.Or(cmp.Compare(b.priority, a.priority), cmp.Compare(a.from, b.from))
	})
	// from[k] is the index in q of the k-th in the order (of is free).
	from := of[:0]
	for lo := 0; lo < len(flows); {
		hi := lo + 1
		for hi < len(flows) && flows[hi].priority == flows[lo].priority {
			hi++
		}
		m := merger{o: o, rs: rs, flows: flows[lo:hi]}
		for r := m.first(); r != nil; r = m.next() {
			*tags[r.i] = Tags{Start: r.start, Finish: r.finish}
			from = append(from, r.i)
		}
		lo = hi
	}
	permute(q, from)
	clear(tags) // keep no item alive
	o.flows, o.of, o.ages, o.tags, o.recs = flows[:0], from[:0], ages[:0], tags[:0], rs[:0]
	if len(o.last) > keptTenants {
		for t, v := range o.last {
			if v <= o.vtime {
				delete(o.last, t)
			}
		}
	}
}

// fewFlows is how many flows Sort finds by looking at each (fewer than a
// map's hashing costs); beyond it, by the map.
const fewFlows = 8

// flowOf returns the index of k in flows, or -1.
func (o *Order) flowOf(flows []flowRecs, k flowKey) int {
	if len(flows) > fewFlows {
		if f, ok := o.flowIdx[k]; ok {
			return f
		}
		return -1
	}
	for f := range flows {
		if flows[f].priority == k.priority && flows[f].tenant == k.tenant {
			return f
		}
	}
	return -1
}

// permute puts q[from[k]] at q[k], in place, following each cycle of the
// permutation; from is spent (its entries marked -1).
func permute[T any](q []T, from []int) {
	for k := range from {
		if from[k] < 0 {
			continue
		}
		first := q[k]
		j := k
		for from[j] != k {
			next := from[j]
			q[j] = q[next]
			from[j] = -1
			j = next
		}
		q[j] = first
		from[j] = -1
	}
}

// byAge orders one flow's recs: oldest first, then as in q.
func byAge(a, b rec) int {
	if a.age != b.age {
		return cmp.Compare(a.age, b.age)
	}
	return cmp.Compare(a.i, b.i)
}

// before reports whether a goes before b of the same priority: the smaller
// start tag, then the smaller finish tag (FinishFirst: the smaller finish
// tag only), then the older, then the first in q.
func (o *Order) before(a, b *rec) bool {
	if !o.FinishFirst && a.start != b.start {
		return a.start < b.start
	}
	if a.finish != b.finish {
		return a.finish < b.finish
	}
	return byAge(*a, *b) < 0
}

// merger merges the flows of one priority, each run oldest first and so in
// tag order, by their next recs: by looking at each while they are few,
// else by a heap of them.
type merger struct {
	o     *Order
	rs    []rec
	flows []flowRecs
	heap  []int // flows with recs left, the least next rec first
}

func (m *merger) head(f int) *rec { return &m.rs[m.flows[f].next] }

func (m *merger) less(i, j int) bool { return m.o.before(m.head(m.heap[i]), m.head(m.heap[j])) }

func (m *merger) first() *rec {
	if len(m.flows) <= fewFlows {
		return m.next()
	}
	m.heap = make([]int, 0, len(m.flows))
	for f := range m.flows {
		m.heap = append(m.heap, f)
	}
	for i := len(m.heap)/2 - 1; i >= 0; i-- {
		m.down(i)
	}
	return m.next()
}

// next takes the least next rec of the flows (nil: none left).
func (m *merger) next() *rec {
	if m.heap == nil {
		best := -1
		for f := range m.flows {
			if m.flows[f].next < m.flows[f].to && (best < 0 || m.o.before(m.head(f), m.head(best))) {
				best = f
			}
		}
		if best < 0 {
			return nil
		}
		r := m.head(best)
		m.flows[best].next++
		return r
	}
	if len(m.heap) == 0 {
		return nil
	}
	f := m.heap[0]
	r := m.head(f)
	if m.flows[f].next++; m.flows[f].next == m.flows[f].to {
		last := len(m.heap) - 1
		m.heap[0] = m.heap[last]
		m.heap = m.heap[:last]
	}
	m.down(0)
	return r
}

func (m *merger) down(i int) {
	for {
		l := 2*i + 1
		if l >= len(m.heap) {
			return
		}
		least := l
		if r := l + 1; r < len(m.heap) && m.less(r, l) {
			least = r
		}
		if !m.less(least, i) {
			return
		}
		m.heap[i], m.heap[least] = m.heap[least], m.heap[i]
		i = least
	}
}

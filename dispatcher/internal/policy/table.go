package policy

import (
	"math"
	"slices"
	"sort"
	"sync/atomic"
	"time"

	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/shared/protocol"
)

// Candidate is what a policy sees of one model eligible for a task: its
// statistics over the window, precomputed once per Table, and its live load.
type Candidate struct {
	Model string
	// Successes and Failures are the judged outcomes the estimates below
	// rest on (task errors and expired dispatches say nothing about a model
	// and are left out): the window's, or only the recent buckets' when
	// Shifted.
	Successes, Failures int64
	// Shifted is set when the recent buckets (stats.Series.Recent) and the
	// older part of the window disagree beyond chance: the model changed,
	// so its older record is ignored until the change has passed into the
	// older part too. A model that was reliable for the whole window thus
	// loses the lead after tens of failures, not hundreds.
	Shifted bool
	// Rate is the smoothed success rate, the posterior mean of a Beta(1, 1)
	// prior: (successes+1) / (judged+2). An unmeasured model has 0.5.
	Rate float64
	// Lower is the Wilson 95% lower bound of the success rate (0 with no
	// data): it ranks 970/1000 (0.958) above 3/3 (0.44).
	Lower float64
	// Upper is the Wilson 95% upper bound (1 with no data): a model whose
	// upper bound exceeds the best lower bound may still be the best.
	Upper float64
	// Score is what reliability ranks by: the Wilson lower bound at z=1.28
	// (one-sided 90%; 0 with no data). It still ranks 970/1000 (0.962)
	// above 3/3 (0.65) and 5760/6000 (0.957) above 30/30 (0.948), but lets
	// a better model take the lead after about 40 straight successes
	// instead of 100, which on the simulator's six scenarios lowers the
	// regret of every one (stationary 0.50 -> 0.30 points).
	Score float64
	// P50 and P95 are latency quantiles of successful attempts (0 = no data).
	P50, P95 time.Duration
	// MeanUs is the mean latency of successful attempts in µs (0 = no data).
	MeanUs float64
	// FailMeanUs is the mean latency of failed attempts in µs (0 = no data).
	FailMeanUs float64
	// ExpectedUs is the expected time to a success in µs, charging each
	// failed attempt at least a successful attempt's latency; +Inf when the
	// model has no judged outcome yet.
	ExpectedUs float64
	// Capacity is the summed capacity of the live nodes hosting the model.
	Capacity int
	// CostPerTask and CostPerUnit are the model's declared price
	// (protocol.ModelInfo): the highest any live node announces, so that
	// an inconsistent models file never makes a model look cheaper than
	// it may be. 0 and 0: no declared cost.
	CostPerTask, CostPerUnit float64

	inFlight int64        // from the snapshot
	local    atomic.Int64 // dispatched minus completed by this process since the table was built
}

// Cost is what one attempt of the model costs for a task of the given size.
func (c *Candidate) Cost(size float64) float64 { return c.CostPerTask + c.CostPerUnit*max(size, 0) }

// Priced reports whether the model declares a cost.
func (c *Candidate) Priced() bool { return c.CostPerTask > 0 || c.CostPerUnit > 0 }

// Samples is the number of judged outcomes in the window.
func (c *Candidate) Samples() int64 { return c.Successes + c.Failures }

// InFlight is the snapshot's in-flight count plus this process's dispatches
// since the table was built.
func (c *Candidate) InFlight() int64 { return max(c.inFlight+c.local.Load(), 0) }

// Load is in-flight relative to capacity.
func (c *Candidate) Load() float64 {
	cp := c.Capacity
	if cp < 1 {
		cp = 1
	}
	return float64(c.InFlight()) / float64(cp)
}

// modelState is one model of the table, shared by every type it serves.
type modelState struct {
	Candidate
	breaker stats.Breaker
	probes  atomic.Int64 // half-open probes sent from this table
	pairs   []*pairState // every live (model, node)
}

// nodeState is one live node; its load is shared by all its models.
type nodeState struct {
	name     string
	capacity int
	// inFlight is the work sent to the node and not finished: the larger of
	// what its heartbeat says (running plus queued) and what the snapshot
	// says was dispatched to it and not finished.
	inFlight int64
	// local is dispatched minus completed by this process since the table
	// was built (negative when more finished than it sent).
	local atomic.Int64
	// announced is the work the node's heartbeat said it had (running
	// plus queued), at announcedAt (its SentAt).
	announced   int64
	announcedAt time.Time
	// serviceUs is the mean time an attempt occupies a slot on the node
	// (see serviceTimes).
	serviceUs float64
	// prefetch is how much work beyond capacity the node starts in
	// priority and tenant order (Heartbeat.Prefetch).
	prefetch int64
}

// countFull sets full from the nodes' and pairs' counts.
func (t *Table) countFull() {
	var full int64
	for _, n := range t.nodes {
		if n.inFlight >= int64(n.capacity) {
			full++
		}
	}
	for _, m := range t.models {
		for _, p := range m.pairs {
			if p.limit > 0 && p.sent >= int64(p.limit) {
				full++
			}
		}
	}
	t.full.Store(full)
}

// carryWeight is the weight a table's own reading of a node's work gets
// against the count carried from the table before (Carry).
const carryWeight = 0.25

// Carry starts each node's count from prev's, the table before, instead of
// the snapshot's alone: a weighted mean, carryWeight of the snapshot's and
// the rest what prev counts now (at least one step toward the snapshot's).
// Call it before the table is used.
//
// Why: the snapshot's count of what was dispatched and not finished is
// written by every replica's batcher every 50 ms, so it misses up to that
// much of the dispatches and completions; a 10 ms model's node of 2 slots
// at 40% load read 4 in flight, twice its capacity, for a whole table
// (issue 38). prev's count is exact since prev was built, when every
// replica shares its changes (Shared, internal/loadshare), and its error
// is the snapshot's it started from, weighed down at each table: the
// carried count follows the snapshots with a time constant of about four
// tables (a second at the default 250 ms), so that what no replica
// shared (a killed one's dispatches) is still counted soon. A node prev
// did not have starts from the snapshot; the heartbeat's count still
// bounds it from below (announcedNow).
func (t *Table) Carry(prev *Table, now time.Time) {
	if t == nil || prev == nil {
		return
	}
	for name, n := range t.nodes {
		pn := prev.nodes[name]
		if pn == nil {
			continue
		}
		// a step of at least one toward the snapshot's, so that a small
		// difference is not rounded away for ever
		carried, read := pn.outstanding(), n.inFlight
		step := carryWeight * float64(read-carried)
		if step > 0 {
			step = math.Ceil(step)
		} else {
			step = math.Floor(step)
		}
		n.inFlight = max(carried+int64(step), n.announcedNow(now))
	}
	t.countFull()
}

// announcedNow is what is left at now of the work the node's heartbeat
// announced: its slots finish an attempt every serviceUs/capacity while
// work is queued, so after d at most announced - d*capacity/serviceUs of
// it remains. A heartbeat comes every second (MLSCHED_HEARTBEAT_INTERVAL)
// and the table is rebuilt every snapshot (250 ms): taken as it was, one
// sent in a burst (a 10 ms model's node of 2 slots announcing 6) held every
// table of the next second to it, and with it the node's tasks in the hold
// with its slots idle (issue 38: a 10 ms model's p99 at 40% load 130-300
// ms). The statistics' count of what was dispatched and not finished is
// fresh (every replica's, at each snapshot); the heartbeat stands for work
// they do not know (a Redis restart), which drains like any other. A
// heartbeat dated after now (another host's clock) is taken as it is.
func (n *nodeState) announcedNow(now time.Time) int64 {
	d := now.Sub(n.announcedAt)
	if n.announced == 0 || n.announcedAt.IsZero() || d <= 0 {
		return n.announced
	}
	done := float64(d.Microseconds()) * float64(n.capacity) / max(n.serviceUs, 1)
	return max(n.announced-int64(done), 0)
}

// outstanding is the node's work sent and not finished, now.
func (n *nodeState) outstanding() int64 { return max(n.inFlight+n.local.Load(), 0) }

func (n *nodeState) load() float64 {
	return float64(n.outstanding()+1) / float64(n.capacity)
}

// pairState is one (model, node).
type pairState struct {
	node    *nodeState
	rate    float64 // success rate, smoothed toward the model's
	breaker stats.Breaker
	// inFlight is the snapshot's in-flight count of this (model, node).
	inFlight int64
	probes   atomic.Int64
	// limit is the model's own concurrency limit on the node
	// (ModelInfo.MaxConcurrency; 0: only the node's capacity).
	limit int
	// batch is how many attempts the model runs in one call on the node
	// (ModelInfo.BatchMaxSize; 1 when it does not batch): each of its slots
	// there holds that many attempts (load.go).
	batch int64
	// sent is the larger of the snapshot's and the heartbeat's in-flight
	// count of this (model, node), and local this process's dispatches
	// minus completions since the table: they matter only under a limit.
	sent      int64
	local     atomic.Int64
	serviceUs float64 // mean time an attempt of the model occupies a slot here
	extraUs   float64 // serviceUs minus the model's fastest node's
	judged    float64 // judged attempts of the model on this node in the window
}

func (p *pairState) outstanding() int64 { return max(p.sent+p.local.Load(), 0) }

// typeCand is a model as a candidate for one task type: only the nodes that
// announce the model for that type.
type typeCand struct {
	idx    int // position in its typeEntry's cands
	m      *modelState
	pairs  []*pairState
	closed int // pairs whose breaker is closed
}

type typeEntry struct {
	cands []*typeCand // sorted by model name
	// list is cands as policies see them; plain is set when every
	// candidate's breaker and at least one of its nodes' is closed, so that
	// a task without constraints or history can go straight to the policy.
	list  []*Candidate
	plain bool
	// uniform is set when no pair's breaker is open and every node runs
	// its models as fast as their fastest node: with no node full
	// (Table.full), every candidate is then free, and free holds that.
	uniform bool
	free    []Queue
}

// Table is everything decisions need, precomputed from one statistics
// snapshot and the live nodes, so that a decision reads no store and takes
// no lock. It is immutable apart from atomic local counters.
type Table struct {
	// Taken is when the table was built.
	Taken  time.Time
	types  map[string]*typeEntry
	models map[string]*modelState
	nodes  map[string]*nodeState
	// full counts the nodes without a free slot and the (model, node) at
	// their model's limit, kept current by Dispatched and Completed, so that
	// a decision knows at once when the load model has nothing to say.
	full atomic.Int64
	// share, when set (ShareWith), is told every change this process makes
	// to the counts, for the other replicas (Shared).
	share func(model, node string, d int64)
}

// ShareWith makes the table tell f of every count this process changes
// (Dispatched, Completed), so that f can pass them to the other replicas,
// whose tables take them through Shared. Call it before the table is used.
func (t *Table) ShareWith(f func(model, node string, d int64)) {
	if t != nil {
		t.share = f
	}
}

// Shared applies what another replica dispatched to and settled of a (model,
// node) since it last said (d: dispatched minus settled): without it each
// replica sees only its own dispatches and the outcomes it settles, and its
// count drifts from the node's until the next snapshot. It is not shared
// again.
func (t *Table) Shared(model, node string, d int64) {
	if t == nil || d == 0 {
		return
	}
	t.count(model, node, d)
}

// nodePriorWeight is how many judged outcomes a node's own record must
// have to weigh as much as its model's average: a new node is presumed as
// good as its model's other nodes.
const nodePriorWeight = 10

// NewTable precomputes everything decisions need from a snapshot and the
// live nodes (heartbeats). It is called every snapshot refresh; snap may be
// nil (no statistics yet). Draining nodes are left out.
func NewTable(snap *stats.Snapshot, nodes []protocol.Heartbeat, now time.Time) *Table {
	t := &Table{
		Taken:  now,
		types:  make(map[string]*typeEntry),
		models: make(map[string]*modelState),
		nodes:  make(map[string]*nodeState, len(nodes)),
	}
	hbs := make([]*protocol.Heartbeat, 0, len(nodes))
	for i := range nodes {
		hb := &nodes[i]
		if hb.Draining || hb.Node == "" || t.nodes[hb.Node] != nil {
			continue
		}
		cp := min(hb.Capacity, protocol.MaxCapacity)
		if cp < 1 {
			cp = 1
		}
		running := int64(min(max(hb.InFlight, 0), protocol.MaxQueued))
		queued := int64(min(max(hb.Queued, 0), protocol.MaxQueued))
		t.nodes[hb.Node] = &nodeState{name: hb.Node, capacity: cp, announced: running + queued, announcedAt: hb.SentAt,
			prefetch: int64(min(max(hb.Prefetch, 0), protocol.MaxQueued))}
		hbs = append(hbs, hb)
	}
	sort.Slice(hbs, func(i, j int) bool { return hbs[i].Node < hbs[j].Node })

	var ms func(string) *stats.ModelStats
	ms = func(name string) *stats.ModelStats {
		if snap == nil || snap.Models == nil {
			return nil
		}
		return snap.Models[name]
	}
	// models and pairs
	type tkey struct{ typ, model string }
	tcs := make(map[tkey]*typeCand)
	for _, hb := range hbs {
		ns := t.nodes[hb.Node]
		for _, mi := range hb.Models {
			if mi.Name == "" {
				continue
			}
			m := t.models[mi.Name]
			if m == nil {
				m = newModelState(mi.Name, ms(mi.Name), t.nodes)
				t.models[mi.Name] = m
			}
			if validCost(mi.CostPerTask) && validCost(mi.CostPerUnit) {
				m.CostPerTask, m.CostPerUnit = max(m.CostPerTask, mi.CostPerTask), max(m.CostPerUnit, mi.CostPerUnit)
			}
			p := m.pair(ns)
			if p == nil {
				p = newPairState(m, ns, ms(mi.Name))
				p.limit = min(max(mi.MaxConcurrency, 0), protocol.MaxCapacity)
				p.batch = int64(min(max(mi.BatchMaxSize, 1), protocol.MaxBatchSize))
				p.sent = max(p.inFlight, int64(min(max(mi.InFlight, 0), protocol.MaxQueued)))
				m.pairs = append(m.pairs, p)
				if p.limit > 0 {
					m.Capacity += min(p.limit, ns.capacity) * int(p.batch)
				} else {
					m.Capacity += ns.capacity * int(p.batch)
				}
			}
			for _, typ := range mi.Types {
				k := tkey{typ, mi.Name}
				tc := tcs[k]
				if tc == nil {
					tc = &typeCand{m: m}
					tcs[k] = tc
					te := t.types[typ]
					if te == nil {
						te = &typeEntry{}
						t.types[typ] = te
					}
					te.cands = append(te.cands, tc)
				}
				if !slices.Contains(tc.pairs, p) {
					tc.pairs = append(tc.pairs, p)
					if p.breaker.State == stats.BreakerClosed {
						tc.closed++
					}
				}
			}
		}
	}
	// a node's in-flight is the larger of what it says and what the stats
	// say was dispatched to it and not finished
	sums := make(map[*nodeState]int64)
	for _, m := range t.models {
		for _, p := range m.pairs {
			sums[p.node] += max(p.inFlight, 0)
		}
	}
	for n, s := range sums {
		n.inFlight = s
	}
	serviceTimes(t, ms)
	for _, n := range t.nodes {
		n.inFlight = max(n.inFlight, n.announcedNow(now))
	}
	t.countFull()
	for _, te := range t.types {
		slices.SortFunc(te.cands, func(a, b *typeCand) int {
			if a.m.Model < b.m.Model {
				return -1
			}
			if a.m.Model > b.m.Model {
				return 1
			}
			return 0
		})
		te.plain, te.uniform = true, true
		te.list = make([]*Candidate, len(te.cands))
		te.free = make([]Queue, len(te.cands))
		for i, tc := range te.cands {
			tc.idx = i
			te.free[i] = free
			for _, p := range tc.pairs {
				if p.extraUs != 0 || p.breaker.State == stats.BreakerOpen {
					te.uniform = false
				}
			}
			te.list[i] = &tc.m.Candidate
			if tc.m.breaker.State != stats.BreakerClosed || tc.closed == 0 {
				te.plain = false
			}
		}
	}
	return t
}

// validCost is a cost a heartbeat may carry (the dispatcher validates
// heartbeats; tables built by tests and the simulator are held to it too).
func validCost(c float64) bool { return c >= 0 && c <= protocol.MaxCost }

func (m *modelState) pair(n *nodeState) *pairState {
	for _, p := range m.pairs {
		if p.node == n {
			return p
		}
	}
	return nil
}

func newModelState(name string, st *stats.ModelStats, live map[string]*nodeState) *modelState {
	m := &modelState{}
	m.Model = name
	m.ExpectedUs = math.Inf(1)
	m.Rate = 0.5
	m.Upper = 1
	if st == nil {
		return m
	}
	s := &st.Series
	m.Successes, m.Failures, m.Shifted = estimateCounts(s, liveRecent(st, live))
	m.Rate = smoothed(m.Successes, m.Failures)
	m.Lower, m.Upper = wilson(m.Successes, m.Failures)
	m.Score, _ = wilsonZ(m.Successes, m.Failures, scoreZ)
	m.P50 = s.Latency.Quantile(0.5)
	m.P95 = s.Latency.Quantile(0.95)
	m.MeanUs = meanUs(&s.Latency)
	if f := s.Failures(); f > 0 {
		m.FailMeanUs = float64(max(s.FailLatencySumUs, 0)) / float64(f)
	}
	m.ExpectedUs = expectedUs(m.Successes+m.Failures, m.Rate, m.MeanUs, m.FailMeanUs)
	m.inFlight = max(s.InFlight, 0)
	m.breaker = s.Breaker
	return m
}

func newPairState(m *modelState, n *nodeState, st *stats.ModelStats) *pairState {
	p := &pairState{node: n, rate: m.Rate, batch: 1}
	if st == nil || st.Nodes == nil {
		return p
	}
	s := st.Nodes[n.name]
	if s == nil {
		return p
	}
	succ, fail, _ := estimateCounts(s, s.Recent)
	p.rate = (float64(succ) + nodePriorWeight*m.Rate) / (float64(succ+fail) + nodePriorWeight)
	p.breaker = s.Breaker
	p.inFlight = max(s.InFlight, 0)
	return p
}

// scoreZ is the z-score of Candidate.Score.
const scoreZ = 1.2816

// shiftZ is the z-score of the intervals estimateCounts compares: about
// 99.7% each, so that a stationary model is rarely taken for a changed one
// (a false shift only narrows its estimate to fresher data), while a jump
// from 1% to 40% failures is caught after about 20 recent failures.
const shiftZ = 3.0

// liveRecent is a model's recent counts without those of nodes that are no
// longer live: attempts lost with a crashed node are reported a deadline
// later, all at once, and say nothing about the model on its other nodes.
func liveRecent(st *stats.ModelStats, live map[string]*nodeState) stats.Counts {
	r := st.Recent
	for name, ns := range st.Nodes {
		if ns != nil && live[name] == nil {
			r.Successes -= ns.Recent.Successes
			r.ModelErrors -= ns.Recent.ModelErrors
			r.Timeouts -= ns.Recent.Timeouts
		}
	}
	return r
}

// estimateCounts returns the judged outcomes a series' estimates rest on:
// the window's, or only the recent buckets' (shifted) when the Wilson
// interval of recent and that of the older part of the window do not
// overlap. recent is s.Recent, or a part of it.
func estimateCounts(s *stats.Series, recent stats.Counts) (succ, fail int64, shifted bool) {
	succ, fail = s.Successes, s.Failures()
	os, of := succ-min(max(s.Recent.Successes, 0), succ), fail-min(max(s.Recent.Failures(), 0), fail)
	rs, rf := min(max(recent.Successes, 0), succ), min(max(recent.Failures(), 0), fail)
	if rs+rf == 0 || os+of == 0 {
		return succ, fail, false
	}
	rLo, rHi := wilsonZ(rs, rf, shiftZ)
	oLo, oHi := wilsonZ(os, of, shiftZ)
	if rHi < oLo || rLo > oHi {
		return rs, rf, true
	}
	return succ, fail, false
}

// smoothed is the Beta(1, 1) posterior mean of the success rate.
func smoothed(s, f int64) float64 { return (float64(s) + 1) / (float64(s+f) + 2) }

// wilson is the Wilson score interval at 95%.
func wilson(s, f int64) (lower, upper float64) { return wilsonZ(s, f, 1.959964) }

// wilsonZ is the Wilson score interval for a z-score.
func wilsonZ(s, f int64, z float64) (lower, upper float64) {
	n := float64(s + f)
	if n == 0 {
		return 0, 1
	}
	p := float64(s) / n
	z2 := z * z
	mid := p + z2/(2*n)
	half := z * math.Sqrt(p*(1-p)/n+z2/(4*n*n))
	d := 1 + z2/n
	return max((mid-half)/d, 0), min((mid+half)/d, 1)
}

// meanUs estimates the mean of a latency histogram from bucket midpoints.
func meanUs(h *stats.Histogram) float64 {
	var n int64
	var sum, lo float64
	for i, c := range h {
		hi := float64(stats.BucketBound(i)) / float64(time.Microsecond)
		if c > 0 {
			n += c
			sum += float64(c) * (lo + hi) / 2
		}
		lo = hi
	}
	if n == 0 {
		return 0
	}
	return sum / float64(n)
}

// expectedUs is the expected time to a success when failures are retried:
// one success plus (1-p)/p failed attempts, each charged at least a
// successful attempt's latency, so that failing fast never looks fast.
func expectedUs(judged int64, p, succUs, failUs float64) float64 {
	if judged == 0 {
		return math.Inf(1)
	}
	if succUs == 0 {
		succUs = failUs
	}
	if succUs < 1 {
		succUs = 1
	}
	return succUs + (1-p)/p*max(failUs, succUs)
}

// Dispatched counts a dispatch made from this table, so that load readings
// include it until the next table (whose snapshot then includes it).
func (t *Table) Dispatched(model, node string) {
	if t == nil {
		return
	}
	t.count(model, node, 1)
	if t.share != nil {
		t.share(model, node, 1)
	}
}

// Completed counts an outcome this process received (of any replica's
// dispatch) since the table was built: the slot it held is free again, so
// the load model need not wait for the next snapshot to see it.
func (t *Table) Completed(model, node string) {
	if t == nil {
		return
	}
	t.count(model, node, -1)
	if t.share != nil {
		t.share(model, node, -1)
	}
}

func (t *Table) count(model, node string, d int64) {
	step := int64(1) // a crossing of a capacity counts once, whatever d
	if d < 0 {
		step = -1
	}
	m := t.models[model]
	if m != nil {
		m.local.Add(d)
	}
	n := t.nodes[node]
	if n != nil {
		// count the node in or out of full when it crosses its capacity
		after := n.inFlight + n.local.Add(d)
		if c := int64(n.capacity); (after-d < c) != (after < c) {
			t.full.Add(step)
		}
	}
	if m != nil && n != nil {
		if p := m.pair(n); p != nil {
			after := p.sent + p.local.Add(d)
			if c := int64(p.limit); c > 0 && (after-d < c) != (after < c) {
				t.full.Add(step)
			}
		}
	}
}

// NodeWork is a node's work sent and not finished as the table counts it
// now (the load model's reading), or -1 when the table has no such node.
func (t *Table) NodeWork(node string) int64 {
	if t == nil || t.nodes[node] == nil {
		return -1
	}
	return t.nodes[node].outstanding()
}

// Types returns the task types some live node serves, sorted.
func (t *Table) Types() []string {
	if t == nil {
		return nil
	}
	out := make([]string, 0, len(t.types))
	for k := range t.types {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Candidates returns the models live nodes announce for a task type, sorted
// by name, for inspection (the admin report, the simulator).
func (t *Table) Candidates(taskType string) []*Candidate {
	if t == nil {
		return nil
	}
	te := t.types[taskType]
	if te == nil {
		return nil
	}
	out := make([]*Candidate, len(te.cands))
	for i, tc := range te.cands {
		out[i] = &tc.m.Candidate
	}
	return out
}

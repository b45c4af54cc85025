package policy

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/shared/protocol"
)

// ErrUnknownPolicy is returned by NewEngine for a policy name it does not
// know.
var ErrUnknownPolicy = errors.New("unknown policy")

// ErrInvalidConfig is returned by NewEngine for an out-of-range setting.
var ErrInvalidConfig = errors.New("invalid policy config")

// Names lists every policy name.
var Names = []string{Reliability, Thompson, Latency, LeastLoaded, RoundRobin, Random, Cost}

// DefaultConfig holds the defaults NewEngine applies to zero fields.
var DefaultConfig = Config{
	Default:        Reliability,
	MinSamples:     20,
	ExploreShare:   0.05,
	CostExploreCap: 0.015,
	Timeout:        30 * time.Second,
	Deadline:       40 * time.Second,
	Breaker: BreakerConfig{
		ConsecutiveFailures: 5,
		FailureRate:         0.5,
		MinRequests:         20,
		Cooldown:            10 * time.Second,
		HalfOpenProbes:      3,
	},
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	d := DefaultConfig
	if c.Default == "" {
		c.Default = d.Default
	}
	if c.MinSamples == 0 {
		c.MinSamples = d.MinSamples
	}
	if c.ExploreShare == 0 {
		c.ExploreShare = d.ExploreShare
	}
	if c.CostExploreCap == 0 {
		c.CostExploreCap = d.CostExploreCap
	}
	if c.Deadline == 0 {
		c.Deadline = d.Deadline
	}
	if c.Timeout == 0 {
		c.Timeout = d.Timeout
	}
	b := &c.Breaker
	if b.ConsecutiveFailures == 0 {
		b.ConsecutiveFailures = d.Breaker.ConsecutiveFailures
	}
	if b.FailureRate == 0 {
		b.FailureRate = d.Breaker.FailureRate
	}
	if b.MinRequests == 0 {
		b.MinRequests = d.Breaker.MinRequests
	}
	if b.Cooldown == 0 {
		b.Cooldown = d.Breaker.Cooldown
	}
	if b.HalfOpenProbes == 0 {
		b.HalfOpenProbes = d.Breaker.HalfOpenProbes
	}
	return c
}

// Engine decides, for each task, the model and the node. It holds no
// per-task state; everything it reads comes from a Table. Safe for
// concurrent use.
type Engine struct {
	cfg      Config
	policies map[string]Policy // by name
	def      Policy
	perType  map[string]Policy
	seeded   bool
	seq      atomic.Uint64
	marks    marks                    // half-open marks, see next
	splits   atomic.Pointer[[]*Split] // rollouts' caps (split.go); nil: none
}

// NewEngine validates cfg, fills its defaults and builds the policies.
func NewEngine(cfg Config) (*Engine, error) {
	cfg = cfg.WithDefaults()
	if cfg.CostExploreCap > 1 {
		return nil, fmt.Errorf("%w: cost explore cap %g (want <= 1, negative disables)", ErrInvalidConfig, cfg.CostExploreCap)
	}
	if cfg.ExploreShare > 1 || cfg.LatencyWeight < 0 || cfg.MinSamples < 0 || cfg.Deadline < 0 || cfg.Timeout < 0 {
		return nil, fmt.Errorf("%w: explore share %g (want <= 1, negative disables), latency weight %g (want >= 0), min samples %d (want >= 0), deadline %v, timeout %v (want >= 0)",
			ErrInvalidConfig, cfg.ExploreShare, cfg.LatencyWeight, cfg.MinSamples, cfg.Deadline, cfg.Timeout)
	}
	for typ, bar := range cfg.MinSuccess {
		if !(bar > 0 && bar < 1) { // also refuses NaN
			return nil, fmt.Errorf("%w: min success %g for task type %q: want a share in (0, 1), e.g. 0.99", ErrInvalidConfig, bar, typ)
		}
	}
	b := cfg.Breaker
	if b.ConsecutiveFailures < 0 || b.FailureRate < 0 || b.FailureRate > 1 || b.MinRequests < 0 || b.Cooldown < 0 || b.HalfOpenProbes < 0 {
		return nil, fmt.Errorf("%w: breaker %+v", ErrInvalidConfig, b)
	}
	share := max(cfg.ExploreShare, 0)
	rel := explore{Policy: reliability{}, minSamples: int64(cfg.MinSamples), share: share, optimistic: true}
	relPosterior := rel
	relPosterior.posterior = true
	e := &Engine{
		cfg: cfg,
		policies: map[string]Policy{
			Reliability: relPosterior,
			Cost:        cost{rel: relPosterior, minSamples: int64(cfg.MinSamples), share: share, cap: max(cfg.CostExploreCap, 0)},
			Thompson:    thompson{latencyWeight: cfg.LatencyWeight},
			Latency:     explore{Policy: latency{}, minSamples: int64(cfg.MinSamples), share: share},
			LeastLoaded: leastLoaded{},
			RoundRobin:  &roundRobin{},
			Random:      random{},
		},
		perType: make(map[string]Policy, len(cfg.PerType)),
		seeded:  cfg.Seed != 0,
	}
	e.seq.Store(cfg.Seed)
	var ok bool
	if e.def, ok = e.policies[cfg.Default]; !ok {
		return nil, fmt.Errorf("%w %q as the default (known: %s)", ErrUnknownPolicy, cfg.Default, strings.Join(Names, ", "))
	}
	for typ, name := range cfg.PerType {
		p, ok := e.policies[name]
		if !ok {
			return nil, fmt.Errorf("%w %q for task type %q (known: %s)", ErrUnknownPolicy, name, typ, strings.Join(Names, ", "))
		}
		e.perType[typ] = p
	}
	return e, nil
}

// Config returns the configuration with defaults filled.
func (e *Engine) Config() Config { return e.cfg }

// PolicyFor returns the name of the policy that decides for a task type.
func (e *Engine) PolicyFor(taskType string) string { return e.policyFor(taskType).Name() }

func (e *Engine) policyFor(taskType string) Policy {
	if len(e.perType) > 0 {
		if p, ok := e.perType[taskType]; ok {
			return p
		}
	}
	return e.def
}

// scratch is a decision's working memory, pooled so that Decide allocates
// nothing.
type scratch struct {
	rng   Rand
	load  []Queue     // per candidate of the type (typeCand.idx)
	view  []Queue     // load, or the type's shared all-free figures (read only)
	q     []Queue     // parallel to cands
	base  []*typeCand // allowed and within constraints
	avail []*typeCand // of base, not blocked by a breaker
	sel   []*typeCand
	cands []*Candidate
	pairs []*pairState
	// capped are the candidates a split keeps from this task (split.go)
	capped []*typeCand
	// cost is the cost policy bound to this decision's task (cost.go)
	cost costChoice
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

func (e *Engine) seed() uint64 {
	if e.seeded {
		return splitmix64(e.seq.Add(0x9e3779b97f4a7c15))
	}
	return rand.Uint64()
}

// Decide picks the model, then the node, for one task. Errors are
// *protocol.Error with CodeNoModel, CodeUnknownModel or CodeConstraints
// (CodeInvalidField for a nil request). It is safe for concurrent use, takes
// no lock and allocates nothing. The caller reports the dispatch with
// t.Dispatched.
func (e *Engine) Decide(t *Table, req *Request) (Decision, error) {
	if req == nil {
		return Decision{}, protocol.Errorf(protocol.CodeInvalidField, "no request")
	}
	var te *typeEntry
	if t != nil {
		te = t.types[req.Type]
	}
	if te == nil || len(te.cands) == 0 {
		return Decision{}, errNoModel(req)
	}
	s := scratchPool.Get().(*scratch)
	defer scratchPool.Put(s)
	s.rng.Seed(e.seed())
	pol := e.policyFor(req.Type)
	if req.Cheapest {
		pol = e.policies[Cost]
	}
	if cp, ok := pol.(cost); ok {
		// the cost policy ranks for this task: its bar and its size
		s.cost.cost, s.cost.bar, s.cost.size = cp, e.barFor(req), req.Size
		pol = &s.cost
	}
	budget := e.budgetOf(req)
	saturated := false
	if t.full.Load() == 0 && te.uniform {
		// every node has a free slot and runs its models as fast as their
		// fastest: the load model has nothing to say
		s.view = te.free
	} else {
		s.load = s.load[:0]
		for _, tc := range te.cands {
			q := e.queueOf(tc, budget, req)
			saturated = saturated || q.Saturated
			s.load = append(s.load, q)
		}
		s.view = s.load
	}

	var forced *typeCand
	steered := false
	if sp := e.splits.Load(); sp != nil {
		s.capped = s.capped[:0]
		forced = e.steer(s, te, req, *sp)
		steered = forced != nil || len(s.capped) > 0
	}
	if te.plain && !steered && !saturated && len(req.Models) == 0 && len(req.Tried) == 0 && req.MaxLatencyMs <= 0 && req.MinSuccessRate <= 0 {
		// the common case: no constraint, no history, no breaker in the way,
		// no saturated candidate
		tc := te.cands[pol.Choose(&s.rng, te.list, s.view)]
		return Decision{Model: tc.m.Model, Node: e.chooseNode(s, tc, req, budget, false)}, nil
	}
	s.base = s.base[:0]
	allowed, capped := 0, 0
	for _, tc := range te.cands {
		if !protocol.AllowedBy(req.Models, tc.m.Model) {
			continue
		}
		allowed++
		if !fits(&tc.m.Candidate, req) {
			continue
		}
		if steered && tc != forced && slices.Contains(s.capped, tc) {
			capped++
			continue
		}
		s.base = append(s.base, tc)
	}
	if allowed == 0 {
		return Decision{}, errUnknownModel(te, req)
	}
	if len(s.base) == 0 {
		if capped > 0 {
			return Decision{}, errCapped(te, req, s.capped)
		}
		return Decision{}, errConstraints(te, req)
	}
	if forced != nil {
		// the split's model took this task: it goes there if it can (it
		// fits, its breaker lets it through, it can start in time or
		// nobody else can), else it is kept from it like the others
		i := slices.Index(s.base, forced)
		if i >= 0 && e.usable(forced) {
			sat := s.view[forced.idx].Saturated
			others := false
			for _, tc := range s.base {
				if tc != forced && !s.view[tc.idx].Saturated && e.usable(tc) {
					others = true
					break
				}
			}
			if !sat || !others {
				if forced.m.breaker.State != stats.BreakerHalfOpen || e.takeProbe(forced.m.inFlight, &forced.m.probes) {
					return Decision{Model: forced.m.Model, Node: e.chooseNode(s, forced, req, budget, false), Saturated: sat}, nil
				}
			}
		}
		if i >= 0 && len(s.base) > 1 {
			s.base = slices.Delete(s.base, i, i+1)
		}
	}
	s.avail = s.avail[:0]
	ready := 0
	for _, tc := range s.base {
		if e.usable(tc) {
			s.avail = append(s.avail, tc)
			if !s.view[tc.idx].Saturated {
				ready++
			}
		}
	}
	if len(s.avail) > 0 {
		pool := s.avail
		if ready > 0 && ready < len(s.avail) {
			// Backpressure: no queue that cannot start in time while
			// another candidate can take the task.
			n := 0
			for _, tc := range s.avail {
				if !s.view[tc.idx].Saturated {
					s.avail[n] = tc
					n++
				}
			}
			pool = s.avail[:n]
		}
		if tc := e.chooseModel(s, pol, pool, req, false); tc != nil {
			return Decision{Model: tc.m.Model, Node: e.chooseNode(s, tc, req, budget, false), Saturated: ready == 0}, nil
		}
	}
	// Panic mode: every candidate is blocked by a breaker. Rejecting would
	// turn a breaker into an outage; route among all of them instead.
	tc := e.chooseModel(s, pol, s.base, req, true)
	sat := true
	for _, b := range s.base {
		sat = sat && s.view[b.idx].Saturated
	}
	return Decision{Model: tc.m.Model, Node: e.chooseNode(s, tc, req, budget, true), Panic: true, Saturated: sat}, nil
}

// fits reports whether a candidate meets the task's constraints.
func fits(c *Candidate, req *Request) bool {
	if req.MaxLatencyMs > 0 && c.P95 > time.Duration(req.MaxLatencyMs)*time.Millisecond {
		return false
	}
	if req.MinSuccessRate > 0 && c.Rate < req.MinSuccessRate {
		return false
	}
	return true
}

// probeOK reports whether a half-open breaker has probes left: the limit
// minus what is in flight according to the stats (cluster-wide) minus what
// this table sent since.
func (e *Engine) probeOK(inFlight int64, probes *atomic.Int64) bool {
	return int64(e.cfg.Breaker.HalfOpenProbes)-inFlight-probes.Load() > 0
}

func (e *Engine) takeProbe(inFlight int64, probes *atomic.Int64) bool {
	if probes.Add(1) <= int64(e.cfg.Breaker.HalfOpenProbes)-inFlight {
		return true
	}
	probes.Add(-1)
	return false
}

func (e *Engine) pairUsable(p *pairState) bool {
	switch p.breaker.State {
	case stats.BreakerClosed:
		return true
	case stats.BreakerHalfOpen:
		return e.probeOK(p.inFlight, &p.probes)
	}
	return false
}

// usable reports whether a model's breaker, and at least one of its nodes'
// breakers, let a task through.
func (e *Engine) usable(tc *typeCand) bool {
	m := tc.m
	switch m.breaker.State {
	case stats.BreakerOpen:
		return false
	case stats.BreakerHalfOpen:
		if !e.probeOK(m.inFlight, &m.probes) {
			return false
		}
	}
	if tc.closed > 0 {
		return true
	}
	for _, p := range tc.pairs {
		if e.pairUsable(p) {
			return true
		}
	}
	return false
}

func tried(req *Request, model string) bool {
	for i := range req.Tried {
		if req.Tried[i].Model == model {
			return true
		}
	}
	return false
}

// blamed reports whether an earlier attempt of the task may have failed on
// the model's own account: any but an attempt lost with its node or
// expired before it started, which say nothing of the model: the
// retry may go back to it on another node (issue 39: a node's death is the
// node's fault; a task whose first attempt died with its node was retried
// on two flaky models and exhausted its attempts while the best model had
// other nodes free).
func blamed(req *Request, model string) bool {
	for i := range req.Tried {
		if st := req.Tried[i].Status; req.Tried[i].Model == model && st != protocol.OutcomeNodeLost && st != protocol.OutcomeExpired {
			return true
		}
	}
	return false
}

func triedOn(req *Request, model, node string) bool {
	for i := range req.Tried {
		if req.Tried[i].Model == model && req.Tried[i].Node == node {
			return true
		}
	}
	return false
}

// chooseModel applies failover around the policy: a model not tried yet
// or tried without blame (see blamed) on another node, else a tried model
// that has a node not tried yet, else any. A first
// attempt on a half-open model not tried yet is that model's probe. A retry
// is not: it goes to the model the policy ranks best among those left,
// without exploration and without a half-open model's claim to probes, so
// that a task which already failed is not spent measuring a model that
// recently failed (issue 40: a retry went to a model failing 45% while one
// failing none was free). It returns nil only outside panic mode, when
// half-open probes ran out under it.
func (e *Engine) chooseModel(s *scratch, pol Policy, pool []*typeCand, req *Request, panicking bool) *typeCand {
	if len(req.Tried) > 0 {
		if ex, ok := pol.(explore); ok {
			pol = ex.Policy
		}
		if _, ok := pol.(*costChoice); ok {
			// a retry buys reliability, not savings (docs/policies.md)
			pol = reliability{}
		}
		s.sel = s.sel[:0]
		for _, tc := range pool {
			if !tried(req, tc.m.Model) || !blamed(req, tc.m.Model) && e.hasUntriedNode(tc, req, panicking) {
				s.sel = append(s.sel, tc)
			}
		}
		if tc := e.pick(s, pol, panicking, false); tc != nil {
			return tc
		}
		s.sel = s.sel[:0]
		for _, tc := range pool {
			if e.hasUntriedNode(tc, req, panicking) {
				s.sel = append(s.sel, tc)
			}
		}
		if tc := e.pick(s, pol, panicking, false); tc != nil {
			return tc
		}
	}
	s.sel = append(s.sel[:0], pool...)
	return e.pick(s, pol, panicking, len(req.Tried) == 0)
}

// hasUntriedNode reports whether the model has a usable node the task's
// earlier attempts did not run on it.
func (e *Engine) hasUntriedNode(tc *typeCand, req *Request, panicking bool) bool {
	for _, p := range tc.pairs {
		if !triedOn(req, tc.m.Model, p.node.name) && (panicking || e.pairUsable(p)) {
			return true
		}
	}
	return false
}

// pick runs the policy over s.sel, giving half-open models their probes
// first when probesFirst (a first attempt), and takes the probe of a
// half-open model it returns.
func (e *Engine) pick(s *scratch, pol Policy, panicking, probesFirst bool) *typeCand {
	for len(s.sel) > 0 {
		i := -1
		if !panicking && probesFirst {
			for j, tc := range s.sel {
				if tc.m.breaker.State == stats.BreakerHalfOpen {
					i = j
					break
				}
			}
		}
		if i < 0 {
			s.cands, s.q = s.cands[:0], s.q[:0]
			for _, tc := range s.sel {
				s.cands = append(s.cands, &tc.m.Candidate)
				s.q = append(s.q, s.view[tc.idx])
			}
			i = pol.Choose(&s.rng, s.cands, s.q)
		}
		tc := s.sel[i]
		if panicking || tc.m.breaker.State != stats.BreakerHalfOpen || e.takeProbe(tc.m.inFlight, &tc.m.probes) {
			return tc
		}
		s.sel[i] = s.sel[len(s.sel)-1]
		s.sel = s.sel[:len(s.sel)-1]
	}
	return nil
}

// chooseNode picks among the model's usable nodes, preferring nodes not
// tried yet for this model and half-open nodes owed a probe, and leaving
// out saturated nodes while others are not; then by the power of two
// choices on expected completion time over smoothed success rate.
func (e *Engine) chooseNode(s *scratch, tc *typeCand, req *Request, budget budget, panicking bool) string {
	s.pairs = s.pairs[:0]
	for _, p := range tc.pairs {
		if panicking || e.pairUsable(p) {
			s.pairs = append(s.pairs, p)
		}
	}
	if len(s.pairs) == 0 { // probes ran out under us
		s.pairs = append(s.pairs, tc.pairs...)
	}
	if len(req.Tried) > 0 {
		n := 0
		for _, p := range s.pairs {
			if !triedOn(req, tc.m.Model, p.node.name) {
				s.pairs[n] = p
				n++
			}
		}
		if n > 0 {
			s.pairs = s.pairs[:n]
		}
	}
	if !panicking {
		for _, p := range s.pairs {
			if p.breaker.State == stats.BreakerHalfOpen && e.takeProbe(p.inFlight, &p.probes) {
				return p.node.name
			}
		}
		// keep closed ones only when there are any
		n := 0
		for _, p := range s.pairs {
			if p.breaker.State == stats.BreakerClosed {
				s.pairs[n] = p
				n++
			}
		}
		if n > 0 {
			s.pairs = s.pairs[:n]
		}
	}
	if len(s.pairs) > 1 {
		// no saturated node while another is not
		n := 0
		for _, p := range s.pairs {
			if !p.saturated(budget) {
				s.pairs[n] = p
				n++
			}
		}
		if n > 0 {
			s.pairs = s.pairs[:n]
		}
	}
	ps := s.pairs
	if len(ps) == 1 {
		return ps[0].node.name
	}
	a := ps[s.rng.IntN(len(ps))]
	if len(ps) == 2 {
		return better(a, ps[0], ps[1]).node.name
	}
	j := s.rng.IntN(len(ps) - 1)
	b := ps[j]
	if b == a {
		b = ps[len(ps)-1]
	}
	return better(a, a, b).node.name
}

// better compares two nodes by expected completion time (see
// pairState.cost) divided by success rate; first wins ties.
func better(first, a, b *pairState) *pairState {
	if a != first {
		a, b = b, a
	}
	ca := a.cost() / max(a.rate, 1e-6)
	cb := b.cost() / max(b.rate, 1e-6)
	if cb < ca {
		return b
	}
	return a
}

func errNoModel(req *Request) error {
	if len(req.Models) > 0 {
		return protocol.Errorf(protocol.CodeNoModel, "no live node announces a model for type %q (allow-list: %s)", req.Type, strings.Join(req.Models, ", "))
	}
	return protocol.Errorf(protocol.CodeNoModel, "no live node announces a model for type %q (allow-list: any)", req.Type)
}

func errUnknownModel(te *typeEntry, req *Request) error {
	return protocol.Errorf(protocol.CodeUnknownModel, "no live node announces %s for type %q (available: %s)",
		strings.Join(req.Models, ", "), req.Type, strings.Join(names(te), ", "))
}

func names(te *typeEntry) []string {
	out := make([]string, len(te.cands))
	for i, tc := range te.cands {
		out[i] = tc.m.Model
	}
	sort.Strings(out)
	return out
}

func errCapped(te *typeEntry, req *Request, capped []*typeCand) error {
	var b strings.Builder
	for i, tc := range capped {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(tc.m.Model)
	}
	return protocol.Errorf(protocol.CodeUnknownModel, "for type %q only %s are live and a rollout keeps this task from them (available: %s)",
		req.Type, b.String(), strings.Join(names(te), ", "))
}

func errConstraints(te *typeEntry, req *Request) error {
	var b strings.Builder
	fmt.Fprintf(&b, "no model for type %q meets", req.Type)
	if req.MaxLatencyMs > 0 {
		fmt.Fprintf(&b, " max_latency_ms=%d", req.MaxLatencyMs)
	}
	if req.MinSuccessRate > 0 {
		fmt.Fprintf(&b, " min_success_rate=%g", req.MinSuccessRate)
	}
	b.WriteString(":")
	sep := " "
	for _, tc := range te.cands {
		c := &tc.m.Candidate
		if !protocol.AllowedBy(req.Models, c.Model) {
			continue
		}
		fmt.Fprintf(&b, "%s%s:", sep, c.Model)
		sep = "; "
		why := " "
		if req.MaxLatencyMs > 0 && c.P95 > time.Duration(req.MaxLatencyMs)*time.Millisecond {
			fmt.Fprintf(&b, "%sp95 %dms exceeds max_latency_ms %d", why, c.P95.Milliseconds(), req.MaxLatencyMs)
			why = ", "
		}
		if req.MinSuccessRate > 0 && c.Rate < req.MinSuccessRate {
			fmt.Fprintf(&b, "%ssuccess rate %.3f (%d/%d) below min_success_rate %g", why, c.Rate, c.Successes, c.Samples(), req.MinSuccessRate)
		}
	}
	return protocol.Errorf(protocol.CodeConstraints, "%s", b.String())
}

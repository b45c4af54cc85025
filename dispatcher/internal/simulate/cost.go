package simulate

import (
	"context"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/mlsched/mlsched/dispatcher/internal/policy"
	"github.com/mlsched/mlsched/shared/protocol"
)

// CheapestFallback is the simulator's baseline of LiteLLM's cost-based
// routing with fallbacks: every task goes to the cheapest model first, and
// a failed attempt to the next cheapest not tried yet. It never weighs
// measured success; it only skips a model while it is cooled down, as
// LiteLLM's router cools a deployment down for 5 s once more than half of
// its calls failed, and a node at its concurrency limit (LiteLLM's
// max_parallel_requests). See docs/simulator.md.
const CheapestFallback = "cheapest-fallback"

// CostPolicies are the policies a run adds to its default list when the
// scenario declares a cost: the cost-aware policy and the baseline it is
// measured against. Scenarios without costs run as before.
func CostPolicies() []string { return []string{policy.Cost, CheapestFallback} }

// knownPolicy reports whether a run accepts the policy name.
func knownPolicy(name string) bool {
	return slices.Contains(Policies(), name) || slices.Contains(CostPolicies(), name)
}

// ModelCost is a simulated model's price, as a models file declares it
// (docs/models.md): PerTask for every attempt that starts plus PerUnit for
// each unit of the task's size.
type ModelCost struct {
	PerTask float64 `json:"per_task,omitempty"`
	PerUnit float64 `json:"per_unit,omitempty"`
}

// of is what one attempt costs for a task of the given size (0 without a
// declared cost).
func (c *ModelCost) of(size float64) float64 {
	if c == nil {
		return 0
	}
	return c.PerTask + c.PerUnit*size
}

// taskSize is the size a task is priced at: its trace's size column (0
// without a trace: only per-task prices count).
func taskSize(t *task) float64 { return t.size }

// costed reports whether some model of the scenario declares a cost: only
// then do reports show cost figures, so that every other scenario's output
// stays what it was.
func (sc *Scenario) costed() bool {
	for i := range sc.Models {
		if c := sc.Models[i].Cost; c != nil && (c.PerTask > 0 || c.PerUnit > 0) {
			return true
		}
	}
	return false
}

// validateCosts checks the models' costs (the heartbeat's bounds) and the
// success bars.
func (sc *Scenario) validateCosts() error {
	for i := range sc.Models {
		c := sc.Models[i].Cost
		if c == nil {
			continue
		}
		f := fmt.Sprintf("models[%d].cost", i)
		for _, v := range []struct {
			name string
			x    float64
		}{{"per_task", c.PerTask}, {"per_unit", c.PerUnit}} {
			if !(v.x >= 0 && v.x <= protocol.MaxCost) {
				return invalid(f+"."+v.name, "%g is outside 0..%g", v.x, protocol.MaxCost)
			}
		}
	}
	for typ, bar := range sc.MinSuccess {
		if !(bar > 0 && bar < 1) {
			return invalid("min_success."+typ, "%g: want a share in (0, 1), e.g. 0.99", bar)
		}
		if _, ok := sc.Arrival.Types[typ]; !ok && typ != "*" {
			return invalid("min_success."+typ, "no task type %q in arrival.types (\"*\": every type)", typ)
		}
	}
	return nil
}

// charge adds what an attempt that starts costs to its task.
func (s *sim) charge(a *attempt) {
	if a.t.idx >= len(s.tasks) { // an attempt made up outside a run (tests)
		return
	}
	if a.n == 1 && a.t.step == 0 {
		s.tasks[a.t.idx].firstModel = a.model
	}
	if c := s.models[a.model].Cost; c != nil {
		s.tasks[a.t.idx].cost += c.of(taskSize(a.t))
	}
}

// costPerSuccess is what the run spent per successful task (+Inf when
// none succeeded).
func costPerSuccess(ts []taskResult) float64 {
	var spent float64
	ok := 0
	for i := range ts {
		spent += ts[i].cost
		if ts[i].succeeded {
			ok++
		}
	}
	if ok == 0 {
		return math.Inf(1)
	}
	return spent / float64(ok)
}

// cheapest is the CheapestFallback baseline.
type cheapest struct {
	s    *sim
	live map[string]bool // nodes in the heartbeat bucket at the last refresh
	// coolUntil: a model cooled down is skipped until then
	coolUntil map[string]time.Duration
	order     []string // scratch
}

// Cooldown rule of the baseline, after LiteLLM's router: a model whose
// failures over the store's recent span (the stand-in for LiteLLM's
// current minute) exceed half of at least coolMin judged calls is skipped
// for coolFor.
const (
	coolShare = 0.5
	coolMin   = 5
	coolFor   = 5 * time.Second
)

func newCheapest(s *sim) *cheapest {
	return &cheapest{s: s, live: map[string]bool{}, coolUntil: map[string]time.Duration{}}
}

func (c *cheapest) refresh(ctx context.Context, _ time.Time, nodes []protocol.Heartbeat) error {
	clear(c.live)
	for i := range nodes {
		c.live[nodes[i].Node] = true
	}
	snap, err := c.s.store.Snapshot(ctx)
	if err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	for name, ms := range snap.Models {
		if ms == nil {
			continue
		}
		r := ms.Recent
		judged := r.Successes + r.Failures()
		if judged >= coolMin && float64(r.Failures()) > coolShare*float64(judged) && c.coolUntil[name] <= c.s.now {
			c.coolUntil[name] = c.s.now + coolFor
		}
	}
	return nil
}

func (c *cheapest) completed(string, string) {}

func (c *cheapest) sent(string, string) {}

func (c *cheapest) peek(req *policy.Request) (policy.Decision, error) { return c.decide(req) }

// decide takes the models of the type from the cheapest, those not tried
// by the task first, skipping cooled-down models while another is left,
// and sends the task to the first with a live node that has a free slot
// (the least loaded); when every node of every model is full, the cheapest
// is saturated and the task waits.
func (c *cheapest) decide(req *policy.Request) (policy.Decision, error) {
	s := c.s
	c.order = c.order[:0]
	for i := range s.sc.Models {
		m := &s.sc.Models[i]
		if s.joined[m.Name] && slices.Contains(m.Types, req.Type) && protocol.AllowedBy(req.Models, m.Name) {
			c.order = append(c.order, m.Name)
		}
	}
	if len(c.order) == 0 {
		return policy.Decision{}, errNoCandidate
	}
	size := req.Size
	sort.SliceStable(c.order, func(i, j int) bool {
		a, b := s.models[c.order[i]].Cost.of(size), s.models[c.order[j]].Cost.of(size)
		if a != b {
			return a < b
		}
		return c.order[i] < c.order[j]
	})
	var first *policy.Decision
	for _, pass := range []struct{ untried, cool bool }{{true, true}, {false, true}, {true, false}, {false, false}} {
		for _, m := range c.order {
			if pass.untried && tried(req, m) || pass.cool && c.coolUntil[m] > s.now {
				continue
			}
			n := c.node(m)
			if n == nil {
				continue
			}
			if n.load() < n.spec.Capacity {
				return policy.Decision{Model: m, Node: n.spec.Name}, nil
			}
			if first == nil {
				first = &policy.Decision{Model: m, Node: n.spec.Name, Saturated: true}
			}
		}
	}
	if first == nil {
		return policy.Decision{}, errNoCandidate
	}
	return *first, nil
}

// node is the least loaded live node hosting the model (nil: none).
func (c *cheapest) node(model string) *node {
	var best *node
	for _, n := range c.s.nodes {
		if !c.live[n.spec.Name] || !slices.Contains(n.spec.Models, model) {
			continue
		}
		if best == nil || n.load()*best.spec.Capacity < best.load()*n.spec.Capacity {
			best = n
		}
	}
	return best
}

func tried(req *policy.Request, model string) bool {
	for i := range req.Tried {
		if req.Tried[i].Model == model {
			return true
		}
	}
	return false
}

// costed reports whether the report has cost figures.
func (r *Report) costed() bool {
	for i := range r.Results {
		if r.Results[i].CostPerSuccess != nil {
			return true
		}
	}
	return false
}

// costCell is the cost per success with prec decimals ("-" without one).
func (r *Result) costCell(prec int) string {
	if r.CostPerSuccess == nil {
		return "-"
	}
	return strconv.FormatFloat(*r.CostPerSuccess, 'f', prec, 64)
}

// firstShares is each model's share of the first attempts that started,
// of the tasks submitted after warm-up: one statistics window (window), or
// the first tenth of the tasks if that is shorter.
func firstShares(ts []taskResult, window time.Duration) map[string]float64 {
	warm := window
	if len(ts) > 0 {
		warm = min(warm, ts[len(ts)/10].submit)
	}
	out := map[string]float64{}
	n := 0
	for i := range ts {
		if ts[i].submit < warm || ts[i].firstModel == "" {
			continue
		}
		out[ts[i].firstModel]++
		n++
	}
	for m := range out {
		out[m] /= float64(n)
	}
	return out
}

// writeShares writes, per policy, the models' shares of first attempts
// after warm-up, by name.
func (r *Report) writeShares(w io.Writer) error {
	for i := range r.Results {
		res := &r.Results[i]
		if len(res.FirstShares) == 0 {
			continue
		}
		names := make([]string, 0, len(res.FirstShares))
		for m := range res.FirstShares {
			names = append(names, m)
		}
		sort.Strings(names)
		line := res.Policy + ": first attempts after warm-up:"
		for _, m := range names {
			line += fmt.Sprintf(" %s %.2f%%", m, res.FirstShares[m]*100)
		}
		if _, err := fmt.Fprintln(w, line); err != nil {
			return err
		}
	}
	return nil
}

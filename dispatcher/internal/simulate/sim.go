package simulate

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"time"

	"github.com/mlsched/mlsched/dispatcher/internal/fairorder"
	"github.com/mlsched/mlsched/dispatcher/internal/policy"
	"github.com/mlsched/mlsched/dispatcher/internal/settle"
	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/shared/protocol"
)

// Oracle is the name of the simulator's own policy that knows the true
// failure probabilities at every moment.
const Oracle = "oracle"

// Policies returns every policy name a run accepts, the oracle last.
func Policies() []string {
	return []string{policy.Reliability, policy.Thompson, policy.Latency, policy.LeastLoaded, policy.RoundRobin, policy.Random, Oracle}
}

// ErrUnknownPolicy is returned for a policy name Policies does not list;
// it is policy.ErrUnknownPolicy, so either matches with errors.Is.
var ErrUnknownPolicy = policy.ErrUnknownPolicy

// ErrInvalidOptions is returned for out-of-range Options.
var ErrInvalidOptions = errors.New("invalid simulation options")

// Options configures a run. Zero fields take the defaults shown.
type Options struct {
	// Tasks to simulate, at most MaxTasks (default: the scenario's tasks).
	Tasks int
	// Seed of every random stream (default 1).
	Seed uint64
	// Runs repeats the simulation with seeds Seed, Seed+1, ... and averages
	// the figures (default 1).
	Runs int
	// Policies to run, in order (default: all of Policies(), and
	// CostPolicies() before the oracle when the scenario declares a cost).
	// The oracle is always run as well, since regret is measured against it.
	Policies []string
	// Engine is the policy configuration; its Default is set to the policy
	// under test (default: the zero Config, i.e. the policy defaults).
	Engine policy.Config
	// RecoveryWindow is the rolling window, in tasks, of the recovery
	// measure (default 50).
	RecoveryWindow int
	// Segment is the span of each Result.Timeline entry (default 10s).
	Segment time.Duration
	// RecoveryPoints is how close to the oracle, in percentage points of
	// expected first-attempt success, counts as recovered (default 2).
	RecoveryPoints float64
	// OwnDeadlineBlocks (flow control): a held task that is saturated
	// only because too little of its own deadline is left makes its type
	// saturated for the rest of the hold's pass, as the dispatcher did
	// before issue 20's fix, so a task about to expire holds back the
	// younger ones that could still finish. To measure the old rule
	// (default off: as the dispatcher now does, the pass goes on).
	OwnDeadlineBlocks bool
	// FairByFinishTag (flow control): inside a priority, the hold serves
	// the smallest finish tag first while its virtual time follows start
	// tags, as the dispatcher did before issue 20's fix: a backlogged
	// low-weight tenant's start falls behind the virtual time and its
	// credit is lost (3:1:1 gave 72/15/13). To measure the old order
	// (default off: start-time fair queuing, as the dispatcher now does).
	FairByFinishTag bool
}

func (o Options) withDefaults(sc *Scenario) Options {
	if o.Tasks <= 0 {
		o.Tasks = sc.Tasks
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
	if o.Runs <= 0 {
		o.Runs = 1
	}
	if len(o.Policies) == 0 {
		o.Policies = Policies()
		if sc.costed() {
			o.Policies = slices.Insert(o.Policies, len(o.Policies)-1, CostPolicies()...)
		}
	}
	if o.RecoveryWindow <= 0 {
		o.RecoveryWindow = 50
	}
	if o.Segment <= 0 {
		o.Segment = 10 * time.Second
	}
	if o.RecoveryPoints <= 0 {
		o.RecoveryPoints = 2
	}
	return o
}

// epoch is the simulated clock's origin.
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

type evKind uint8

const (
	evScenario evKind = iota // a scenario event
	evRefresh                // rebuild the table
	evArrival                // the next task arrives
	evDone                   // a running attempt completes
	evDeadline               // a lost attempt's deadline
	evRedecide               // a task found no candidate: try again
	evPass                   // flow control: the hold's next pass (flow.go)
	evExpired                // a node did not start a dispatch it was just sent (nodequeue.go)
)

type event struct {
	at   time.Duration
	seq  uint64
	kind evKind
	a    *attempt
	t    *task
	sc   *Event
}

type eventQueue []*event

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(*event)) }
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	return e
}

type task struct {
	idx      int
	typ      string
	size     float64 // from the trace's size column (trace.go); 0 without
	submit   time.Duration
	history  []protocol.Attempt
	waitFrom time.Duration // when it started waiting for a candidate, -1 if not
	done     bool
	// Flow control (flow.go): the task's flow (-1: the scenario has none),
	// priority, tenant and expiry (submission plus deadline_ms; 0: none).
	flow     int
	priority int
	tenant   string
	expiry   time.Duration
	// while held: until when (its hold time, capped at its expiry), its
	// fair-order tags in the last pass, whether it is in the hold's counts
	until   time.Duration
	tags    fairorder.Tags
	counted bool
	// gone: shed in a pass ahead of a non-sheddable task (shedorder.go)
	gone     bool
	pulled   bool // taken from the stream by a band consumer
	fromPark bool // taken from its parked queue (flow.go)
	// A pipeline (pipeline.go): its steps' types (nil: a plain task), the
	// running step's index (typ is its type, history its attempts) and
	// the attempts of the steps before it.
	steps []string
	step  int
	prior int
}

type attemptState uint8

const (
	stQueued attemptState = iota
	stRunning
	stLost
	stFinished
)

type attempt struct {
	t          *task
	n          int
	model      string
	node       *node
	dispatched time.Duration
	// deadline: the attempt is not started after it (the dispatch
	// deadline, timeout plus slack, capped at the task's own)
	deadline time.Duration
	state    attemptState
	// drawn when it starts
	fail    bool
	timeout bool
	missed  bool // cut short by the dispatch deadline, not the timeout
	latency time.Duration
	// tag orders it on its node while it waits (nodequeue.go)
	tag uint64
	// call is the batch it runs in (nil: alone, or a model that does not
	// batch): its attempts share one slot, freed when the last completes.
	call *simCall
}

// simCall is one batch call of a batching model on a node.
type simCall struct{ left int }

// decider is what a policy run needs from a policy.
type decider interface {
	refresh(ctx context.Context, now time.Time, nodes []protocol.Heartbeat) error
	decide(req *policy.Request) (policy.Decision, error)
	// peek decides without counting a dispatch in the table, and sent
	// counts one: flow control (flow.go) decides, then holds or sends, as
	// the dispatcher does.
	peek(req *policy.Request) (policy.Decision, error)
	sent(model, node string)
	// completed reports an outcome, as the dispatcher reports each outcome
	// it receives to its table.
	completed(model, node string)
}

// sim is one policy's run.
type sim struct {
	sc      *Scenario
	ro      *simRollout // the scenario's rollout (rollout.go); nil: none
	retry   settle.Rules
	opt     Options
	name    string
	now     time.Duration
	q       eventQueue
	seq     uint64
	store   stats.Store
	dec     decider
	nodes   []*node
	byNode  map[string]*node
	models  map[string]*Model
	joined  map[string]bool
	bursts  []*Event
	types   []string
	weights []float64
	wsum    float64
	arrive  *rand.Rand
	pipe    *rand.Rand // the pipelines' draws (pipeline.go); nil: none
	pcg     *rand.PCG
	draw    *rand.Rand

	arrived, finished int
	tasks             []taskResult
	// held are the tasks kept back because every candidate was saturated,
	// oldest first.
	held []*task
	// fc is the flow control of a scenario with flows (flow.go); nil
	// without, and the run is exactly what it was before flow control.
	fc *flowControl
	// size is the size of the task being decided, for the oracle's true
	// failure probability (a model's latency may grow with it)
	size float64
	// log is the request log being written (log.go); nil: none
	log  *runLog
	free []*event       // processed events, for reuse
	rec  [1]stats.Event // Record's batch, reused
}

// taskResult is what the metrics need of one task.
type taskResult struct {
	submit    time.Duration
	latency   time.Duration
	firstOK   bool
	succeeded bool
	attempts  int
	// pFirst is the true failure probability of the first attempt's
	// choice when it was made (1 when it expired in the queue or missed its
	// deadline there); pBest the oracle run's pFirst for the same task.
	pFirst, pBest float64
	firstSet      bool
	// queueFailed: the first attempt expired in a queue or missed its
	// deadline there.
	queueFailed bool
	// Flow control: the task's flow, how it ended (shed, expired, failed
	// saturated) and whether an attempt started past its deadline.
	flow        int
	end         endKind
	startedLate bool
	// cost is what the task's attempts that started cost, firstModel the
	// model of its first attempt that started (cost.go).
	cost       float64
	firstModel string
	// steps is a pipeline's number of steps (0: a plain task), stepsRun
	// how many of them ran.
	steps, stepsRun int
}

func (s *sim) clock() time.Time { return epoch.Add(s.now) }

func (s *sim) eventFor(sc *Event) *event { e := s.newEvent(); e.sc = sc; return e }
func (s *sim) eventA(a *attempt) *event  { e := s.newEvent(); e.a = a; return e }
func (s *sim) eventT(t *task) *event     { e := s.newEvent(); e.t = t; return e }

// newEvent returns a cleared event, reusing processed ones.
func (s *sim) newEvent() *event {
	if n := len(s.free); n > 0 {
		e := s.free[n-1]
		s.free = s.free[:n-1]
		return e
	}
	return &event{}
}

func (s *sim) push(at time.Duration, k evKind, e *event) {
	if e == nil {
		e = s.newEvent()
	}
	e.at, e.kind, e.seq = at, k, s.seq
	s.seq++
	heap.Push(&s.q, e)
}

func newSim(sc *Scenario, opt Options, name string) (*sim, error) {
	s := &sim{sc: sc, retry: settle.Rules{Backoff: sc.RetryBackoff.D(), BackoffMax: sc.RetryBackoffMax.D()},
		opt: opt, name: name, byNode: map[string]*node{}, models: map[string]*Model{}, joined: map[string]bool{}}
	for i := range sc.Models {
		s.models[sc.Models[i].Name] = &sc.Models[i]
		s.joined[sc.Models[i].Name] = true
	}
	for i := range sc.Nodes {
		n := &node{spec: &sc.Nodes[i], alive: true, last: map[nodeFlow]uint64{}, meanRun: map[string]time.Duration{}}
		s.nodes = append(s.nodes, n)
		s.byNode[n.spec.Name] = n
	}
	for i := range sc.Events {
		e := &sc.Events[i]
		switch e.Kind {
		case EventModelJoin:
			s.joined[e.Model] = false
			s.push(e.At.D(), evScenario, s.eventFor(e))
		case EventFailureBurst:
			s.bursts = append(s.bursts, e)
		default:
			s.push(e.At.D(), evScenario, s.eventFor(e))
		}
	}
	for t := range sc.Arrival.Types {
		s.types = append(s.types, t)
	}
	sort.Strings(s.types)
	for _, t := range s.types {
		s.wsum += sc.Arrival.Types[t]
		s.weights = append(s.weights, s.wsum)
	}
	// Streams: 1 = arrivals, shared by every policy; per-attempt draws are
	// keyed by (task, attempt); policies get their own below.
	s.arrive = rand.New(rand.NewPCG(opt.Seed, 1))
	if sc.Pipelines != nil {
		s.pipe = newPipeStream(opt.Seed)
	}
	s.pcg = rand.NewPCG(0, 0)
	s.draw = rand.New(s.pcg)
	s.store = stats.NewMemory(stats.Window{Size: sc.Window.Size.D(), Bucket: sc.Window.Bucket.D(), Recent: sc.Window.Recent.D()}, stats.WithClock(s.clock))
	if len(sc.Arrival.Flows) > 0 {
		s.fc = newFlowControl(sc, opt)
	}
	if name == Oracle {
		s.dec = &oracle{s: s}
		return s, nil
	}
	if name == CheapestFallback {
		s.dec = newCheapest(s)
		return s, nil
	}
	cfg := opt.Engine
	cfg.Default = name
	if cfg.MinSuccess == nil && sc.MinSuccess != nil {
		cfg.MinSuccess = sc.MinSuccess
	}
	if sc.QueueTarget != 0 {
		cfg.QueueTarget = sc.QueueTarget.D()
	}
	cfg.PerType = nil
	d, err := newPolicyDecider(cfg, s.store, opt.Seed)
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", name, err)
	}
	s.dec = d
	if sc.Rollout != nil {
		s.ro = newSimRollout(sc.Rollout, d.eng)
	}
	return s, nil
}

// run simulates n tasks to their final outcome.
func (s *sim) run(ctx context.Context, n int) error {
	defer s.store.Close()
	s.tasks = make([]taskResult, n)
	s.push(0, evRefresh, nil)
	s.push(s.interarrival(), evArrival, nil)
	for steps := 0; s.q.Len() > 0; steps++ {
		if steps&4095 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		e := heap.Pop(&s.q).(*event)
		s.now = e.at
		var err error
		switch e.kind {
		case evScenario:
			s.scenarioEvent(e.sc)
		case evRefresh:
			if s.finished < n {
				err = s.dec.refresh(ctx, s.clock(), s.heartbeats())
				s.push(s.now+s.sc.Refresh.D(), evRefresh, nil)
				if s.ro != nil {
					s.ro.tick(s)
				}
				if err == nil {
					err = s.retryHeld(ctx)
				}
			}
		case evArrival:
			t := &task{idx: s.arrived, submit: s.now, waitFrom: -1, flow: -1}
			if s.sc.trace != nil {
				s.traceTask(t)
			} else {
				t.typ = s.pickType()
				if s.fc != nil {
					s.pickFlow(t)
				}
			}
			if s.pipe != nil {
				s.pickSteps(t)
			}
			s.arrived++
			if s.arrived < n {
				s.push(s.now+s.interarrival(), evArrival, nil)
			}
			if s.fc != nil {
				err = s.intake(ctx, t)
			} else {
				err = s.dispatch(ctx, t)
			}
		case evRedecide:
			err = s.dispatch(ctx, e.t)
		case evDone:
			if e.a.state == stRunning {
				err = s.complete(ctx, e.a)
				if err == nil {
					err = s.retryHeld(ctx)
				}
			}
		case evDeadline:
			if e.a.state == stLost {
				err = s.outcome(ctx, e.a, protocol.OutcomeLost, s.now-e.a.dispatched)
			}
		case evExpired:
			err = s.outcome(ctx, e.a, protocol.OutcomeExpired, 0)
			if err == nil {
				err = s.retryHeld(ctx)
			}
		case evPass:
			if s.now == s.fc.nextPass { // else superseded by an earlier one
				s.fc.nextPass = -1
				err = s.passFlow(ctx)
			}
		}
		*e = event{}
		s.free = append(s.free, e)
		if err != nil {
			return err
		}
		if s.finished == n {
			return nil
		}
	}
	return fmt.Errorf("simulation stalled with %d of %d tasks finished", s.finished, n)
}

// interarrival draws the time to the next arrival of the (piecewise
// constant rate) Poisson process: a draw that crosses a rate step restarts
// there at the new rate, which memorylessness makes exact.
func (s *sim) interarrival() time.Duration {
	if s.sc.trace != nil {
		return s.sc.trace.arrivalAt(s.arrived) - s.now
	}
	at := s.now
	for {
		rate, next := s.rateAt(at)
		d := time.Duration(s.arrive.ExpFloat64() / rate * float64(time.Second))
		if next <= at || at+d < next {
			return at + d - s.now
		}
		at = next
	}
}

// rateAt is the arrival rate at t and when it next changes (0: never).
func (s *sim) rateAt(t time.Duration) (float64, time.Duration) {
	rate, next := s.sc.Arrival.Rate, time.Duration(0)
	for _, st := range s.sc.Arrival.Profile {
		if st.At.D() > t {
			next = st.At.D()
			break
		}
		rate = st.Rate
	}
	return rate, next
}

func (s *sim) pickType() string {
	u := s.arrive.Float64() * s.wsum
	i := sort.SearchFloat64s(s.weights, u)
	if i >= len(s.types) {
		i = len(s.types) - 1
	}
	for s.sc.Arrival.Types[s.types[i]] == 0 && i < len(s.types)-1 {
		i++
	}
	return s.types[i]
}

func (s *sim) scenarioEvent(e *Event) {
	switch e.Kind {
	case EventModelJoin:
		s.joined[e.Model] = true
	case EventNodeCrash:
		n := s.byNode[e.Node]
		if !n.alive {
			return
		}
		n.alive, n.crashedAt = false, s.now
		// Everything on the node is lost: the dispatcher finds out at each
		// attempt's deadline.
		lose := n.crashQueue()
		for _, a := range s.runningOn(n) {
			lose = append(lose, a)
		}
		n.running = 0
		for _, a := range lose {
			s.lose(a)
		}
	case EventNodeRecover:
		n := s.byNode[e.Node]
		if n.alive {
			return
		}
		n.alive, n.startedAt = true, s.now
	}
}

// runningOn lists the running attempts of a node by scanning the queue of
// pending completions (crashes are rare).
func (s *sim) runningOn(n *node) []*attempt {
	var out []*attempt
	for _, e := range s.q {
		if e.kind == evDone && e.a.node == n && e.a.state == stRunning {
			out = append(out, e.a)
		}
	}
	slices.SortFunc(out, func(a, b *attempt) int { return a.t.idx*16 + a.n - (b.t.idx*16 + b.n) })
	return out
}

// deadline is how long after its dispatch an attempt may still start: the
// dispatcher's dispatch deadline, timeout plus slack.
func (s *sim) deadline() time.Duration { return s.sc.Timeout.D() + s.sc.DeadlineSlack.D() }

// lose marks an attempt that will never answer; the dispatcher's sweeper
// declares it lost once its deadline and the sweep grace have passed.
func (s *sim) lose(a *attempt) {
	a.state = stLost
	at := a.deadline + s.sc.LostGrace.D()
	if at < s.now {
		at = s.now
	}
	s.push(at, evDeadline, s.eventA(a))
}

// heartbeats is what the node bucket holds now: live nodes, and crashed
// ones whose entry has not expired yet.
func (s *sim) heartbeats() []protocol.Heartbeat {
	hbs := make([]protocol.Heartbeat, 0, len(s.nodes))
	for _, n := range s.nodes {
		if !n.alive && s.now-n.crashedAt >= s.sc.NodeTTL.D() {
			continue
		}
		hb := protocol.Heartbeat{
			Node:      n.spec.Name,
			Capacity:  n.spec.Capacity,
			Prefetch:  max(s.sc.Prefetch, 0), // its ordered room: policy.Request.Ahead's credit
			InFlight:  n.running,
			Queued:    n.queued(),
			StartedAt: epoch.Add(n.startedAt),
			SentAt:    s.clock(),
		}
		if !n.alive {
			hb.InFlight, hb.Queued = 0, 0
			hb.SentAt = epoch.Add(n.crashedAt)
		}
		for _, m := range n.spec.Models {
			if s.joined[m] {
				mi := protocol.ModelInfo{Name: m, Types: s.models[m].Types, TimeoutMs: s.sc.Timeout.D().Milliseconds()}
				if c := s.models[m].Cost; c != nil {
					mi.CostPerTask, mi.CostPerUnit = c.PerTask, c.PerUnit
				}
				if b := s.models[m].Batch; b != nil {
					mi.BatchMaxSize = b.MaxSize
				}
				hb.Models = append(hb.Models, mi)
			}
		}
		if len(hb.Models) > 0 {
			hbs = append(hbs, hb)
		}
	}
	return hbs
}

// failProb is the true probability that an attempt of model m started now
// fails: its profile, raised by any burst, and the chance that it is too
// slow for the timeout.
func (s *sim) failProb(m string) float64 {
	st := s.models[m].step(s.now)
	p := *st.FailureProb
	for _, b := range s.bursts {
		if s.now >= b.At.D() && s.now < b.Until.D() && (len(b.Models) == 0 || slices.Contains(b.Models, m)) {
			p = math.Max(p, b.FailureProb)
		}
	}
	slow := st.exceed(s.sc.Timeout.D(), s.size)
	return 1 - (1-p)*(1-slow)
}

// attemptFailProb is the true probability that an attempt of model m
// started now on node n fails: failProb with the node's slowdown applied to
// the timeout share, or 1 when the node is dead.
func (s *sim) attemptFailProb(m string, n *node) float64 {
	if !n.alive {
		return 1
	}
	if n.spec.Slowdown == 1 {
		return s.failProb(m)
	}
	st := s.models[m].step(s.now)
	p := *st.FailureProb
	for _, b := range s.bursts {
		if s.now >= b.At.D() && s.now < b.Until.D() && (len(b.Models) == 0 || slices.Contains(b.Models, m)) {
			p = math.Max(p, b.FailureProb)
		}
	}
	slow := st.exceed(time.Duration(float64(s.sc.Timeout.D())/n.spec.Slowdown), s.size)
	return 1 - (1-p)*(1-slow)
}

// firstFailProb is the probability that a task's first attempt fails: 1
// when no candidate could take it (err), else its model's on its node.
func (s *sim) firstFailProb(d policy.Decision, nd *node, err error) float64 {
	if err != nil {
		return 1
	}
	return s.attemptFailProb(d.Model, nd)
}

// awaitCandidate: no candidate could take the task; it is decided again at
// the next refresh, for up to one timeout, and then fails.
func (s *sim) awaitCandidate(t *task) {
	if t.waitFrom < 0 {
		t.waitFrom = s.now
	}
	if s.now-t.waitFrom >= s.sc.Timeout.D() {
		s.finish(t, false)
		return
	}
	s.push(s.now+s.sc.Refresh.D(), evRedecide, s.eventT(t))
}

func (s *sim) dispatch(ctx context.Context, t *task) error {
	if s.fc != nil {
		return s.dispatchFlow(ctx, t, false)
	}
	n := len(t.history) + 1
	req := &policy.Request{Type: t.typ, Size: t.size, Tried: t.history, Timeout: s.sc.Timeout.D(), Deadline: s.deadline()}
	s.size = t.size
	d, err := s.dec.decide(req)
	nd := s.byNode[d.Node]
	if err == nil && (nd == nil || !slices.Contains(nd.spec.Models, d.Model)) {
		return fmt.Errorf("policy %s chose model %q on node %q, which does not host it", s.name, d.Model, d.Node)
	}
	res := &s.tasks[t.idx]
	if err == nil && d.Saturated {
		// Every candidate's queue is beyond what it can start in time: the
		// dispatcher keeps the task in the task stream and decides again as
		// slots free up, for at most the task's own deadline.
		if t.waitFrom < 0 {
			t.waitFrom = s.now
		}
		if s.now-t.waitFrom >= s.deadline() {
			if n == 1 && !res.firstSet {
				res.firstSet, res.pFirst, res.queueFailed = true, 1, true
			}
			s.finish(t, false)
			return nil
		}
		s.held = append(s.held, t)
		return nil
	}
	if n == 1 && !res.firstSet {
		res.firstSet, res.pFirst = true, s.firstFailProb(d, nd, err)
	}
	if err != nil {
		s.awaitCandidate(t)
		return nil
	}
	t.waitFrom = -1
	if s.ro != nil && n == 1 && t.step == 0 {
		s.ro.dispatched(d.Model)
	}
	a := &attempt{t: t, n: n, model: d.Model, node: nd, dispatched: s.now, deadline: s.now + s.deadline()}
	s.rec[0] = stats.Event{Model: a.model, Node: nd.spec.Name, Kind: stats.KindDispatched, At: s.clock()}
	if err := s.store.Record(ctx, s.rec[:]); err != nil {
		return fmt.Errorf("record dispatch: %w", err)
	}
	s.toNode(a)
	return nil
}

// retryHeld decides again for the held tasks, oldest first, until one is
// still saturated.
func (s *sim) retryHeld(ctx context.Context) error {
	if s.fc != nil {
		return s.retryHeldFlow(ctx)
	}
	for len(s.held) > 0 {
		t := s.held[0]
		s.held = s.held[1:]
		if err := s.dispatch(ctx, t); err != nil {
			return err
		}
		if len(s.held) > 0 && s.held[len(s.held)-1] == t {
			// still saturated: back to the head of the line
			copy(s.held[1:], s.held[:len(s.held)-1])
			s.held[0] = t
			return nil
		}
	}
	return nil
}

// start runs an attempt on its node: its outcome and latency are drawn from
// a stream keyed by (seed, task, attempt).
func (s *sim) start(a *attempt) {
	s.prepare(a)
	s.push(s.now+a.latency, evDone, s.eventA(a))
}

// prepare takes a slot for a, draws its outcome and latency, cuts the
// latency at its timeout or deadline, and returns the latency drawn.
func (s *sim) prepare(a *attempt) time.Duration {
	if a.t.expiry > 0 && s.now > a.t.expiry {
		s.tasks[a.t.idx].startedLate = true // never: the attempt's deadline is capped at the task's
	}
	a.state = stRunning
	a.node.running++
	s.charge(a)
	s.pcg.Seed(s.drawSeed(a))
	uFail, uLat := s.draw.Float64(), s.draw.Float64()
	st := s.models[a.model].step(s.now)
	p := *st.FailureProb
	for _, b := range s.bursts {
		if s.now >= b.At.D() && s.now < b.Until.D() && (len(b.Models) == 0 || slices.Contains(b.Models, a.model)) {
			p = math.Max(p, b.FailureProb)
		}
	}
	a.fail = uFail < p
	a.latency = time.Duration(float64(st.Latency.quantile(uLat)) * a.node.spec.Slowdown)
	if st.LatencyPerUnit != nil && *st.LatencyPerUnit > 0 && a.t.size > 0 {
		a.latency = time.Duration(float64(st.Latency.quantile(uLat)+st.sizePart(a.t.size)) * a.node.spec.Slowdown)
	}
	drawn := a.latency
	s.limit(a)
	return drawn
}

// limit cuts a's latency at its timeout or the dispatch deadline,
// whichever comes first: one that started late in a queue may miss the
// deadline.
func (s *sim) limit(a *attempt) {
	limit := min(s.sc.Timeout.D(), a.deadline-s.now)
	if a.latency > limit {
		a.timeout, a.latency = true, limit
		a.missed = limit < s.sc.Timeout.D()
	}
}

func (s *sim) complete(ctx context.Context, a *attempt) error {
	nd := a.node
	if a.call != nil {
		a.call.left--
	}
	if a.call == nil || a.call.left == 0 {
		nd.running-- // a batch's slot is freed by its last attempt
	}
	if !a.timeout && !a.fail {
		nd.observeRun(a.model, a.latency) // before its slot is given on, as the worker's run
	}
	// Free slot: start the best waiting attempt, skipping those past their
	// deadline, or too close to it, as the worker would (expired).
	expired := s.startQueued(nd)
	var err error
	switch {
	case a.timeout:
		err = s.outcome(ctx, a, protocol.OutcomeTimeout, a.latency)
	case a.fail:
		err = s.outcome(ctx, a, protocol.OutcomeModelError, a.latency)
	default:
		err = s.outcome(ctx, a, protocol.OutcomeSuccess, a.latency)
	}
	for _, x := range expired {
		if err != nil {
			break
		}
		err = s.outcome(ctx, x, protocol.OutcomeExpired, 0)
	}
	return err
}

// outcome records how an attempt ended and fails over or finishes the task,
// by the dispatcher's own rule (settle.Settle).
func (s *sim) outcome(ctx context.Context, a *attempt, st protocol.OutcomeStatus, lat time.Duration) error {
	a.state = stFinished
	t := a.t
	d := protocol.Dispatch{Model: a.model, Node: a.node.spec.Name, Attempt: a.n, MaxAttempts: s.sc.MaxAttempts}
	o := protocol.Outcome{Model: a.model, Node: a.node.spec.Name, Attempt: a.n, Status: st}
	// A task past its own deadline is not retried (settle: CodeExpired),
	// nor one its node did not start because that deadline (the attempt's,
	// capped at it) left too little time (internal/outcome).
	expired := t.expiry > 0 && (s.now >= t.expiry || st == protocol.OutcomeExpired && a.deadline >= t.expiry) &&
		st != protocol.OutcomeSuccess && st != protocol.OutcomeTaskError
	dec := settle.Settle(s.retry, d, o, settle.State{Expired: expired})
	s.rec[0] = stats.Event{Model: a.model, Node: a.node.spec.Name, Kind: dec.Kind, Latency: lat, At: s.clock()}
	if err := s.store.Record(ctx, s.rec[:]); err != nil {
		return fmt.Errorf("record outcome: %w", err)
	}
	if s.log != nil {
		s.log.attempt(t, a, st, lat)
	}
	t.history = append(t.history, protocol.Attempt{Attempt: a.n, Model: a.model, Node: a.node.spec.Name, Status: st, LatencyMs: float64(lat) / float64(time.Millisecond)})
	s.dec.completed(a.model, a.node.spec.Name)
	if a.n == 1 && t.step == 0 { // a task's first attempt: a pipeline's first step's
		if s.ro != nil {
			s.ro.observed(t.idx, a.model, dec.Kind)
		}
		r := &s.tasks[t.idx]
		r.firstOK = st == protocol.OutcomeSuccess
		// An attempt that expired in a queue or missed its deadline there
		// failed because of where it was sent: it counts in full.
		if st == protocol.OutcomeExpired || a.missed {
			r.pFirst = 1
			r.queueFailed = true
		}
	}
	switch dec.Action {
	case settle.Finish, settle.DeadLetter:
		if dec.Status == protocol.StatusSucceeded && t.step+1 < len(t.steps) {
			s.nextStep(t) // a pipeline goes on
			return s.dispatch(ctx, t)
		}
		if dec.Code == protocol.CodeExpired {
			s.tasks[t.idx].end = endExpired
		}
		s.finish(t, dec.Status == protocol.StatusSucceeded)
	case settle.Retry:
		if dec.Backoff > 0 {
			s.push(s.now+dec.Backoff, evRedecide, s.eventT(t))
			return nil
		}
		return s.dispatch(ctx, t)
	}
	return nil
}

func (s *sim) finish(t *task, ok bool) {
	if t.done {
		return
	}
	t.done = true
	r := &s.tasks[t.idx]
	r.submit, r.latency, r.succeeded, r.attempts = t.submit, s.now-t.submit, ok, t.prior+len(t.history)
	r.flow = t.flow
	if len(t.steps) > 0 {
		r.steps, r.stepsRun = len(t.steps), t.step+1
	}
	s.finished++
	if s.fc != nil {
		s.finishedFlow(t)
	}
}

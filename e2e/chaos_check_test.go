package e2e

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/worker/model"
)

// This file holds the pure parts of the chaos test: the seeded fault schedule
// and the verdict on the results. They are unit-tested on their own
// (chaos_unit_test.go) so that the invariants the chaos run relies on are
// known to catch violations.

// faultKind is one kind of fault the chaos test injects.
type faultKind string

const (
	faultKillWorker     faultKind = "kill-worker"     // kill -9 one worker, restart it after Down
	faultKillDispatcher faultKind = "kill-dispatcher" // kill -9 one dispatcher, restart it after Down
	faultRestartNATS    faultKind = "restart-nats"    // stop nats-server, start it after Down (same port and store)
	faultRestartRedis   faultKind = "restart-redis"   // stop redis-server, start it after Down (its data is lost)
	// kill -9 nats-server, start it after Down (same port and store): the
	// dispatch and outcome streams are in memory (MLSCHED_ATTEMPT_STORAGE's
	// default) and lost, and every attempt in flight with them; the tasks,
	// unacknowledged in MLSCHED_TASKS until their results, are not.
	faultKillNATS faultKind = "kill-nats"
)

var faultKinds = []faultKind{faultKillWorker, faultKillDispatcher, faultRestartNATS, faultRestartRedis, faultKillNATS}

// Faults of one server of a NATS cluster (TestChaosCluster).
const (
	faultKillNATSNode      faultKind = "kill-nats-node"       // kill -9 one server, start it after Down (same ports and store)
	faultPauseNATSNode     faultKind = "pause-nats-node"      // SIGSTOP one server for Down (longer than the Raft election timeout), then SIGCONT
	faultPartitionNATSNode faultKind = "partition-nats-node"  // cut one server off from its peers and its clients for Down, then heal
	faultRollingNATS       faultKind = "rolling-restart-nats" // restart every server in turn, each once the cluster is healthy again
	// faultRegistryOutage partitions the server that leads the node
	// registry (MLSCHED_NODES) for registryOutage: every node's heartbeat
	// stops reaching the bucket at once, the outage issue 39 asks the
	// dispatchers to tell from an absence (tasks wait, none is refused).
	faultRegistryOutage faultKind = "registry-outage"
)

// registryOutage is how long the registry's leader stays cut off (issue 39:
// 20 s, longer than the cluster run's node TTL).
const registryOutage = 20 * time.Second

// clusterFaultKinds are the faults of the NATS-cluster chaos run: the
// server faults plus the usual worker and dispatcher kills.
var clusterFaultKinds = []faultKind{faultKillWorker, faultKillDispatcher,
	faultKillNATSNode, faultPauseNATSNode, faultPartitionNATSNode, faultRollingNATS, faultRegistryOutage}

// raftElectionTimeoutMax is nats-server's longest Raft election timeout
// (server/raft.go, maxElectionTimeoutDefault): a pause longer than it makes
// the other servers elect new leaders for the paused one's groups.
const raftElectionTimeoutMax = 9 * time.Second

// fault is one entry of the schedule.
type fault struct {
	// At is when it starts, from the start of the run.
	At   time.Duration
	Kind faultKind
	// Target indexes the workers or dispatchers (unused for servers).
	Target int
	// Down is how long the process stays down before it is started again.
	Down time.Duration
}

func (f fault) String() string {
	target := ""
	switch f.Kind {
	case faultKillWorker:
		target = fmt.Sprintf(" worker#%d", f.Target)
	case faultKillDispatcher:
		target = fmt.Sprintf(" dispatcher#%d", f.Target)
	case faultKillNATSNode, faultPauseNATSNode, faultPartitionNATSNode:
		target = fmt.Sprintf(" nats#%d", f.Target)
	}
	return fmt.Sprintf("t+%.1fs %s%s down %.1fs", f.At.Seconds(), f.Kind, target, f.Down.Seconds())
}

// chaosSchedule draws the faults of a run from seed: rounds × the five kinds
// (in a random order per round), one per equal slot of [10%, 85%] of window
// at a random moment in its slot, so that faults follow each other and fall
// while tasks are still being submitted. A worker stays down 1-6s: beyond
// the 3s dispatch deadline (1s timeout + 2s slack), what was routed to it
// before its heartbeat expired is lost and must be failed over.
func chaosSchedule(seed int64, rounds int, window time.Duration, workers, dispatchers int) []fault {
	return chaosScheduleOf(faultKinds, seed, rounds, window, workers, dispatchers, 1)
}

// chaosScheduleOf is chaosSchedule for the given fault kinds; natsNodes is
// the size of the NATS cluster the server faults pick from. A killed server
// stays down 1-4s, a paused one 1-5s longer than the Raft election timeout,
// a partitioned one 5-15s.
func chaosScheduleOf(kinds []faultKind, seed int64, rounds int, window time.Duration, workers, dispatchers, natsNodes int) []fault {
	rng := rand.New(rand.NewPCG(uint64(seed), 0x63686130732d7363))
	faultKinds := kinds
	n := rounds * len(faultKinds)
	from, span := window/10, window*3/4
	slot := span / time.Duration(max(n, 1))
	between := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(rng.Int64N(int64(hi-lo)+1)) }
	var out []fault
	for r := 0; r < rounds; r++ {
		kinds := append([]faultKind(nil), faultKinds...)
		rng.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
		for _, k := range kinds {
			i := len(out)
			f := fault{Kind: k, At: from + time.Duration(i)*slot + between(0, slot*3/4)}
			switch k {
			case faultKillWorker:
				f.Target, f.Down = rng.IntN(workers), between(time.Second, 6*time.Second)
			case faultKillDispatcher:
				f.Target, f.Down = rng.IntN(dispatchers), between(500*time.Millisecond, 4*time.Second)
			case faultRestartNATS, faultKillNATS:
				f.Down = between(200*time.Millisecond, 2*time.Second)
			case faultRestartRedis:
				f.Down = between(300*time.Millisecond, 2000*time.Millisecond)
			case faultKillNATSNode:
				f.Target, f.Down = rng.IntN(natsNodes), between(time.Second, 4*time.Second)
			case faultPauseNATSNode:
				f.Target, f.Down = rng.IntN(natsNodes), between(raftElectionTimeoutMax+time.Second, raftElectionTimeoutMax+5*time.Second)
			case faultPartitionNATSNode:
				f.Target, f.Down = rng.IntN(natsNodes), between(5*time.Second, 15*time.Second)
			case faultRegistryOutage:
				f.Down = registryOutage // the target is whichever server leads the bucket then
			}
			out = append(out, f)
		}
	}
	return out
}

// healthyMaxFailure is the definition of a healthy model: one whose attempts
// fail (model error or hang) at most this often by its models file, and that
// has at least one hosting node up (see outage).
const healthyMaxFailure = 0.10

// chaosModel is a model of the chaos cluster as the models files define it.
type chaosModel struct {
	Name string
	// FailRate is the share of attempts that fail: model errors plus hangs.
	FailRate float64
	// TaskErrorRate is the share of attempts ending in a task error.
	TaskErrorRate float64
	Nodes         []string
}

// loadChaosModels reads testdata/chaos/<node>.yaml of every node.
func loadChaosModels(dir string, nodes []string) (map[string]*chaosModel, error) {
	out := map[string]*chaosModel{}
	for _, node := range nodes {
		specs, err := model.LoadFile(filepath.Join(dir, node+".yaml"))
		if err != nil {
			return nil, err
		}
		for _, s := range specs {
			if s.Sim == nil {
				return nil, fmt.Errorf("%s: model %s is not simulated", node, s.Name)
			}
			fail := s.Sim.FailureRate + s.Sim.TimeoutRate
			m := out[s.Name]
			if m == nil {
				m = &chaosModel{Name: s.Name, FailRate: fail, TaskErrorRate: s.Sim.TaskErrorRate}
				out[s.Name] = m
			} else if m.FailRate != fail || m.TaskErrorRate != s.Sim.TaskErrorRate {
				return nil, fmt.Errorf("model %s behaves differently on %s", s.Name, node)
			}
			m.Nodes = append(m.Nodes, node)
		}
	}
	return out, nil
}

// outage is a worker node being down: from its kill until its restarted
// worker's first heartbeat.
type outage struct {
	Node     string
	From, To time.Time
}

// healthyModels returns the healthy models at t other than except: failure
// rate at most healthyMaxFailure and a hosting node that is not in an outage.
func healthyModels(models map[string]*chaosModel, outages []outage, t time.Time, except string) []string {
	down := map[string]bool{}
	for _, o := range outages {
		if !t.Before(o.From) && !t.After(o.To) {
			down[o.Node] = true
		}
	}
	var out []string
	for name, m := range models {
		if name == except || m.FailRate > healthyMaxFailure {
			continue
		}
		for _, n := range m.Nodes {
			if !down[n] {
				out = append(out, name)
				break
			}
		}
	}
	sort.Strings(out)
	return out
}

// taskKind says what a submission is and so which final state it must reach.
type taskKind int

const (
	kindGood     taskKind = iota // a valid task: succeeded, or failed by the rules
	kindRejected                 // valid JSON with an id, published on the wrong type's subject: rejected
	kindNoID                     // no id: cannot have a result, must be dead-lettered
)

// chaosTask is one submission of the chaos run.
type chaosTask struct {
	ID   string // "" for kindNoID
	Type string // the task's type (kindRejected is published on the other type's subject)
	Kind taskKind
	// MsgID is the Nats-Msg-Id of the submission (the id, or a made-up one
	// for a task without id) so that a retried submit is deduplicated.
	MsgID string
	// Raw is the published body of a bad submission.
	Raw []byte
	// Pipe, for a pipeline task (kindGood), is the kind its payload carries
	// ("x" or "y"), which chaosPipeline's switch routes on.
	Pipe string
}

// chaosPipeline is the chaos run's pipeline on the chaos models' own types
// (every model serves both): a first step of the task's type, a switch on
// the kind it echoes (x: classify, y: embed), then an ensemble of two
// members run in parallel (embed and classify), whose outputs the last to
// end merges. Four steps, each with the dispatchers' attempts and timeout.
func chaosPipeline(first string) *protocol.Pipeline {
	return &protocol.Pipeline{Steps: []protocol.PipelineStep{
		{Name: "first", Type: first},
		{Name: "route", Switch: &protocol.Switch{On: "$.echo.kind", Cases: []protocol.SwitchCase{
			{Equals: json.RawMessage(`"x"`), Next: "sx"}, {Equals: json.RawMessage(`"y"`), Next: "sy"}}}},
		{Name: "sx", Type: "classify", Input: "echo", Next: "last"},
		{Name: "sy", Type: "embed", Input: "echo"},
		{Name: "last", Input: "echo", Ensemble: []protocol.PipelineStep{{Name: "e1", Type: "embed"}, {Name: "e2", Type: "classify"}}},
	}}
}

// chaosRoute is the steps a chaos pipeline of that kind runs, in the
// order of its records (an ensemble's members in member order).
func chaosRoute(kind string) []string {
	if kind == "y" {
		return []string{"first", "sy", "e1", "e2"}
	}
	return []string{"first", "sx", "e1", "e2"}
}

// chaosEnsemble is the members of chaosPipeline's ensemble, and chaosRoute's
// index of its first.
var chaosEnsemble, chaosEnsembleAt = []string{"e1", "e2"}, 2

// verdict summarises the results and lists every broken rule.
type verdict struct {
	Succeeded, Failed, FailedExhausted, FailedTaskError, Rejected int
	// Pipelines counts the pipeline tasks' results (not in the counts
	// above): succeeded, failed at a step that exhausted its attempts on
	// its models' own failures, failed at a step's task error.
	Pipelines, PipeSucceeded, PipeFailed, PipeOwnModels, PipeTaskError int
	// PipeSteps counts the steps the pipelines ran.
	PipeSteps int
	// ByFault counts the valid tasks that failed because of a fault
	// (issue 39): a failure with attempts left (whatever was healthy), or
	// attempts exhausted with an attempt lost, lost with its node or
	// expired on the way. Each is also a problem: a run fails on any.
	// OwnModels counts the exhausted tasks whose every attempt failed on
	// the model's own account (a model error or a hang's timeout): the
	// price of flaky models, not of the faults.
	ByFault, OwnModels int
	// Attempts counts attempts per final-attempt status over all results.
	Attempts map[protocol.OutcomeStatus]int
	Problems []string
}

func (v *verdict) problem(format string, a ...any) {
	v.Problems = append(v.Problems, fmt.Sprintf(format, a...))
}

// verifyResults checks the final result of every task with an id:
//   - it exists and names the task;
//   - a good task succeeded or failed, never rejected;
//   - its history is the chain of its attempts: numbered 1..Attempts, on
//     known models, every attempt but the last a retryable failure, the last
//     one matching the result's status;
//   - a failed result either ended in a task error or ran all maxAttempts
//     attempts (attempts exhausted) on its models' own failures: failing
//     with attempts left, or exhausting them through an attempt a fault
//     ended, is a valid task turned away by a fault (issue 39), whatever
//     was healthy then;
//   - a bad task was rejected with type_mismatch, without attempts.
func verifyResults(tasks []chaosTask, results map[string]*protocol.Result, models map[string]*chaosModel,
	outages []outage, maxAttempts int) verdict {
	v := verdict{Attempts: map[protocol.OutcomeStatus]int{}}
	for _, task := range tasks {
		if task.Kind == kindNoID {
			continue
		}
		r := results[task.ID]
		if r == nil {
			v.problem("%s: no final result", task.ID)
			continue
		}
		if r.ID != task.ID || r.Type != task.Type {
			v.problem("%s/%s: result names %s/%s", task.ID, task.Type, r.ID, r.Type)
		}
		if task.Kind == kindRejected {
			if r.Status != protocol.StatusRejected || r.ErrorCode != protocol.CodeTypeMismatch || len(r.History) > 0 {
				v.problem("%s: bad input got %s (%s) with %d attempts, want rejected (%s) without attempts",
					task.ID, r.Status, r.ErrorCode, len(r.History), protocol.CodeTypeMismatch)
			} else {
				v.Rejected++
			}
			continue
		}
		if task.Pipe != "" {
			verifyPipeline(&v, task, r, models, maxAttempts)
			continue
		}
		for _, a := range r.History {
			v.Attempts[a.Status]++
		}
		switch r.Status {
		case protocol.StatusSucceeded:
			v.Succeeded++
			checkHistory(&v, r, models, protocol.OutcomeSuccess)
		case protocol.StatusFailed:
			v.Failed++
			last := lastAttempt(r)
			switch {
			case r.ErrorCode == protocol.CodeTaskError:
				v.FailedTaskError++
				checkHistory(&v, r, models, protocol.OutcomeTaskError)
			case r.ErrorCode == protocol.CodeAttemptsExhausted && r.Attempts == maxAttempts:
				v.FailedExhausted++
				checkHistory(&v, r, models, "")
				if faulty := faultAttempts(r); len(faulty) > 0 {
					v.ByFault++
					v.problem("%s: attempts exhausted because of a fault (attempts %v); history %s", r.ID, faulty, historyString(r))
				} else {
					v.OwnModels++
				}
			default:
				// Failed with attempts left, without a task error: a valid
				// task turned away by a fault, whatever was healthy then.
				v.ByFault++
				v.problem("%s: failed (%s: %s) after %d of %d attempts (healthy then: %v); history %s",
					r.ID, r.ErrorCode, r.Error, r.Attempts, maxAttempts, healthyModels(models, outages, r.FinishedAt, last.Model), historyString(r))
			}
		default:
			v.ByFault++
			v.problem("%s: a valid task got %s (%s: %s); history %s", r.ID, r.Status, r.ErrorCode, r.Error, historyString(r))
		}
	}
	return v
}

// verifyPipeline checks a pipeline task's one result: its steps are the
// route its kind takes (a prefix of it when it failed), each on a known
// model and node within its attempts, the attempts summed; the history is
// the last step's chain of attempts; a failed pipeline names the step it
// stopped at (the last one recorded, failed), with pipeline_error, and
// failed only through that step's task error or its attempts exhausted on
// its models' own failures (anything else is a fault's doing, issue 39).
func verifyPipeline(v *verdict, task chaosTask, r *protocol.Result, models map[string]*chaosModel, maxAttempts int) {
	v.Pipelines++
	v.PipeSteps += len(r.Steps)
	route := chaosRoute(task.Pipe)
	if len(r.Steps) == 0 || len(r.Steps) > len(route) {
		v.problem("%s: pipeline (%s) result with %d steps %+v, want %v", r.ID, r.Status, len(r.Steps), r.Steps, route)
		return
	}
	sum := 0
	for i, s := range r.Steps {
		sum += s.Attempts
		// A failed ensemble member's record follows the steps before the
		// ensemble (its siblings' are not kept).
		member := i == chaosEnsembleAt && i == len(r.Steps)-1 && s.Status != protocol.StatusSucceeded && slices.Contains(chaosEnsemble, s.Name)
		if s.Name != route[i] && !member {
			v.problem("%s: pipeline step %d is %s, want %s (kind %s): %+v", r.ID, i+1, s.Name, route[i], task.Pipe, r.Steps)
		}
		if models[s.Model] == nil || s.Node == "" || s.Attempts < 1 || s.Attempts > maxAttempts {
			v.problem("%s: pipeline step %s: model %q node %q attempts %d", r.ID, s.Name, s.Model, s.Node, s.Attempts)
		}
		if i < len(r.Steps)-1 && s.Status != protocol.StatusSucceeded {
			v.problem("%s: pipeline step %s ended %s yet the pipeline went on: %+v", r.ID, s.Name, s.Status, r.Steps)
		}
	}
	if sum != r.Attempts {
		v.problem("%s: pipeline attempts %d, its steps' sum to %d", r.ID, r.Attempts, sum)
	}
	last := r.Steps[len(r.Steps)-1]
	// The history is the last step's: checked as a task of that many
	// attempts. After an ensemble, the last step is the member that ended
	// last (its model, node and attempts), not the last in member order.
	if r.Status == protocol.StatusSucceeded && last.Ensemble != "" {
		for _, s := range r.Steps {
			if s.Ensemble == last.Ensemble && s.Model == r.Model && s.Node == r.Node && s.Attempts == len(r.History) {
				last = s
				break
			}
		}
	}
	h := *r
	h.Attempts = last.Attempts
	for _, a := range r.History {
		v.Attempts[a.Status]++
	}
	switch r.Status {
	case protocol.StatusSucceeded:
		v.PipeSucceeded++
		if len(r.Steps) != len(route) || r.FailedStep != "" {
			v.problem("%s: pipeline succeeded with steps %+v, failed step %q", r.ID, r.Steps, r.FailedStep)
		}
		checkHistory(v, &h, models, protocol.OutcomeSuccess)
	case protocol.StatusFailed:
		v.PipeFailed++
		if r.FailedStep == "" || r.FailedStep != last.Name || last.Status != protocol.StatusFailed || r.ErrorCode != protocol.CodePipelineError {
			v.problem("%s: failed pipeline names step %q (%s: %s); its last step %s ended %s", r.ID, r.FailedStep, r.ErrorCode, r.Error, last.Name, last.Status)
			return
		}
		if lastAttempt(r).Status == protocol.OutcomeTaskError {
			v.PipeTaskError++
			checkHistory(v, &h, models, protocol.OutcomeTaskError)
			return
		}
		checkHistory(v, &h, models, "")
		switch faulty := faultAttempts(r); {
		case last.Attempts != maxAttempts:
			v.ByFault++
			v.problem("%s: pipeline failed at step %s after %d of %d attempts (%s); history %s", r.ID, last.Name, last.Attempts, maxAttempts, r.Error, historyString(r))
		case len(faulty) > 0:
			v.ByFault++
			v.problem("%s: pipeline step %s exhausted its attempts because of a fault (attempts %v); history %s", r.ID, last.Name, faulty, historyString(r))
		default:
			v.PipeOwnModels++
		}
	default:
		v.ByFault++
		v.problem("%s: a valid pipeline got %s (%s: %s) at step %q; history %s", r.ID, r.Status, r.ErrorCode, r.Error, r.FailedStep, historyString(r))
	}
}

// turnedAwayByFault says whether a valid task's final result is a failure
// or rejection a fault caused (issue 39), and why: anything but a success, a
// task error, or attempts exhausted on the models' own failures alone.
func turnedAwayByFault(r *protocol.Result, maxAttempts int) (why string, byFault bool) {
	switch {
	case r.Status == protocol.StatusSucceeded:
		return "", false
	case r.Status != protocol.StatusFailed:
		return fmt.Sprintf("a valid task got %s (%s: %s)", r.Status, r.ErrorCode, r.Error), true
	case r.ErrorCode == protocol.CodeTaskError:
		return "", false
	case r.ErrorCode == protocol.CodeAttemptsExhausted && r.Attempts == maxAttempts:
		if faulty := faultAttempts(r); len(faulty) > 0 {
			return fmt.Sprintf("attempts exhausted because of a fault (attempts %v)", faulty), true
		}
		return "", false
	}
	return fmt.Sprintf("failed (%s: %s) after %d of %d attempts", r.ErrorCode, r.Error, r.Attempts, maxAttempts), true
}

// faultAttempts are the attempts of r that a fault ended, not its model:
// lost (found at its deadline), lost with its node, or expired waiting.
func faultAttempts(r *protocol.Result) []int {
	var out []int
	for _, a := range r.History {
		switch a.Status {
		case protocol.OutcomeLost, protocol.OutcomeNodeLost, protocol.OutcomeExpired:
			out = append(out, a.Attempt)
		}
	}
	return out
}

// checkHistory checks the chain of attempts. final is the status the last
// attempt must have ("" for any retryable failure).
func checkHistory(v *verdict, r *protocol.Result, models map[string]*chaosModel, final protocol.OutcomeStatus) {
	h := r.History
	if len(h) != r.Attempts || len(h) == 0 {
		v.problem("%s: %s after %d attempts but its history has %d: %s", r.ID, r.Status, r.Attempts, len(h), historyString(r))
		return
	}
	for i, a := range h {
		if a.Attempt != i+1 {
			v.problem("%s: history entry %d is attempt %d: %s", r.ID, i+1, a.Attempt, historyString(r))
			return
		}
		if models[a.Model] == nil {
			v.problem("%s: attempt %d on unknown model %q", r.ID, a.Attempt, a.Model)
		}
		if i < len(h)-1 || final == "" {
			if !a.Status.Retryable() {
				v.problem("%s: attempt %d ended %s yet the task went on: %s", r.ID, a.Attempt, a.Status, historyString(r))
			}
			continue
		}
		if a.Status != final {
			v.problem("%s: %s but its last attempt ended %s: %s", r.ID, r.Status, a.Status, historyString(r))
		}
		if final == protocol.OutcomeSuccess && (a.Model != r.Model || a.Node != r.Node) {
			v.problem("%s: result names %s@%s, its last attempt ran %s@%s", r.ID, r.Model, r.Node, a.Model, a.Node)
		}
	}
}

func lastAttempt(r *protocol.Result) protocol.Attempt {
	if len(r.History) == 0 {
		return protocol.Attempt{}
	}
	return r.History[len(r.History)-1]
}

func historyString(r *protocol.Result) string {
	parts := make([]string, len(r.History))
	for i, a := range r.History {
		parts[i] = fmt.Sprintf("#%d %s@%s %s", a.Attempt, a.Model, a.Node, a.Status)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

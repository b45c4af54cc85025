package e2e

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/mlsched/mlsched/shared/protocol"
)

// The schedule is a function of the seed: the same seed replays the same
// faults, every round has each kind once, and faults follow each other
// inside the window.
func TestChaosSchedule(t *testing.T) {
	t.Parallel()
	const window = 100 * time.Second
	a := chaosSchedule(42, 3, window, 4, 2)
	if b := chaosSchedule(42, 3, window, 4, 2); !reflect.DeepEqual(a, b) {
		t.Fatalf("same seed, different schedules:\n%v\n%v", a, b)
	}
	if c := chaosSchedule(43, 3, window, 4, 2); reflect.DeepEqual(a, c) {
		t.Fatalf("seeds 42 and 43 drew the same schedule %v", a)
	}
	k := len(faultKinds)
	if len(a) != 3*k {
		t.Fatalf("%d faults, want %d", len(a), 3*k)
	}
	for r := 0; r < 3; r++ {
		seen := map[faultKind]int{}
		for _, f := range a[k*r : k*r+k] {
			seen[f.Kind]++
		}
		for _, kind := range faultKinds {
			if seen[kind] != 1 {
				t.Errorf("round %d has %d × %s: %v", r, seen[kind], kind, a[k*r:k*r+k])
			}
		}
	}
	for i, f := range a {
		if f.At < window/10 || f.At > window*85/100 {
			t.Errorf("fault %v outside [10%%, 85%%] of the window", f)
		}
		if i > 0 && f.At <= a[i-1].At {
			t.Errorf("fault %v not after %v", f, a[i-1])
		}
		if f.Down <= 0 || f.Down > 6*time.Second {
			t.Errorf("fault %v: down time out of range", f)
		}
		if (f.Kind == faultKillWorker && f.Target >= 4) || (f.Kind == faultKillDispatcher && f.Target >= 2) || f.Target < 0 {
			t.Errorf("fault %v: no such target", f)
		}
	}
}

// The cluster schedule has each cluster fault once per round, targets one
// of the servers, and pauses a server for longer than the Raft election
// timeout.
func TestChaosClusterSchedule(t *testing.T) {
	t.Parallel()
	const window = 200 * time.Second
	a := chaosScheduleOf(clusterFaultKinds, 7, 2, window, 4, 2, 3)
	if len(a) != 2*len(clusterFaultKinds) {
		t.Fatalf("%d faults, want %d", len(a), 2*len(clusterFaultKinds))
	}
	seen := map[faultKind]int{}
	for _, f := range a {
		seen[f.Kind]++
		switch f.Kind {
		case faultKillNATSNode, faultPauseNATSNode, faultPartitionNATSNode:
			if f.Target < 0 || f.Target >= 3 {
				t.Errorf("fault %v: no such server", f)
			}
			if !strings.Contains(f.String(), "nats#") {
				t.Errorf("fault %v does not name its server", f)
			}
		}
		if f.Kind == faultPauseNATSNode && f.Down <= raftElectionTimeoutMax {
			t.Errorf("fault %v: a pause must outlast the election timeout %v", f, raftElectionTimeoutMax)
		}
	}
	for _, k := range clusterFaultKinds {
		if seen[k] != 2 {
			t.Errorf("%d × %s in two rounds, want 2", seen[k], k)
		}
	}
}

// The models files give every model at least two nodes, and the healthy
// models are the reliable ones.
func TestChaosModels(t *testing.T) {
	t.Parallel()
	models, err := loadChaosModels("testdata/chaos", chaosNodes)
	if err != nil {
		t.Fatal(err)
	}
	if len(models) != 5 {
		t.Fatalf("%d models, want 5", len(models))
	}
	for name, m := range models {
		if len(m.Nodes) < 2 {
			t.Errorf("model %s is on %v only: a worker kill would take it away", name, m.Nodes)
		}
	}
	got := healthyModels(models, nil, time.Now(), "")
	if want := []string{"m-fail00", "m-fail02", "m-fail05", "m-fail10"}; !reflect.DeepEqual(got, want) {
		t.Errorf("healthy models %v, want %v", got, want)
	}
}

// The verdict catches each broken rule, and accepts what the rules allow.
func TestChaosVerdict(t *testing.T) {
	t.Parallel()
	models := map[string]*chaosModel{
		"good": {Name: "good", FailRate: 0, Nodes: []string{"n1", "n2"}},
		"bad":  {Name: "bad", FailRate: 0.3, Nodes: []string{"n1"}},
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	both := []outage{{Node: "n1", From: t0.Add(-time.Second), To: t0.Add(time.Second)},
		{Node: "n2", From: t0.Add(-time.Second), To: t0.Add(time.Second)}}
	att := func(n int, model string, st protocol.OutcomeStatus) protocol.Attempt {
		return protocol.Attempt{Attempt: n, Model: model, Node: "n1", Status: st}
	}
	ok := &protocol.Result{ID: "ok", Type: "x", Status: protocol.StatusSucceeded, Model: "good", Node: "n1", Attempts: 2,
		History: []protocol.Attempt{att(1, "bad", protocol.OutcomeLost), att(2, "good", protocol.OutcomeSuccess)}}
	exhausted := &protocol.Result{ID: "ex", Type: "x", Status: protocol.StatusFailed, ErrorCode: protocol.CodeAttemptsExhausted,
		Attempts: 3, FinishedAt: t0, History: []protocol.Attempt{att(1, "bad", protocol.OutcomeModelError),
			att(2, "good", protocol.OutcomeTimeout), att(3, "bad", protocol.OutcomeModelError)}}
	taskErr := &protocol.Result{ID: "te", Type: "x", Status: protocol.StatusFailed, ErrorCode: protocol.CodeTaskError,
		Attempts: 1, History: []protocol.Attempt{att(1, "good", protocol.OutcomeTaskError)}}
	early := &protocol.Result{ID: "early", Type: "x", Status: protocol.StatusFailed, ErrorCode: protocol.CodeNoModel,
		Attempts: 1, FinishedAt: t0, History: []protocol.Attempt{att(1, "bad", protocol.OutcomeModelError)}}
	rejected := &protocol.Result{ID: "rej", Type: "x", Status: protocol.StatusRejected, ErrorCode: protocol.CodeTypeMismatch}
	tasks := []chaosTask{{ID: "ok", Type: "x"}, {ID: "ex", Type: "x"}, {ID: "te", Type: "x"}, {ID: "early", Type: "x"},
		{ID: "rej", Type: "x", Kind: kindRejected}, {Kind: kindNoID, Type: "x"}}
	results := map[string]*protocol.Result{"ok": ok, "ex": exhausted, "te": taskErr, "early": early, "rej": rejected}

	// Failing early breaks the rule whatever was healthy (the problem says
	// what was): with every node down it is a valid task turned away by a
	// fault all the same (issue 39).
	v := verifyResults(tasks, results, models, nil, 3)
	if len(v.Problems) != 1 || !strings.Contains(v.Problems[0], "early: failed") || !strings.Contains(v.Problems[0], "[good]") {
		t.Fatalf("problems %q, want exactly the early failure with [good] healthy", v.Problems)
	}
	v = verifyResults(tasks, results, models, both, 3)
	if len(v.Problems) != 1 || !strings.Contains(v.Problems[0], "early: failed") || !strings.Contains(v.Problems[0], "healthy then: []") {
		t.Fatalf("with every node of the healthy model down: problems %q, want the early failure with none healthy", v.Problems)
	}
	if v.Succeeded != 1 || v.Failed != 3 || v.FailedExhausted != 1 || v.FailedTaskError != 1 || v.Rejected != 1 ||
		v.ByFault != 1 || v.OwnModels != 1 {
		t.Fatalf("counts %+v", v)
	}
	// Exhausted through an attempt a fault ended: a fault's failure too.
	for _, st := range []protocol.OutcomeStatus{protocol.OutcomeLost, protocol.OutcomeNodeLost, protocol.OutcomeExpired} {
		c := *exhausted
		c.History = []protocol.Attempt{att(1, "bad", protocol.OutcomeModelError), att(2, "good", st), att(3, "bad", protocol.OutcomeModelError)}
		res := map[string]*protocol.Result{"ex": &c}
		v := verifyResults([]chaosTask{{ID: "ex", Type: "x"}}, res, models, nil, 3)
		if v.ByFault != 1 || v.OwnModels != 0 || len(v.Problems) != 1 || !strings.Contains(v.Problems[0], "because of a fault (attempts [2])") {
			t.Errorf("exhausted through a %s attempt: %+v", st, v)
		}
	}

	for _, tc := range []struct {
		name string
		edit func(r map[string]*protocol.Result)
		want string
	}{
		{"missing result", func(r map[string]*protocol.Result) { delete(r, "ok") }, "ok: no final result"},
		{"history gap", func(r map[string]*protocol.Result) {
			c := *exhausted
			c.History = []protocol.Attempt{att(1, "bad", protocol.OutcomeModelError), att(3, "good", protocol.OutcomeTimeout), att(3, "bad", protocol.OutcomeLost)}
			r["ex"] = &c
		}, "ex: history entry 2 is attempt 3"},
		{"exhausted too early", func(r map[string]*protocol.Result) {
			c := *exhausted
			c.Attempts, c.History = 1, c.History[:1]
			r["ex"] = &c
		}, "ex: failed (attempts_exhausted"},
		{"went on after a success", func(r map[string]*protocol.Result) {
			c := *ok
			c.History = []protocol.Attempt{att(1, "bad", protocol.OutcomeSuccess), att(2, "good", protocol.OutcomeSuccess)}
			r["ok"] = &c
		}, "ok: attempt 1 ended success yet the task went on"},
		{"good task rejected", func(r map[string]*protocol.Result) {
			r["ok"] = &protocol.Result{ID: "ok", Type: "x", Status: protocol.StatusRejected, ErrorCode: protocol.CodeNoModel}
		}, "ok: a valid task got rejected"},
		{"bad input succeeded", func(r map[string]*protocol.Result) {
			c := *ok
			c.ID = "rej"
			r["rej"] = &c
		}, "rej: bad input got succeeded"},
		{"result of another task", func(r map[string]*protocol.Result) {
			c := *ok
			c.ID = "other"
			r["ok"] = &c
		}, "ok/x: result names other/x"},
	} {
		res := map[string]*protocol.Result{}
		for k, r := range results {
			res[k] = r
		}
		tc.edit(res)
		v := verifyResults(tasks, res, models, nil, 3)
		found := false
		for _, p := range v.Problems {
			found = found || strings.Contains(p, tc.want)
		}
		if !found {
			t.Errorf("%s: problems %q, want one containing %q", tc.name, v.Problems, tc.want)
		}
	}
}

func TestSubjectMatches(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		filter, subject string
		want            bool
	}{
		{"mlsched.tasks.>", "mlsched.tasks.embed", true},
		{"mlsched.tasks.>", "mlsched.tasks", false},
		{"mlsched.node.*.tasks", "mlsched.node.n1.tasks", true},
		{"mlsched.node.*.tasks", "mlsched.node.n1.tasks.x", false},
		{"mlsched.node.n1.tasks", "mlsched.node.n2.tasks", false},
		{"mlsched.outcomes.*", "mlsched.outcomes.n1", true},
		{"mlsched.outcomes.*", "mlsched.outcomes", false},
		{">", "a", true},
	} {
		if got := subjectMatches(c.filter, c.subject); got != c.want {
			t.Errorf("subjectMatches(%q, %q) = %v, want %v", c.filter, c.subject, got, c.want)
		}
	}
}

func TestRunCountsFromWorkerLogs(t *testing.T) {
	logs := `{"level":"debug","task_id":"a","model":"m","attempt":1,"message":"running the task"}
{"level":"info","task_id":"a","message":"something else"}
{"level":"debug","task_id":"a","model":"m","attempt":2,"batch":3,"message":"running the task"}
{"level":"debug","task_id":"b","model":"m","attempt":1,"message":"running the ta`
	r := newRunCounts()
	r.add(logs)
	r.add(`{"level":"debug","task_id":"a","attempt":3,"message":"running the task"}` + "\n" +
		`{"level":"debug","task_id":"a","attempt":4,"message":"running the task"}`)
	if r.byTask["a"] != 4 || r.byTask["b"] != 0 || r.total() != 4 || r.most() != 4 || r.batched != 1 {
		t.Fatalf("counts %+v, want a ran 4 times (once in a batch) and the cut line skipped", r)
	}
	if over := r.over(3); len(over) != 1 || over["a"] != 4 {
		t.Fatalf("over(3) = %v, want a: 4", over)
	}
}

func TestTurnedAwayByFault(t *testing.T) {
	h := func(st ...protocol.OutcomeStatus) []protocol.Attempt {
		var out []protocol.Attempt
		for i, s := range st {
			out = append(out, protocol.Attempt{Attempt: i + 1, Status: s})
		}
		return out
	}
	for _, c := range []struct {
		name  string
		r     protocol.Result
		fault bool
	}{
		{"success", protocol.Result{Status: protocol.StatusSucceeded}, false},
		{"task error", protocol.Result{Status: protocol.StatusFailed, ErrorCode: protocol.CodeTaskError, Attempts: 1}, false},
		{"exhausted on the models", protocol.Result{Status: protocol.StatusFailed, ErrorCode: protocol.CodeAttemptsExhausted, Attempts: 3,
			History: h(protocol.OutcomeModelError, protocol.OutcomeTimeout, protocol.OutcomeModelError)}, false},
		{"exhausted through a lost node", protocol.Result{Status: protocol.StatusFailed, ErrorCode: protocol.CodeAttemptsExhausted, Attempts: 3,
			History: h(protocol.OutcomeModelError, protocol.OutcomeNodeLost, protocol.OutcomeModelError)}, true},
		{"failed with attempts left", protocol.Result{Status: protocol.StatusFailed, ErrorCode: protocol.CodeNoModel, Attempts: 1}, true},
		{"rejected", protocol.Result{Status: protocol.StatusRejected, ErrorCode: protocol.CodeNoModel}, true},
	} {
		if why, fault := turnedAwayByFault(&c.r, 3); fault != c.fault || fault && why == "" {
			t.Errorf("%s: fault %v (%q), want %v", c.name, fault, why, c.fault)
		}
	}
}

// TestChaosPipelineVerdict: the chaos run's rules for its pipelines catch
// a failed pipeline that names no step (or the wrong one), a wrong route,
// a step failed with attempts left or through a fault, and a mis-summed
// attempts count.
func TestChaosPipelineVerdict(t *testing.T) {
	t.Parallel()
	models := map[string]*chaosModel{"good": {Name: "good", Nodes: []string{"n1"}}, "bad": {Name: "bad", FailRate: 0.3, Nodes: []string{"n1"}}}
	att := func(n int, model string, st protocol.OutcomeStatus) protocol.Attempt {
		return protocol.Attempt{Attempt: n, Model: model, Node: "n1", Status: st}
	}
	step := func(name string, attempts int, st protocol.Status) protocol.StepRecord {
		return protocol.StepRecord{Name: name, Type: "x", Model: "good", Node: "n1", Attempts: attempts, Status: st}
	}
	ok := protocol.Result{ID: "p", Type: "x", Status: protocol.StatusSucceeded, Model: "good", Node: "n1", Attempts: 5,
		Steps: []protocol.StepRecord{step("first", 1, "succeeded"), step("sx", 2, "succeeded"), step("e1", 1, "succeeded"),
			step("e2", 1, "succeeded")},
		History: []protocol.Attempt{att(1, "good", protocol.OutcomeSuccess)}}
	failed := protocol.Result{ID: "p", Type: "x", Status: protocol.StatusFailed, ErrorCode: protocol.CodePipelineError,
		FailedStep: "sx", Error: "step sx (x) failed: attempts_exhausted: …", Attempts: 4,
		Steps: []protocol.StepRecord{step("first", 1, "succeeded"), step("sx", 3, "failed")},
		History: []protocol.Attempt{att(1, "bad", protocol.OutcomeModelError), att(2, "bad", protocol.OutcomeTimeout),
			att(3, "bad", protocol.OutcomeModelError)}}
	verify := func(r protocol.Result, kind string) verdict {
		return verifyResults([]chaosTask{{ID: "p", Type: "x", Pipe: kind}}, map[string]*protocol.Result{"p": &r}, models, nil, 3)
	}
	if v := verify(ok, "x"); len(v.Problems) != 0 || v.Pipelines != 1 || v.PipeSucceeded != 1 || v.PipeSteps != 4 || v.Succeeded != 0 {
		t.Fatalf("a good pipeline: %+v", v)
	}
	if v := verify(failed, "x"); len(v.Problems) != 0 || v.PipeFailed != 1 || v.PipeOwnModels != 1 || v.ByFault != 0 {
		t.Fatalf("a pipeline failed on its models' own failures: %+v", v)
	}
	// The ensemble's first member ended last, after a retry: the history
	// is its.
	e1Last := ok
	e1Last.Attempts = 6
	e1Last.Steps = []protocol.StepRecord{step("first", 1, "succeeded"), step("sx", 2, "succeeded"), step("e1", 2, "succeeded"), step("e2", 1, "succeeded")}
	e1Last.History = []protocol.Attempt{att(1, "bad", protocol.OutcomeModelError), att(2, "good", protocol.OutcomeSuccess)}
	for i := range e1Last.Steps[2:] {
		e1Last.Steps[2+i].Ensemble = "last"
	}
	if v := verify(e1Last, "x"); len(v.Problems) != 0 || v.PipeSucceeded != 1 {
		t.Fatalf("an ensemble whose first member ended last: %+v", v)
	}
	// The ensemble's second member failed: its record follows sx (its
	// sibling's is not kept).
	member := failed
	member.FailedStep, member.Attempts = "e2", 5
	member.Steps = []protocol.StepRecord{step("first", 1, "succeeded"), step("sx", 1, "succeeded"), step("e2", 3, "failed")}
	if v := verify(member, "x"); len(v.Problems) != 0 || v.PipeFailed != 1 || v.PipeOwnModels != 1 {
		t.Fatalf("a pipeline failed at an ensemble member: %+v", v)
	}
	for _, tc := range []struct {
		name string
		r    protocol.Result
		kind string
		want string
	}{
		{"wrong route", ok, "y", "step 2 is sx, want sy"},
		{"short success", func() protocol.Result { r := ok; r.Steps = r.Steps[:3]; r.Attempts = 4; return r }(), "x", "pipeline succeeded with steps"},
		{"attempts mis-summed", func() protocol.Result { r := ok; r.Attempts = 3; return r }(), "x", "its steps' sum to 5"},
		{"member succeeded alone", func() protocol.Result {
			r := ok
			r.Steps = []protocol.StepRecord{step("first", 1, "succeeded"), step("sx", 2, "succeeded"), step("e2", 1, "succeeded")}
			r.Attempts = 4
			return r
		}(), "x", "step 3 is e2, want e1"},
		{"no failed step", func() protocol.Result { r := failed; r.FailedStep = ""; return r }(), "x", `names step ""`},
		{"wrong failed step", func() protocol.Result { r := failed; r.FailedStep = "first"; return r }(), "x", `names step "first"`},
		{"failed with attempts left", func() protocol.Result {
			r := failed
			r.Steps = []protocol.StepRecord{step("first", 1, "succeeded"), step("sx", 2, "failed")}
			r.Attempts, r.History = 3, r.History[:2]
			return r
		}(), "x", "after 2 of 3 attempts"},
		{"exhausted through a fault", func() protocol.Result {
			r := failed
			r.History = []protocol.Attempt{att(1, "bad", protocol.OutcomeModelError), att(2, "bad", protocol.OutcomeLost), att(3, "bad", protocol.OutcomeModelError)}
			return r
		}(), "x", "because of a fault (attempts [2])"},
	} {
		v := verify(tc.r, tc.kind)
		found := false
		for _, p := range v.Problems {
			found = found || strings.Contains(p, tc.want)
		}
		if !found {
			t.Errorf("%s: problems %q, want one containing %q", tc.name, v.Problems, tc.want)
		}
	}
}

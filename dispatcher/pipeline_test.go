package dispatcher_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/mlsched/mlsched/shared/protocol"
)

// echoOutput is a success's output that carries its input: {"by", "in"}.
func echoOutput(task protocol.Task, model string) json.RawMessage {
	in := task.Payload
	if len(in) == 0 {
		in = json.RawMessage("null")
	}
	return json.RawMessage(`{"by":"` + model + `","in":` + string(in) + `}`)
}

func (n *node) setOutput(f func(protocol.Task, string) json.RawMessage) {
	n.mu.Lock()
	n.output = f
	n.mu.Unlock()
}

func stepNames(r protocol.Result) string {
	var names []string
	for _, s := range r.Steps {
		names = append(names, s.Name+":"+string(s.Status))
	}
	return strings.Join(names, ",")
}

// A sequence with a switch at its second step and an ensemble at its end:
// each step runs on its own type's model, the switch picks the branch from
// the first output, the ensemble's members run on the same input and their
// outputs are merged under their names; one result per pipeline, with
// every step's record. A switch no case matches fails the pipeline naming
// it; a plain task is served as before.
func TestPipelineSequenceSwitchEnsemble(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	n := e.startNode("n1", []string{"extract", "classa", "classb", "vote", "plain"}, map[string]behavior{
		"m-any": succeed, "m-v1": succeed, "m-v2": succeed})
	n.setOutput(echoOutput)
	pl := &protocol.Pipeline{Steps: []protocol.PipelineStep{
		{Name: "extract", Type: "extract", Models: []string{"m-any"}},
		{Name: "route", Switch: &protocol.Switch{On: "$.in.kind", Cases: []protocol.SwitchCase{
			{Equals: json.RawMessage(`"a"`), Next: "ca"}, {Equals: json.RawMessage(`"b"`), Next: "cb"}}}},
		{Name: "ca", Type: "classa", Models: []string{"m-any"}, Next: "ens"},
		{Name: "cb", Type: "classb", Models: []string{"m-any"}, Input: "in"},
		{Name: "ens", Ensemble: []protocol.PipelineStep{
			{Name: "v1", Type: "vote", Models: []string{"m-v1"}}, {Name: "v2", Type: "vote", Models: []string{"m-v2"}}}},
	}}
	for _, id := range []string{"pa", "pb", "pc"} {
		e.submit(protocol.Task{ID: id, Type: "extract", Payload: json.RawMessage(`{"kind":"` + id[1:] + `"}`), Pipeline: pl})
	}
	e.submit(protocol.Task{ID: "plain1", Type: "plain", Models: []string{"m-any"}, Payload: json.RawMessage(`{"x":1}`)})

	ra := e.result("pa")
	if ra.Status != protocol.StatusSucceeded || ra.Type != "extract" || stepNames(ra) != "extract:succeeded,ca:succeeded,v1:succeeded,v2:succeeded" {
		t.Fatalf("pa = %+v (steps %s)", ra, stepNames(ra))
	}
	var merged map[string]struct {
		By string          `json:"by"`
		In json.RawMessage `json:"in"`
	}
	if err := json.Unmarshal(ra.Output, &merged); err != nil || merged["v1"].By != "m-v1" || merged["v2"].By != "m-v2" {
		t.Fatalf("pa output %s: %v", ra.Output, err)
	}
	wantIn := `{"by":"m-any","in":{"by":"m-any","in":{"kind":"a"}}}`
	if !protocol.JSONEqual(merged["v1"].In, json.RawMessage(wantIn)) || !protocol.JSONEqual(merged["v2"].In, json.RawMessage(wantIn)) {
		t.Fatalf("ensemble members' inputs %s %s, want %s", merged["v1"].In, merged["v2"].In, wantIn)
	}
	if ra.Attempts != 4 || ra.Steps[0].Model != "m-any" || ra.Steps[0].Node != "n1" || ra.Steps[1].Type != "classa" {
		t.Fatalf("pa steps %+v attempts %d", ra.Steps, ra.Attempts)
	}
	rb := e.result("pb")
	if rb.Status != protocol.StatusSucceeded || stepNames(rb) != "extract:succeeded,cb:succeeded,v1:succeeded,v2:succeeded" {
		t.Fatalf("pb = %+v (steps %s)", rb, stepNames(rb))
	}
	// cb's input is the path "in" of extract's output: the payload.
	if !strings.Contains(string(rb.Output), `"in":{"by":"m-any","in":{"kind":"b"}}`) {
		t.Fatalf("pb output %s", rb.Output)
	}
	rc := e.result("pc")
	if rc.Status != protocol.StatusFailed || rc.ErrorCode != protocol.CodePipelineError || rc.FailedStep != "route" ||
		stepNames(rc) != "extract:succeeded" {
		t.Fatalf("pc = %+v", rc)
	}
	rp := e.result("plain1")
	if rp.Status != protocol.StatusSucceeded || len(rp.Steps) != 0 || rp.FailedStep != "" || string(rp.Output) != `{"by":"m-any","in":{"x":1}}` {
		t.Fatalf("plain1 = %+v", rp)
	}
	n.mu.Lock()
	for i, h := range n.headers {
		if strings.HasPrefix(n.seen[i], "plain1/") && len(h[protocol.HdrPipeline]) > 0 {
			t.Errorf("a plain task's dispatch carries %s", protocol.HdrPipeline)
		}
	}
	n.mu.Unlock()
	for _, id := range []string{"pa", "pb", "pc", "plain1"} {
		if c := e.resultCount(id); c != 1 {
			t.Errorf("%s has %d results", id, c)
		}
	}
	fams, _ := scrape(t, baseURL(t, e.d))
	if v, _ := value(fams, "mlsched_pipeline_steps_total", "type=vote", "status=succeeded"); v != 4 {
		t.Errorf("mlsched_pipeline_steps_total{type=vote,status=succeeded} = %v, want 4", v)
	}
}

// A step that exhausts its attempts fails the pipeline with that step
// named; an invalid pipeline is rejected under the task's id.
func TestPipelineStepExhaustedAndInvalid(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.startNode("n1", []string{"first", "second", "third"}, map[string]behavior{"m-ok": succeed, "m-bad": fail})
	pl := &protocol.Pipeline{Steps: []protocol.PipelineStep{
		{Name: "one", Type: "first", Models: []string{"m-ok"}},
		{Name: "two", Type: "second", Models: []string{"m-bad"}, MaxAttempts: 2},
		{Name: "three", Type: "third"},
	}}
	e.submit(protocol.Task{ID: "px", Type: "first", Pipeline: pl})
	r := e.result("px")
	if r.Status != protocol.StatusFailed || r.ErrorCode != protocol.CodePipelineError || r.FailedStep != "two" ||
		stepNames(r) != "one:succeeded,two:failed" || r.Steps[1].Attempts != 2 || r.Attempts != 3 ||
		!strings.Contains(r.Error, "step two (second) failed: attempts_exhausted") {
		t.Fatalf("px = %+v", r)
	}
	bad := &protocol.Pipeline{Steps: []protocol.PipelineStep{{Name: "one", Type: "other"}}}
	e.submit(protocol.Task{ID: "pbad", Type: "first", Pipeline: bad})
	if r := e.result("pbad"); r.Status != protocol.StatusRejected || r.ErrorCode != protocol.CodeInvalidPipeline {
		t.Fatalf("pbad = %+v", r)
	}
}

// The pipeline's deadline covers every step: a later step gets what is
// left, and a pipeline whose deadline passed during a step ends expired,
// naming the step that could not start.
func TestPipelineDeadlineCoversAllSteps(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	slow := func(protocol.Task, int) (protocol.OutcomeStatus, string) {
		time.Sleep(300 * time.Millisecond) // the node's run time, not synchronisation
		return protocol.OutcomeSuccess, ""
	}
	n := e.startNode("n1", []string{"first", "second"}, map[string]behavior{"m-slow": slow, "m-ok": succeed})
	pl := &protocol.Pipeline{Steps: []protocol.PipelineStep{
		{Name: "one", Type: "first", Models: []string{"m-slow"}},
		{Name: "two", Type: "second", Models: []string{"m-ok"}},
	}}
	start := time.Now()
	e.submit(protocol.Task{ID: "pd1", Type: "first", DeadlineMs: 5000, Pipeline: pl})
	if r := e.result("pd1"); r.Status != protocol.StatusSucceeded || len(r.Steps) != 2 {
		t.Fatalf("pd1 = %+v", r)
	}
	n.mu.Lock()
	for i, h := range n.headers {
		if n.seen[i] == "pd1/1/m-ok" {
			pd, _ := protocol.ParseDispatch(h)
			if limit := start.Add(5*time.Second + time.Second); pd.Deadline.After(limit) {
				t.Errorf("step two's dispatch deadline %v is past the pipeline's (%v)", pd.Deadline, limit)
			}
		}
	}
	n.mu.Unlock()
	e.submit(protocol.Task{ID: "pd2", Type: "first", DeadlineMs: 150, Pipeline: pl})
	r := e.result("pd2")
	if r.Status != protocol.StatusFailed || r.ErrorCode != protocol.CodeExpired || r.FailedStep != "two" {
		t.Fatalf("pd2 = %+v", r)
	}
}

// Cancelling a pipeline stops its remaining steps.
func TestPipelineCancelStopsRemainingSteps(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	release := make(chan struct{})
	n := e.startNode("n1", []string{"first", "second", "third"}, map[string]behavior{
		"m-ok": succeed,
		"m-block": func(protocol.Task, int) (protocol.OutcomeStatus, string) {
			<-release
			return protocol.OutcomeSuccess, ""
		}})
	pl := &protocol.Pipeline{Steps: []protocol.PipelineStep{
		{Name: "one", Type: "first", Models: []string{"m-ok"}},
		{Name: "two", Type: "second", Models: []string{"m-block"}},
		{Name: "three", Type: "third", Models: []string{"m-ok"}},
	}}
	e.submit(protocol.Task{ID: "pcan", Type: "first", Pipeline: pl})
	e.waitFor("step two running", func() bool {
		for _, s := range n.attempts() {
			if s == "pcan/1/m-block" {
				return true
			}
		}
		return false
	})
	if r := e.cancel("pcan"); r.Outcome != protocol.CancelDone {
		t.Fatalf("cancel = %+v", r)
	}
	close(release)
	e.waitFor("step two's outcome counted as late", func() bool { return e.d.Counters().Late.Load() == 1 })
	if r := e.result("pcan"); r.Status != protocol.StatusCancelled {
		t.Fatalf("pcan = %+v", r)
	}
	e.submit(protocol.Task{ID: "after", Type: "third", Models: []string{"m-ok"}})
	e.result("after")
	for _, s := range n.attempts() {
		if strings.HasPrefix(s, "pcan/") && strings.HasSuffix(s, "m-ok") && s != "pcan/1/m-ok" {
			t.Errorf("a step ran after the cancel: %v", n.attempts())
		}
	}
	if c := e.resultCount("pcan"); c != 1 {
		t.Fatalf("pcan has %d results", c)
	}
}

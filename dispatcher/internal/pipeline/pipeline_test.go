package pipeline

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/mlsched/mlsched/shared/protocol"
)

// A pipeline advances from one step's output to the next step's payload:
// in order, through a switch that picks the next step by a value of the
// output, through an ensemble's members one by one (their outputs merged
// under their names), and to the end with the last output as the result.
func TestAdvance(t *testing.T) {
	def := protocol.Pipeline{Steps: []protocol.PipelineStep{
		{Name: "detect", Type: "lang"},
		{Name: "route", Switch: &protocol.Switch{On: "$.lang", Cases: []protocol.SwitchCase{
			{Equals: json.RawMessage(`"fr"`), Next: "both"}}, Default: "en"}},
		{Name: "en", Type: "summarise-en", Input: "$.text", Next: "end"},
		{Name: "both", Input: "$.text", Ensemble: []protocol.PipelineStep{
			{Name: "a", Type: "sum-a"}, {Name: "b", Type: "sum-b"}}},
	}}
	p := &Progress{Def: def, Type: "pipe", Seq: 1}
	rec := func(name string) protocol.StepRecord {
		return protocol.StepRecord{Name: name, Status: protocol.StatusSucceeded}
	}

	next, payload, final, _, err := p.Advance(rec("detect"), json.RawMessage(`{"lang":"fr","text":"bonjour"}`))
	if err != nil || final != nil || next == nil {
		t.Fatalf("after detect: next %v final %s err %v", next, final, err)
	}
	if st, ens := next.Step(); st.Name != "a" || ens != "both" || string(payload) != `"bonjour"` || next.Seq != 2 {
		t.Fatalf("after detect: step %s of %q, payload %s, seq %d; want a of both, \"bonjour\", 2", st.Name, ens, payload, next.Seq)
	}
	next2, payload, _, _, err := next.Advance(rec("a"), json.RawMessage(`"A"`))
	if err != nil || next2 == nil {
		t.Fatalf("after a: %v", err)
	}
	if st, _ := next2.Step(); st.Name != "b" || string(payload) != `"bonjour"` {
		t.Fatalf("after a: step %s payload %s, want b with the ensemble's input", st.Name, payload)
	}
	end, _, final, _, err := next2.Advance(rec("b"), json.RawMessage(`"B"`))
	if err != nil || end != nil {
		t.Fatalf("after b: next %v err %v, want the end", end, err)
	}
	var merged map[string]string
	if err := json.Unmarshal(final, &merged); err != nil || merged["a"] != "A" || merged["b"] != "B" {
		t.Fatalf("final output %s, want the members' outputs by name", final)
	}

	// The default case, and a step that names the end.
	next, payload, _, _, _ = p.Advance(rec("detect"), json.RawMessage(`{"lang":"en","text":"hello"}`))
	if st, _ := next.Step(); st.Name != "en" || string(payload) != `"hello"` {
		t.Fatalf("default case: step %s payload %s", st.Name, payload)
	}
	if end, _, final, _, _ := next.Advance(rec("en"), json.RawMessage(`"sum"`)); end != nil || string(final) != `"sum"` {
		t.Fatalf("en names the end: next %v final %s", end, final)
	}
}

// An output that lacks the next step's input ends the pipeline with an error
// naming that step, and the records so far.
func TestAdvanceMissingInput(t *testing.T) {
	def := protocol.Pipeline{Steps: []protocol.PipelineStep{{Name: "one", Type: "x"}, {Name: "two", Type: "y", Input: "$.missing"}}}
	p := &Progress{Def: def, Seq: 1}
	next, _, _, at, err := p.Advance(protocol.StepRecord{Name: "one"}, json.RawMessage(`{"other":1}`))
	if err == nil || at != "two" || !strings.Contains(err.Error(), "$.missing") {
		t.Fatalf("err %v at %q, want an error at two naming the path", err, at)
	}
	if next == nil || len(next.Steps) != 1 || next.Steps[0].Name != "one" {
		t.Fatalf("the records so far: %+v", next)
	}
}

// An ensemble's members run in parallel: Fanout gives every member its
// progress (step Fan+i) and payload; once all succeeded, Join with their
// records and outputs (in any order of ending) goes on after the ensemble
// with the outputs merged by name, the records in member order, and the
// next step numbered after the last member.
func TestFanoutJoin(t *testing.T) {
	def := protocol.Pipeline{Steps: []protocol.PipelineStep{
		{Name: "first", Type: "x"},
		{Name: "vote", Input: "$.doc", Ensemble: []protocol.PipelineStep{
			{Name: "a", Type: "ja"}, {Name: "b", Type: "jb", Input: "$.text"}, {Name: "c", Type: "jc"}}},
		{Name: "after", Type: "y"},
	}}
	p := &Progress{Def: def, Type: "x", Seq: 1, Submitted: 1700000000000}
	next, _, _, _, err := p.Advance(protocol.StepRecord{Name: "first", Status: protocol.StatusSucceeded},
		json.RawMessage(`{"doc":{"text":"t","n":1}}`))
	if err != nil || !next.Starts() || next.Members() != 3 {
		t.Fatalf("after first: %+v %v", next, err)
	}
	members, payloads, _, err := next.Fanout()
	if err != nil || len(members) != 3 {
		t.Fatalf("fanout: %v", err)
	}
	want := []string{`{"text":"t","n":1}`, `"t"`, `{"text":"t","n":1}`}
	keys := map[string]bool{}
	for i, m := range members {
		if st, ens := m.Step(); st.Name != []string{"a", "b", "c"}[i] || ens != "vote" || m.Fan != 2 || m.Seq != 2+i || string(payloads[i]) != want[i] || m.Starts() {
			t.Fatalf("member %d: %s of %s, fan %d seq %d payload %s", i, st.Name, ens, m.Fan, m.Seq, payloads[i])
		}
		keys[m.MemberKey("doc-7", i)] = true
	}
	if len(keys) != 3 || !strings.HasPrefix(members[0].MemberKey("doc-7", 0), "ZG9jLTc.1700000000000.2.") {
		t.Fatalf("member keys %v", keys)
	}
	outs := make([]MemberOut, 3)
	for i, name := range []string{"a", "b", "c"} {
		outs[i] = MemberOut{Rec: protocol.StepRecord{Name: name, Ensemble: "vote", Status: protocol.StatusSucceeded}, Output: json.RawMessage(`"` + name + `!"`)}
	}
	// Member b ended last: the join is the same whichever did.
	jp := members[1].Join(outs)
	after, payload, final, _, err := jp.Advance(outs[2].Rec, outs[2].Output)
	if err != nil || final != nil || after == nil {
		t.Fatalf("after the join: %v", err)
	}
	var merged map[string]string
	if st, _ := after.Step(); st.Name != "after" || after.Seq != 5 || after.Fan != 0 || after.Member != 0 ||
		json.Unmarshal(payload, &merged) != nil || merged["a"] != "a!" || merged["b"] != "b!" || merged["c"] != "c!" {
		t.Fatalf("after the join: step %s seq %d fan %d payload %s", st.Name, after.Seq, after.Fan, payload)
	}
	var names []string
	for _, r := range after.Steps {
		names = append(names, r.Name)
	}
	if strings.Join(names, ",") != "first,a,b,c" {
		t.Fatalf("records %v, want first,a,b,c", names)
	}
	if len(members[0].Steps) != 1 || len(p.Steps) != 0 {
		t.Fatalf("the join changed its input's records: %d, %d", len(members[0].Steps), len(p.Steps))
	}
}

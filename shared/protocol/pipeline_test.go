package protocol

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestPipelineValidate(t *testing.T) {
	ok := `{"steps":[{"name":"a","type":"t1","models":["m1"],"timeout_ms":100,"max_attempts":2},
		{"name":"sw","switch":{"on":"$.k","cases":[{"equals":"x","next":"b"},{"equals":1,"next":"end"}],"default":"c"}},
		{"name":"b","type":"t2","input":"$.out.0","next":"e"},
		{"name":"c","type":"t3"},
		{"name":"e","ensemble":[{"name":"e1","type":"t4"},{"name":"e2","type":"t4","input":"x"}]}]}`
	for _, c := range []struct {
		name, pipeline, want string // want: "" valid, else a part of the error
	}{
		{"valid", ok, ""},
		{"no steps", `{"steps":[]}`, "no steps"},
		{"first of another type", `{"steps":[{"name":"a","type":"t9"}]}`, "must be the task's type"},
		{"first with input", `{"steps":[{"name":"a","type":"t1","input":"x"}]}`, "no input path"},
		{"first a switch", `{"steps":[{"name":"s","switch":{"on":"x","cases":[{"equals":1,"next":"end"}]}}]}`, "cannot start with a switch"},
		{"first an ensemble", `{"steps":[{"name":"e","ensemble":[{"name":"m","type":"t1"}]}]}`, "not an ensemble"},
		{"duplicate name", `{"steps":[{"name":"a","type":"t1"},{"name":"a","type":"t2"}]}`, "used twice"},
		{"member name taken", `{"steps":[{"name":"a","type":"t1"},{"name":"e","ensemble":[{"name":"a","type":"t2"}]}]}`, "used twice"},
		{"named end", `{"steps":[{"name":"a","type":"t1"},{"name":"end","type":"t2"}]}`, "may not be named"},
		{"bad name", `{"steps":[{"name":"a.b","type":"t1"}]}`, "name"},
		{"two kinds", `{"steps":[{"name":"a","type":"t1"},{"name":"b","type":"t2","switch":{"on":"x","cases":[{"equals":1,"next":"end"}]}}]}`, "exactly one"},
		{"no kind", `{"steps":[{"name":"a","type":"t1"},{"name":"b"}]}`, "exactly one"},
		{"backward next", `{"steps":[{"name":"a","type":"t1"},{"name":"b","type":"t2","next":"a"}]}`, "only goes forward"},
		{"self next", `{"steps":[{"name":"a","type":"t1","next":"a"}]}`, "only goes forward"},
		{"unknown next", `{"steps":[{"name":"a","type":"t1","next":"zz"}]}`, "not a step"},
		{"case backward", `{"steps":[{"name":"a","type":"t1"},{"name":"s","switch":{"on":"x","cases":[{"equals":1,"next":"a"}]}}]}`, "only goes forward"},
		{"no cases", `{"steps":[{"name":"a","type":"t1"},{"name":"s","switch":{"on":"x","cases":[]}}]}`, "cases"},
		{"case without next", `{"steps":[{"name":"a","type":"t1"},{"name":"s","switch":{"on":"x","cases":[{"equals":1}]}}]}`, "next is missing"},
		{"case without equals", `{"steps":[{"name":"a","type":"t1"},{"name":"s","switch":{"on":"x","cases":[{"next":"end"}]}}]}`, "equals"},
		{"switch with models", `{"steps":[{"name":"a","type":"t1"},{"name":"s","models":["m"],"switch":{"on":"x","cases":[{"equals":1,"next":"end"}]}}]}`, "only on"},
		{"empty path segment", `{"steps":[{"name":"a","type":"t1"},{"name":"b","type":"t2","input":"a..b"}]}`, "empty segment"},
		{"nested ensemble", `{"steps":[{"name":"a","type":"t1"},{"name":"e","ensemble":[{"name":"m","ensemble":[{"name":"n","type":"t"}]}]}]}`, "plain steps"},
		{"ensemble with type", `{"steps":[{"name":"a","type":"t1"},{"name":"e","models":["m"],"ensemble":[{"name":"m1","type":"t"}]}]}`, "members'"},
		{"timeout out of range", `{"steps":[{"name":"a","type":"t1","timeout_ms":-1}]}`, "timeout_ms"},
		{"attempts out of range", `{"steps":[{"name":"a","type":"t1","max_attempts":11}]}`, "max_attempts"},
		{"bad model", `{"steps":[{"name":"a","type":"t1","models":["a b"]}]}`, "allow-list"},
		{"reserved type", `{"steps":[{"name":"a","type":"t1"},{"name":"b","type":"_park"}]}`, "reserved"},
		{"too many steps", `{"steps":[{"name":"a","type":"t1"}` + strings.Repeat(`,{"name":"x","type":"t"}`, 16) + `]}`, "limit is 16"},
	} {
		t.Run(c.name, func(t *testing.T) {
			data := `{"id":"p1","type":"t1","pipeline":` + c.pipeline + `}`
			task, err := DecodeTask([]byte(data), Limits{})
			if c.want == "" {
				if err != nil || task.Pipeline == nil {
					t.Fatalf("DecodeTask: %v", err)
				}
				return
			}
			if !errors.Is(err, &Error{Code: CodeInvalidPipeline}) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("DecodeTask: %v, want invalid_pipeline with %q", err, c.want)
			}
			if task.ID != "p1" {
				t.Fatalf("a rejected pipeline must keep its id, got %q", task.ID)
			}
		})
	}
}

func TestLookupAndChoose(t *testing.T) {
	doc := json.RawMessage(`{"a":{"b":[10,{"c":"x"}]},"n":1.0}`)
	for path, want := range map[string]string{"": string(doc), "$": string(doc), "$.a.b.0": "10", "a.b.1.c": `"x"`, "n": "1.0"} {
		if got, ok := Lookup(doc, path); !ok || string(got) != want {
			t.Errorf("Lookup(%q) = %s %v, want %s", path, got, ok, want)
		}
	}
	for _, path := range []string{"zz", "a.b.2", "a.b.x", "n.m", "a.b.-1"} {
		if got, ok := Lookup(doc, path); ok {
			t.Errorf("Lookup(%q) = %s, want nothing", path, got)
		}
	}
	sw := Switch{On: "n", Cases: []SwitchCase{{Equals: json.RawMessage(`"1"`), Next: "s"}, {Equals: json.RawMessage(`1`), Next: "one"}}}
	if next, ok := sw.Choose(doc); !ok || next != "one" {
		t.Errorf("Choose = %q %v, want one (1 equals 1.0, not \"1\")", next, ok)
	}
	sw.On = "zz"
	if _, ok := sw.Choose(doc); ok {
		t.Error("Choose without a match or default chose")
	}
	sw.Default = "d"
	if next, ok := sw.Choose(doc); !ok || next != "d" {
		t.Errorf("Choose = %q %v, want the default", next, ok)
	}
}

// FuzzPipeline: no pipeline crashes validation, and a valid one only goes
// forward (every next, case and default names a later step or the end).
func FuzzPipeline(f *testing.F) {
	f.Add(`{"steps":[{"name":"a","type":"t1"},{"name":"s","switch":{"on":"$.k","cases":[{"equals":"x","next":"b"}],"default":"end"}},{"name":"b","type":"t2","input":"x"}]}`)
	f.Add(`{"steps":[{"name":"a","type":"t1"},{"name":"e","ensemble":[{"name":"m","type":"t"}]}]}`)
	f.Fuzz(func(t *testing.T, pl string) {
		task, err := DecodeTask([]byte(`{"id":"f","type":"t1","pipeline":`+pl+`}`), Limits{})
		if err != nil || task.Pipeline == nil {
			return
		}
		p := task.Pipeline
		for i, s := range p.Steps {
			nexts := []string{s.Next}
			if s.Switch != nil {
				nexts = append(nexts, s.Switch.Default)
				for _, c := range s.Switch.Cases {
					nexts = append(nexts, c.Next)
				}
			}
			for _, n := range nexts {
				if n != "" && n != PipelineEnd && p.Index(n) <= i {
					t.Fatalf("step %d goes to %q at %d", i, n, p.Index(n))
				}
			}
		}
	})
}

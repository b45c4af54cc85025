package protocol

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
)

// Pipelines (docs/protocol.md, "Pipelines"): a task whose `pipeline` field
// names several steps, each a task type of its own with its own allow-list,
// timeout and attempts, the model chosen afresh at every step. The task's
// own type is its first step's; the dispatcher runs the steps one after
// the other and stores one final result carrying every step's record.

// CodeInvalidPipeline: the task's pipeline is malformed (a rejected
// result). CodePipelineError: a step of the pipeline failed, or the
// pipeline could not go on (a switch no case matched, an input path that
// is not in the previous output); the result names the step.
const (
	CodeInvalidPipeline Code = "invalid_pipeline"
	CodePipelineError   Code = "pipeline_error"
)

// HdrPipeline carries a running pipeline's progress, sealed by the
// dispatcher, on each step's task message and dispatch (echoed on the
// outcome). Producers never set it.
const HdrPipeline = "Mlsched-Pipeline"

// PipelineEnd as a step's next (or a case's) ends the pipeline with the
// previous step's output.
const PipelineEnd = "end"

// Pipeline bounds.
const (
	MaxPipelineSteps    = 16 // steps, switches and ensembles of one pipeline
	MaxEnsembleMembers  = 8
	MaxSwitchCases      = 16
	maxPipelinePathLen  = 256
	maxPipelineNameLen  = 64
	maxPipelineEqualLen = 1024
)

// Pipeline is a task's `pipeline` field.
type Pipeline struct {
	Steps []PipelineStep `json:"steps"`
}

// PipelineStep is one element of a pipeline: a step that runs a task type
// (Type set), a switch (Switch set) that picks the next step from the
// previous output, or an ensemble (Ensemble set) whose members run on the
// same input and whose output is an object of their outputs keyed by name.
type PipelineStep struct {
	Name string `json:"name"`
	Type string `json:"type,omitempty"`
	// Input is a JSON path into the previous output (`$.a.b`, `a.0.b`):
	// the step's payload; empty or `$`: the whole output. A first step's
	// input is the task's payload (Input must be empty).
	Input       string   `json:"input,omitempty"`
	Models      []string `json:"models,omitempty"`
	TimeoutMs   int64    `json:"timeout_ms,omitempty"`
	MaxAttempts int      `json:"max_attempts,omitempty"`
	// Next is the step after this one: a later step's name or "end";
	// empty: the next in the list (the end after the last).
	Next     string         `json:"next,omitempty"`
	Switch   *Switch        `json:"switch,omitempty"`
	Ensemble []PipelineStep `json:"ensemble,omitempty"`
}

// Switch picks the next step by the previous output's value at On.
type Switch struct {
	On      string       `json:"on"`
	Cases   []SwitchCase `json:"cases"`
	Default string       `json:"default,omitempty"`
}

// SwitchCase: when the value at the switch's path equals Equals (as JSON
// values: 1 equals 1.0), the pipeline goes on at Next.
type SwitchCase struct {
	Equals json.RawMessage `json:"equals"`
	Next   string          `json:"next"`
}

// StepRecord is one step of a pipeline in its result.
type StepRecord struct {
	Name string `json:"name"`
	// Ensemble names the ensemble the step is a member of.
	Ensemble  string  `json:"ensemble,omitempty"`
	Type      string  `json:"type"`
	Model     string  `json:"model,omitempty"`
	Node      string  `json:"node,omitempty"`
	Attempts  int     `json:"attempts"`
	LatencyMs float64 `json:"latency_ms"`
	// Status is the step's Status: succeeded or failed.
	Status Status `json:"status"`
	Error  string `json:"error,omitempty"`
}

// Kind of a step.
func (s *PipelineStep) Kind() string {
	switch {
	case s.Switch != nil:
		return "switch"
	case len(s.Ensemble) > 0:
		return "ensemble"
	}
	return "step"
}

func pipelineErr(format string, args ...any) error {
	return Errorf(CodeInvalidPipeline, format, args...)
}

// Validate checks a pipeline of a task of type taskType.
func (p *Pipeline) Validate(taskType string, lim Limits) error {
	lim = lim.withDefaults()
	if len(p.Steps) == 0 {
		return pipelineErr("pipeline has no steps")
	}
	if len(p.Steps) > MaxPipelineSteps {
		return pipelineErr("pipeline has %d steps, the limit is %d", len(p.Steps), MaxPipelineSteps)
	}
	index := map[string]int{}
	names := map[string]bool{}
	name := func(n, where string) error {
		if err := ValidToken(n, maxPipelineNameLen); err != nil {
			return pipelineErr("%s name %q: %v", where, truncate(n, 64), err)
		}
		if n == PipelineEnd {
			return pipelineErr("%s may not be named %q", where, PipelineEnd)
		}
		if names[n] {
			return pipelineErr("step name %q is used twice", n)
		}
		names[n] = true
		return nil
	}
	for i := range p.Steps {
		s := &p.Steps[i]
		if err := name(s.Name, "step "+strconv.Itoa(i+1)); err != nil {
			return err
		}
		index[s.Name] = i
		for j := range s.Ensemble {
			if err := name(s.Ensemble[j].Name, "ensemble "+s.Name+" member "+strconv.Itoa(j+1)); err != nil {
				return err
			}
		}
	}
	target := func(from int, next, where string) error {
		if next == "" || next == PipelineEnd {
			return nil
		}
		j, ok := index[next]
		if !ok {
			return pipelineErr("%s: next step %q is not a step of the pipeline", where, truncate(next, 64))
		}
		if j <= from {
			return pipelineErr("%s: next step %q is not after it (a pipeline only goes forward)", where, next)
		}
		return nil
	}
	for i := range p.Steps {
		s := &p.Steps[i]
		where := "step " + s.Name
		kinds := 0
		if s.Type != "" {
			kinds++
		}
		if s.Switch != nil {
			kinds++
		}
		if len(s.Ensemble) > 0 {
			kinds++
		}
		if kinds != 1 {
			return pipelineErr("%s must have exactly one of type, switch and ensemble", where)
		}
		if err := target(i, s.Next, where); err != nil {
			return err
		}
		if err := validPath(s.Input, where); err != nil {
			return err
		}
		switch {
		case s.Switch != nil:
			sw := s.Switch
			if i == 0 {
				return pipelineErr("%s: a pipeline cannot start with a switch", where)
			}
			if s.Next != "" || s.Input != "" || len(s.Models) > 0 || s.TimeoutMs != 0 || s.MaxAttempts != 0 {
				return pipelineErr("%s: a switch has only on, cases and default", where)
			}
			if err := validPath(sw.On, where+" switch"); err != nil {
				return err
			}
			if len(sw.Cases) == 0 || len(sw.Cases) > MaxSwitchCases {
				return pipelineErr("%s: a switch needs 1 to %d cases, it has %d", where, MaxSwitchCases, len(sw.Cases))
			}
			for k, c := range sw.Cases {
				if len(c.Equals) == 0 || len(c.Equals) > maxPipelineEqualLen || !json.Valid(c.Equals) {
					return pipelineErr("%s case %d: equals must be a JSON value of at most %d bytes", where, k+1, maxPipelineEqualLen)
				}
				if c.Next == "" {
					return pipelineErr("%s case %d: next is missing", where, k+1)
				}
				if err := target(i, c.Next, where+" case "+strconv.Itoa(k+1)); err != nil {
					return err
				}
			}
			if err := target(i, sw.Default, where+" default"); err != nil {
				return err
			}
		case len(s.Ensemble) > 0:
			if i == 0 {
				return pipelineErr("%s: a pipeline starts with a step of the task's type, not an ensemble", where)
			}
			if len(s.Ensemble) > MaxEnsembleMembers {
				return pipelineErr("%s: an ensemble has at most %d members, it has %d", where, MaxEnsembleMembers, len(s.Ensemble))
			}
			if s.Type != "" || len(s.Models) > 0 || s.TimeoutMs != 0 || s.MaxAttempts != 0 {
				return pipelineErr("%s: an ensemble's type, models, timeout and attempts are its members'", where)
			}
			for j := range s.Ensemble {
				m := &s.Ensemble[j]
				mw := where + " member " + m.Name
				if m.Switch != nil || len(m.Ensemble) > 0 || m.Next != "" {
					return pipelineErr("%s: an ensemble's members are plain steps (no switch, ensemble or next)", mw)
				}
				if err := validPath(m.Input, mw); err != nil {
					return err
				}
				if err := validStep(m, mw, lim); err != nil {
					return err
				}
			}
		default:
			if i == 0 {
				if s.Type != taskType {
					return pipelineErr("%s: the first step's type %q must be the task's type %q", where, truncate(s.Type, 64), taskType)
				}
				if s.Input != "" {
					return pipelineErr("%s: the first step's input is the task's payload (no input path)", where)
				}
			}
			if err := validStep(s, where, lim); err != nil {
				return err
			}
		}
	}
	return nil
}

func validStep(s *PipelineStep, where string, lim Limits) error {
	if err := ValidToken(s.Type, 64); err != nil {
		return pipelineErr("%s: type %q: %v", where, truncate(s.Type, 64), err)
	}
	if strings.HasPrefix(s.Type, "_park") {
		return pipelineErr("%s: type %q is reserved", where, s.Type)
	}
	if s.TimeoutMs < 0 || s.TimeoutMs > lim.MaxTimeoutMs {
		return pipelineErr("%s: timeout_ms %d is outside 0..%d", where, s.TimeoutMs, lim.MaxTimeoutMs)
	}
	if s.MaxAttempts < 0 || s.MaxAttempts > lim.MaxAttempts {
		return pipelineErr("%s: max_attempts %d is outside 0..%d", where, s.MaxAttempts, lim.MaxAttempts)
	}
	if len(s.Models) > lim.MaxModels {
		return pipelineErr("%s: allow-list has %d models, the limit is %d", where, len(s.Models), lim.MaxModels)
	}
	for _, m := range s.Models {
		if err := ValidToken(m, 128); err != nil {
			return pipelineErr("%s: allow-list entry %q: %v", where, truncate(m, 64), err)
		}
	}
	return nil
}

func validPath(p, where string) error {
	if len(p) > maxPipelinePathLen {
		return pipelineErr("%s: path is %d bytes, the limit is %d", where, len(p), maxPipelinePathLen)
	}
	for _, seg := range pathSegments(p) {
		if seg == "" {
			return pipelineErr("%s: path %q has an empty segment", where, truncate(p, 64))
		}
	}
	return nil
}

// pathSegments splits a JSON path: "", "$": none; "$.a.b", "a.b": a, b.
func pathSegments(p string) []string {
	p = strings.TrimPrefix(p, "$")
	p = strings.TrimPrefix(p, ".")
	if p == "" {
		return nil
	}
	return strings.Split(p, ".")
}

// Lookup returns the value at path in doc (a JSON document): an object's
// member by name, an array's element by index. ok is false when the path
// is not in doc.
func Lookup(doc json.RawMessage, path string) (json.RawMessage, bool) {
	cur := bytes.TrimSpace(doc)
	for _, seg := range pathSegments(path) {
		if len(cur) == 0 {
			return nil, false
		}
		switch cur[0] {
		case '{':
			var m map[string]json.RawMessage
			if json.Unmarshal(cur, &m) != nil {
				return nil, false
			}
			v, ok := m[seg]
			if !ok {
				return nil, false
			}
			cur = bytes.TrimSpace(v)
		case '[':
			n, err := strconv.Atoi(seg)
			if err != nil || n < 0 {
				return nil, false
			}
			var a []json.RawMessage
			if json.Unmarshal(cur, &a) != nil || n >= len(a) {
				return nil, false
			}
			cur = bytes.TrimSpace(a[n])
		default:
			return nil, false
		}
	}
	if len(cur) == 0 {
		return nil, false
	}
	return cur, true
}

// JSONEqual reports whether two JSON documents are the same value
// (numbers compared as numbers, objects whatever their member order).
func JSONEqual(a, b json.RawMessage) bool {
	var va, vb any
	if json.Unmarshal(a, &va) != nil || json.Unmarshal(b, &vb) != nil {
		return false
	}
	return reflect.DeepEqual(va, vb)
}

// Index is the index of the step named name; len(Steps) for "end" (or a
// name that is not a step's, which Validate refuses).
func (p *Pipeline) Index(name string) int {
	for i := range p.Steps {
		if p.Steps[i].Name == name {
			return i
		}
	}
	return len(p.Steps)
}

// Choose returns the next step of the switch for output: the first case
// whose value equals output's value at On, else Default; false when none
// applies.
func (s *Switch) Choose(output json.RawMessage) (string, bool) {
	if v, ok := Lookup(output, s.On); ok {
		for _, c := range s.Cases {
			if JSONEqual(v, c.Equals) {
				return c.Next, true
			}
		}
	}
	return s.Default, s.Default != ""
}

// Package model defines the models file a worker node reads: which models
// the node hosts, the task types each serves, and the executor that runs it.
// Parsing is strict (unknown fields, bad durations, duplicate names are
// errors naming the model and the field), because a typo in a models file
// would otherwise silently change what the node announces.
//
// Schema (durations are Go duration strings such as "250ms"):
//
//	models:
//	  - name: fraud-fast          # required, a protocol token, unique
//	    types: [fraud]            # required, task types served
//	    executor: sim             # required: go | exec | http | sim
//	    timeout: 2s               # per-task timeout when the dispatch gives none
//	    sim:                      # only the section of the executor may be set
//	      latency: {dist: lognormal, median: 5ms, sigma: 0.4}
//	               # or {dist: fixed, value}, {dist: uniform, min, max},
//	               #    {dist: normal, mean, stddev}
//	      failure_rate: 0.3       # model errors
//	      timeout_rate: 0.01      # hangs until the task times out
//	      task_error_rate: 0      # bad-input errors
//	      schedule: [{after: 60s, failure_rate: 0.05}]
//	  - {name: echo, types: [echo], executor: go, go: {handler: echo}}
//	  - name: script
//	    types: [text]
//	    executor: exec
//	    exec: {command: [python3, model.py], dir: ".", env: ["K=V"]}
//	  - name: remote
//	    types: [classify]
//	    executor: http
//	    http: {url: "http://127.0.0.1:8000", mode: oip, model: resnet, headers: {Authorization: "Bearer x"}}
package model

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/mlsched/mlsched/shared/protocol"
)

// Executor kinds.
const (
	ExecutorGo   = "go"
	ExecutorExec = "exec"
	ExecutorHTTP = "http"
	ExecutorSim  = "sim"
)

// HTTP modes.
const (
	HTTPPassthrough = "passthrough"
	HTTPOIP         = "oip"
)

// Latency distributions of the sim executor.
const (
	DistFixed     = "fixed"
	DistUniform   = "uniform"
	DistNormal    = "normal"
	DistLognormal = "lognormal"
)

// ErrInvalid is wrapped by every validation error.
var ErrInvalid = errors.New("invalid models file")

// File is the top level of a models file.
type File struct {
	Models []Spec `yaml:"models"`
}

// Spec is one model hosted by the node.
type Spec struct {
	// Name is the model name the dispatcher routes by (a protocol token).
	Name string `yaml:"name"`
	// Types are the task types the model serves (protocol tokens).
	Types []string `yaml:"types"`
	// Executor is go, exec, http or sim.
	Executor string `yaml:"executor"`
	// Timeout is the per-task timeout when the dispatch gives none
	// (default: the worker's DefaultTimeout).
	Timeout Duration  `yaml:"timeout,omitempty"`
	Go      *GoSpec   `yaml:"go,omitempty"`
	Exec    *ExecSpec `yaml:"exec,omitempty"`
	HTTP    *HTTPSpec `yaml:"http,omitempty"`
	Sim     *SimSpec  `yaml:"sim,omitempty"`
}

// GoSpec selects an in-process handler registered with the worker SDK.
type GoSpec struct {
	// Handler is the registered name (built-in: echo, noop).
	Handler string `yaml:"handler"`
}

// ExecSpec runs a long-lived subprocess speaking JSON lines.
type ExecSpec struct {
	// Command is the program and its arguments (required).
	Command []string `yaml:"command"`
	// Dir is the working directory (default: the worker's).
	Dir string `yaml:"dir,omitempty"`
	// Env adds KEY=VALUE entries to the worker's environment.
	Env []string `yaml:"env,omitempty"`
}

// HTTPSpec posts tasks to a model server.
type HTTPSpec struct {
	// URL is the server base URL (required).
	URL string `yaml:"url"`
	// Mode is passthrough (default: POST URL, body = payload) or oip
	// (Open Inference Protocol v2: POST URL/v2/models/{model}/infer).
	Mode string `yaml:"mode,omitempty"`
	// Model is the model name on the server in oip mode (default: Name).
	Model string `yaml:"model,omitempty"`
	// Headers are added to every request.
	Headers map[string]string `yaml:"headers,omitempty"`
}

// SimSpec describes a simulated model, for demos, tests and benchmarks.
type SimSpec struct {
	// Latency is the run time distribution (default fixed 0).
	Latency Latency `yaml:"latency,omitempty"`
	// FailureRate is the probability of a model error (default 0).
	FailureRate float64 `yaml:"failure_rate,omitempty"`
	// TimeoutRate is the probability that the model hangs until the task
	// times out (default 0).
	TimeoutRate float64 `yaml:"timeout_rate,omitempty"`
	// TaskErrorRate is the probability of a task (bad input) error (default 0).
	TaskErrorRate float64 `yaml:"task_error_rate,omitempty"`
	// Schedule changes the behaviour over time, relative to the executor's
	// start; each step overrides the fields it sets. Sorted by After.
	Schedule []SimStep `yaml:"schedule,omitempty"`
}

// SimStep is a change of a sim model's behaviour After its start.
type SimStep struct {
	After         Duration `yaml:"after"`
	Latency       *Latency `yaml:"latency,omitempty"`
	FailureRate   *float64 `yaml:"failure_rate,omitempty"`
	TimeoutRate   *float64 `yaml:"timeout_rate,omitempty"`
	TaskErrorRate *float64 `yaml:"task_error_rate,omitempty"`
}

// Latency is a latency distribution. Which fields apply depends on Dist:
// fixed{value}, uniform{min,max}, normal{mean,stddev} (clamped at 0),
// lognormal{median,sigma}.
type Latency struct {
	Dist   string   `yaml:"dist"`
	Value  Duration `yaml:"value,omitempty"`
	Min    Duration `yaml:"min,omitempty"`
	Max    Duration `yaml:"max,omitempty"`
	Mean   Duration `yaml:"mean,omitempty"`
	StdDev Duration `yaml:"stddev,omitempty"`
	Median Duration `yaml:"median,omitempty"`
	Sigma  float64  `yaml:"sigma,omitempty"`
}

// Duration is a time.Duration written as a Go duration string ("250ms").
type Duration time.Duration

// D returns the value as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// UnmarshalYAML accepts a duration string; a bare number is rejected because
// its unit would be a guess.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if n.Kind != yaml.ScalarNode || n.Decode(&s) != nil {
		return fmt.Errorf("line %d: want a duration such as \"250ms\"", n.Line)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("line %d: want a duration such as \"250ms\", got %q", n.Line, s)
	}
	if v < 0 {
		return fmt.Errorf("line %d: duration %q is negative", n.Line, s)
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML writes the duration string.
func (d Duration) MarshalYAML() (any, error) { return time.Duration(d).String(), nil }

// LoadFile reads and validates a models file.
func LoadFile(path string) ([]Spec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("models file: %w", err)
	}
	specs, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return specs, nil
}

// Parse decodes and validates a models file's contents.
func Parse(data []byte) ([]Spec, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var f File
	if err := dec.Decode(&f); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: the file is empty", ErrInvalid)
		}
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if err := Validate(f.Models); err != nil {
		return nil, err
	}
	return f.Models, nil
}

// Validate checks a list of specs. Errors wrap ErrInvalid and name the model
// and the field.
func Validate(specs []Spec) error {
	if len(specs) == 0 {
		return fmt.Errorf("%w: no models", ErrInvalid)
	}
	seen := map[string]bool{}
	for i, s := range specs {
		if err := s.Validate(); err != nil {
			if s.Name == "" {
				return fmt.Errorf("%w: models[%d]: %v", ErrInvalid, i, err)
			}
			return fmt.Errorf("%w: model %q: %v", ErrInvalid, s.Name, err)
		}
		if seen[s.Name] {
			return fmt.Errorf("%w: model %q: name: duplicate", ErrInvalid, s.Name)
		}
		seen[s.Name] = true
	}
	return nil
}

// Validate checks one spec; the error names the field.
func (s Spec) Validate() error {
	if s.Name == "" {
		return errors.New("name: missing")
	}
	if err := protocol.ValidToken(s.Name, 128); err != nil {
		return fmt.Errorf("name: %v", err)
	}
	if len(s.Types) == 0 {
		return errors.New("types: missing")
	}
	for _, t := range s.Types {
		if err := protocol.ValidToken(t, 64); err != nil {
			return fmt.Errorf("types: %q %v", t, err)
		}
	}
	set := 0
	for _, p := range []bool{s.Go != nil, s.Exec != nil, s.HTTP != nil, s.Sim != nil} {
		if p {
			set++
		}
	}
	if set > 1 {
		return errors.New("only the section of its executor may be set (go, exec, http or sim)")
	}
	switch s.Executor {
	case ExecutorGo:
		if s.Go == nil || s.Go.Handler == "" {
			return errors.New("go.handler: missing")
		}
	case ExecutorExec:
		if s.Exec == nil || len(s.Exec.Command) == 0 || s.Exec.Command[0] == "" {
			return errors.New("exec.command: missing")
		}
	case ExecutorHTTP:
		if s.HTTP == nil || s.HTTP.URL == "" {
			return errors.New("http.url: missing")
		}
		switch s.HTTP.Mode {
		case "", HTTPPassthrough, HTTPOIP:
		default:
			return fmt.Errorf("http.mode: %q is not passthrough or oip", s.HTTP.Mode)
		}
	case ExecutorSim:
		if s.Sim == nil {
			return nil // an instant, always successful model
		}
		return s.Sim.validate()
	case "":
		return errors.New("executor: missing (go, exec, http or sim)")
	default:
		return fmt.Errorf("executor: unknown %q (want go, exec, http or sim)", s.Executor)
	}
	return nil
}

func (s *SimSpec) validate() error {
	if err := s.Latency.validate("sim.latency"); err != nil {
		return err
	}
	for _, r := range []struct {
		name string
		v    float64
	}{{"failure_rate", s.FailureRate}, {"timeout_rate", s.TimeoutRate}, {"task_error_rate", s.TaskErrorRate}} {
		if r.v < 0 || r.v > 1 {
			return fmt.Errorf("sim.%s: %g is outside 0..1", r.name, r.v)
		}
	}
	var last time.Duration
	for i, st := range s.Schedule {
		f := fmt.Sprintf("sim.schedule[%d]", i)
		if st.After.D() < last {
			return fmt.Errorf("%s.after: steps must be in increasing order", f)
		}
		last = st.After.D()
		if st.Latency != nil {
			if err := st.Latency.validate(f + ".latency"); err != nil {
				return err
			}
		}
		for _, r := range []struct {
			name string
			v    *float64
		}{{"failure_rate", st.FailureRate}, {"timeout_rate", st.TimeoutRate}, {"task_error_rate", st.TaskErrorRate}} {
			if r.v != nil && (*r.v < 0 || *r.v > 1) {
				return fmt.Errorf("%s.%s: %g is outside 0..1", f, r.name, *r.v)
			}
		}
	}
	return nil
}

func (l Latency) validate(field string) error {
	switch l.Dist {
	case "", DistFixed:
	case DistUniform:
		if l.Max < l.Min {
			return fmt.Errorf("%s.max: %v is below min %v", field, l.Max.D(), l.Min.D())
		}
	case DistNormal:
	case DistLognormal:
		if l.Median <= 0 {
			return fmt.Errorf("%s.median: must be positive", field)
		}
		if l.Sigma < 0 {
			return fmt.Errorf("%s.sigma: %g is negative", field, l.Sigma)
		}
	default:
		return fmt.Errorf("%s.dist: unknown %q (want fixed, uniform, normal or lognormal)", field, l.Dist)
	}
	return nil
}

// Info returns what a node announces for the spec; defTimeout applies when
// the spec sets none.
func (s Spec) Info(defTimeout time.Duration) protocol.ModelInfo {
	t := s.Timeout.D()
	if t <= 0 {
		t = defTimeout
	}
	return protocol.ModelInfo{Name: s.Name, Types: append([]string(nil), s.Types...), TimeoutMs: t.Milliseconds()}
}

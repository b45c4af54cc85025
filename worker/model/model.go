// Package model defines the models file a worker node reads: which models
// the node hosts, the task types each serves, and the executor that runs it.
// Parsing is strict (unknown fields, bad durations, duplicate names are
// errors naming the model and the field), because a typo in a models file
// would otherwise silently change what the node announces.
//
// The schema, every executor and its protocol are documented in
// docs/models.md; deployments/models/example.yaml shows each executor.
package model

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"slices"
	"strings"
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
	// With a Version, Name is the model's family and the model is routed,
	// counted and announced as name@version (see Qualify), so that two
	// versions of one family are known to serve the same purpose.
	Name string `yaml:"name"`
	// Version names this version of the family Name (a protocol token
	// without '@'; default none: the model has no version, as before).
	Version string `yaml:"version,omitempty"`
	// Replaces is the version of the same family this one replaces
	// (informational: shown by mlsched nodes; a rollout names its own
	// incumbents).
	Replaces string `yaml:"replaces,omitempty"`
	// Types are the task types the model serves (protocol tokens).
	Types []string `yaml:"types"`
	// Executor is go, exec, http or sim.
	Executor string `yaml:"executor"`
	// Timeout is the per-task timeout when the dispatch gives none
	// (default: the worker's DefaultTimeout).
	Timeout Duration `yaml:"timeout,omitempty"`
	// MaxConcurrency is the most tasks of this model the node runs at once
	// (default: no limit of its own, only the node's concurrency). The
	// worker enforces it and announces it; the dispatcher counts it as the
	// model's slots on the node. Zero or negative is refused.
	MaxConcurrency *int `yaml:"max_concurrency,omitempty"`
	// Cost is what one attempt of the model costs (default none: the
	// model declares no cost). The worker announces it in its heartbeat;
	// the dispatcher's cost policy buys the cheapest model that clears
	// the success bar (docs/policies.md, docs/models.md).
	Cost *CostSpec `yaml:"cost,omitempty"`
	// Batch makes the node run the model on many waiting tasks in one call
	// (default none: one task per call, as before). See BatchSpec.
	Batch *BatchSpec `yaml:"batch,omitempty"`
	Go    *GoSpec    `yaml:"go,omitempty"`
	Exec  *ExecSpec  `yaml:"exec,omitempty"`
	HTTP  *HTTPSpec  `yaml:"http,omitempty"`
	Sim   *SimSpec   `yaml:"sim,omitempty"`
}

// CostSpec is a model's price in the operator's own unit (cents,
// credits): PerTask for every attempt plus PerUnit for each unit of the
// task's size (tokens, pixels: the task's "size" field).
type CostSpec struct {
	PerTask float64 `yaml:"per_task,omitempty"`
	PerUnit float64 `yaml:"per_unit,omitempty"`
}

// validate checks both prices are numbers in 0..protocol.MaxCost, the
// range a heartbeat accepts: a file the worker loads never yields a
// heartbeat the dispatcher refuses.
func (c *CostSpec) validate() error {
	if c == nil {
		return nil
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"cost.per_task", c.PerTask}, {"cost.per_unit", c.PerUnit}} {
		if !(f.v >= 0 && f.v <= protocol.MaxCost) { // also refuses NaN
			return fmt.Errorf("%s: %g must be a number in 0..%g", f.name, f.v, protocol.MaxCost)
		}
	}
	return nil
}

// BatchSpec is a model's dynamic batching: the node gathers the
// dispatches waiting for the model and runs up to MaxSize of them in one
// call, once the batch is full or the oldest has waited MaxDelay, or
// sooner when a task's deadline cannot wait (docs/models.md, "Batching").
// A model server with a fixed cost per call (a GPU kernel launch, a Python
// request) then pays it once per batch instead of once per task.
type BatchSpec struct {
	// MaxSize is the most tasks in one call (default DefaultBatchMaxSize,
	// at most MaxBatchSize).
	MaxSize int `yaml:"max_size,omitempty"`
	// MaxDelay is the longest a task waits for its batch to fill (default
	// DefaultBatchMaxDelay, at most MaxBatchDelay; 0: never wait, a batch is
	// what is waiting when a slot is free).
	MaxDelay *Duration `yaml:"max_delay,omitempty"`
}

// Batching defaults and bounds.
const (
	DefaultBatchMaxSize  = 32
	MaxBatchSize         = 4096
	DefaultBatchMaxDelay = 5 * time.Millisecond
	MaxBatchDelay        = 10 * time.Second
)

func (b *BatchSpec) validate() error {
	if b == nil {
		return nil
	}
	if b.MaxSize < 0 || b.MaxSize > MaxBatchSize {
		return fmt.Errorf("batch.max_size: %d must be 1..%d tasks (omit it for %d)", b.MaxSize, MaxBatchSize, DefaultBatchMaxSize)
	}
	if b.MaxDelay != nil && b.MaxDelay.D() > MaxBatchDelay {
		return fmt.Errorf("batch.max_delay: %v is over %v (a task would wait that long for company)", b.MaxDelay.D(), MaxBatchDelay)
	}
	return nil
}

// BatchSize is the most tasks the model runs in one call: 0 when it does
// not batch.
func (s Spec) BatchSize() int {
	switch {
	case s.Batch == nil:
		return 0
	case s.Batch.MaxSize == 0:
		return DefaultBatchMaxSize
	}
	return s.Batch.MaxSize
}

// BatchDelay is the longest a task of a batching model waits for its
// batch to fill.
func (s Spec) BatchDelay() time.Duration {
	if s.Batch == nil || s.Batch.MaxDelay == nil {
		return DefaultBatchMaxDelay
	}
	return s.Batch.MaxDelay.D()
}

// GoSpec selects an in-process handler registered with the worker SDK.
type GoSpec struct {
	// Handler is the registered name (built-in: echo, noop).
	Handler string `yaml:"handler"`
}

// ExecSpec runs a long-lived subprocess speaking JSON lines (docs/models.md).
type ExecSpec struct {
	// Command is the program and its arguments (required).
	Command []string `yaml:"command"`
	// Dir is the working directory (default: the worker's).
	Dir string `yaml:"dir,omitempty"`
	// Env is the model's environment, KEY=VALUE entries added to the few
	// variables it inherits from the worker (executor.EnvAllow: PATH, HOME,
	// locale, TZ, TMPDIR, PYTHONPATH, VIRTUAL_ENV); nothing else of the
	// worker's environment reaches the model.
	Env []string `yaml:"env,omitempty"`
	// ReadyTimeout bounds how long a started process may take to print its
	// ready line (default 60s); past it the process is killed and restarted.
	ReadyTimeout Duration `yaml:"ready_timeout,omitempty"`
	// MaxLineBytes bounds one line the process writes (default 1 MiB).
	MaxLineBytes int `yaml:"max_line_bytes,omitempty"`
}

// Exec defaults.
const (
	DefaultExecReadyTimeout = 60 * time.Second
	DefaultMaxLineBytes     = 1 << 20
)

// HTTPSpec posts tasks to a model server (docs/models.md).
type HTTPSpec struct {
	// URL is the server base URL, http or https (required).
	URL string `yaml:"url"`
	// Mode is passthrough (default: POST URL, body = payload) or oip
	// (Open Inference Protocol v2: POST
	// URL/v2/models/{model}[/versions/{version}]/infer).
	Mode string `yaml:"mode,omitempty"`
	// Model is the model name on the server in oip mode (default: Name).
	Model string `yaml:"model,omitempty"`
	// Version is the model version on the server in oip mode (default:
	// none, the server's choice).
	Version string `yaml:"version,omitempty"`
	// Inputs map a plain JSON payload onto named input tensors in oip mode
	// (default: none; the payload must then be an inference request).
	Inputs []TensorSpec `yaml:"inputs,omitempty"`
	// Headers are added to every request.
	Headers map[string]string `yaml:"headers,omitempty"`
	// ReadyURL is polled with GET in passthrough mode; the model is
	// announced only while it answers 2xx (default: none, always ready). In
	// oip mode readiness is the protocol's /v2/health/ready and model ready
	// endpoints.
	ReadyURL string `yaml:"ready_url,omitempty"`
	// MaxResponseBytes bounds a response body (default 1 MiB); a longer one
	// is a model error.
	MaxResponseBytes int64 `yaml:"max_response_bytes,omitempty"`
}

// DefaultMaxResponseBytes bounds an http model's response by default.
const DefaultMaxResponseBytes = 1 << 20

// TensorSpec maps a payload field onto an OIP v2 input tensor.
type TensorSpec struct {
	// Name is the tensor name the model expects (required).
	Name string `yaml:"name"`
	// Datatype is an OIP datatype: BOOL, UINT8..UINT64, INT8..INT64, FP16,
	// FP32, FP64 or BYTES (required).
	Datatype string `yaml:"datatype"`
	// Shape is the tensor shape (required); one dimension may be -1, taken
	// from the number of elements the payload gives.
	Shape []int64 `yaml:"shape"`
	// Field is the payload object's field holding the data (default: the
	// tensor's name). A payload that is a JSON array feeds a single input.
	Field string `yaml:"field,omitempty"`
}

// Datatypes are the OIP v2 tensor datatypes.
var Datatypes = []string{"BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
	"FP16", "FP32", "FP64", "BYTES"}

// SimSpec describes a simulated model, for demos, tests and benchmarks.
type SimSpec struct {
	// Latency is the run time distribution (default fixed 0).
	Latency Latency `yaml:"latency,omitempty"`
	// LatencyPerUnit is added to the drawn latency for each unit of the
	// task's size (its "size" field: tokens, pixels), as real inference
	// grows with its input (default 0).
	LatencyPerUnit Duration `yaml:"latency_per_unit,omitempty"`
	// FailureRate is the probability of a model error (default 0).
	FailureRate float64 `yaml:"failure_rate,omitempty"`
	// TimeoutRate is the probability that the model hangs until the task
	// times out (default 0).
	TimeoutRate float64 `yaml:"timeout_rate,omitempty"`
	// TaskErrorRate is the probability of a task (bad input) error (default 0).
	TaskErrorRate float64 `yaml:"task_error_rate,omitempty"`
	// LatencyPerItem is added to a call's latency for each task in it
	// (default 0): with batching, a call of n tasks takes its drawn latency
	// (the fixed cost of a call) plus n x LatencyPerItem.
	LatencyPerItem Duration `yaml:"latency_per_item,omitempty"`
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
	return Qualify(f.Models), nil
}

// ID is the model's routing name: Name, or family@version when Name is
// the family of a Version.
func (s Spec) ID() string {
	if s.Version != "" && protocol.ModelFamily(s.Name) == s.Name {
		return protocol.ModelName(s.Name, s.Version)
	}
	return s.Name
}

// Qualify returns specs with every versioned model's Name set to its
// routing name, family@version (protocol.ModelName); a spec already
// qualified, or without a version, is unchanged.
func Qualify(specs []Spec) []Spec {
	out := make([]Spec, len(specs))
	for i, s := range specs {
		s.Name = s.ID()
		out[i] = s
	}
	return out
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
		id := s.ID()
		if seen[id] {
			return fmt.Errorf("%w: model %q: name: duplicate", ErrInvalid, id)
		}
		seen[id] = true
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
	if s.Version != "" || s.Replaces != "" {
		if protocol.ModelFamily(s.Name) != s.Name && s.Version != protocol.ModelVersion(s.Name) {
			return fmt.Errorf("name: %q holds '@', which separates the family from the version: give the family as name and the version as version", s.Name)
		}
		if s.Version == "" {
			return errors.New("version: missing (replaces names the version this one replaces)")
		}
		for f, v := range map[string]string{"version": s.Version, "replaces": s.Replaces} {
			if v == "" {
				continue
			}
			if err := protocol.ValidToken(v, 64); err != nil {
				return fmt.Errorf("%s: %v", f, err)
			}
			if strings.Contains(v, "@") {
				return fmt.Errorf("%s: %q contains '@'", f, v)
			}
		}
		if s.Replaces == s.Version {
			return fmt.Errorf("replaces: %q is the model's own version", s.Replaces)
		}
	}
	if len(s.Types) == 0 {
		return errors.New("types: missing")
	}
	if s.MaxConcurrency != nil && *s.MaxConcurrency <= 0 {
		return fmt.Errorf("max_concurrency: %d must be a positive number of tasks (omit it for no limit of its own)", *s.MaxConcurrency)
	}
	if err := s.Cost.validate(); err != nil {
		return err
	}
	if err := s.Batch.validate(); err != nil {
		return err
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
		if s.Exec.MaxLineBytes < 0 {
			return fmt.Errorf("exec.max_line_bytes: %d is negative", s.Exec.MaxLineBytes)
		}
	case ExecutorHTTP:
		if s.HTTP == nil {
			return errors.New("http: missing (http.url is required)")
		}
		return s.HTTP.validate()
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

func (h *HTTPSpec) validate() error {
	if h.URL == "" {
		return errors.New("http.url: missing")
	}
	if err := validURL(h.URL); err != nil {
		return fmt.Errorf("http.url: %v", err)
	}
	if h.ReadyURL != "" {
		if err := validURL(h.ReadyURL); err != nil {
			return fmt.Errorf("http.ready_url: %v", err)
		}
	}
	if h.MaxResponseBytes < 0 {
		return fmt.Errorf("http.max_response_bytes: %d is negative", h.MaxResponseBytes)
	}
	switch h.Mode {
	case "", HTTPPassthrough:
		for _, f := range []struct{ name, v string }{{"model", h.Model}, {"version", h.Version}} {
			if f.v != "" {
				return fmt.Errorf("http.%s: only for mode oip", f.name)
			}
		}
		if len(h.Inputs) > 0 {
			return errors.New("http.inputs: only for mode oip")
		}
	case HTTPOIP:
		if h.ReadyURL != "" {
			return errors.New("http.ready_url: not for mode oip (readiness is the protocol's ready endpoints)")
		}
		for _, f := range []struct{ name, v string }{{"model", h.Model}, {"version", h.Version}} {
			if f.v != "" && (strings.ContainsAny(f.v, "/?#") || strings.TrimSpace(f.v) != f.v) {
				return fmt.Errorf("http.%s: %q is not a path segment", f.name, f.v)
			}
		}
		names := map[string]bool{}
		fields := map[string]bool{}
		for i, in := range h.Inputs {
			f := fmt.Sprintf("http.inputs[%d]", i)
			if in.Name == "" {
				return fmt.Errorf("%s.name: missing (the input tensor's name)", f)
			}
			if names[in.Name] {
				return fmt.Errorf("%s.name: duplicate %q", f, in.Name)
			}
			names[in.Name] = true
			if in.Datatype == "" {
				return fmt.Errorf("%s.datatype: missing (%s)", f, strings.Join(Datatypes, ", "))
			}
			if !slices.Contains(Datatypes, in.Datatype) {
				return fmt.Errorf("%s.datatype: unknown %q (want %s)", f, in.Datatype, strings.Join(Datatypes, ", "))
			}
			if len(in.Shape) == 0 {
				return fmt.Errorf("%s.shape: missing", f)
			}
			free := 0
			for _, d := range in.Shape {
				switch {
				case d == -1:
					free++
				case d <= 0:
					return fmt.Errorf("%s.shape: dimension %d is not positive (or -1)", f, d)
				}
			}
			if free > 1 {
				return fmt.Errorf("%s.shape: at most one dimension may be -1", f)
			}
			field := in.Field
			if field == "" {
				field = in.Name
			}
			if fields[field] {
				return fmt.Errorf("%s.field: %q feeds another input too", f, field)
			}
			fields[field] = true
		}
	default:
		return fmt.Errorf("http.mode: %q is not passthrough or oip", h.Mode)
	}
	return nil
}

func validURL(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return err
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("%q: want an http or https URL", s)
	}
	if u.Host == "" {
		return fmt.Errorf("%q: no host", s)
	}
	return nil
}

func (s *SimSpec) validate() error {
	if err := s.Latency.validate("sim.latency"); err != nil {
		return err
	}
	if s.LatencyPerUnit.D() < 0 {
		return fmt.Errorf("sim.latency_per_unit: %s is negative", s.LatencyPerUnit.D())
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

// Limit is the model's own concurrency limit, 0 when it has none.
func (s Spec) Limit() int {
	if s.MaxConcurrency == nil {
		return 0
	}
	return *s.MaxConcurrency
}

// Info returns what a node announces for the spec; defTimeout applies when
// the spec sets none.
func (s Spec) Info(defTimeout time.Duration) protocol.ModelInfo {
	t := s.Timeout.D()
	if t <= 0 {
		t = defTimeout
	}
	info := protocol.ModelInfo{Name: s.ID(), Types: append([]string(nil), s.Types...), TimeoutMs: t.Milliseconds(),
		MaxConcurrency: s.Limit(), Version: s.Version, Replaces: s.Replaces, BatchMaxSize: s.BatchSize()}
	if s.Cost != nil {
		info.CostPerTask, info.CostPerUnit = s.Cost.PerTask, s.Cost.PerUnit
	}
	return info
}

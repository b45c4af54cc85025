package simulate

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/mlsched/mlsched/shared/protocol"
)

//go:embed scenarios/*.json traces/*.csv
var builtinFS embed.FS

// ErrInvalidScenario is wrapped by every scenario parsing or validation
// error, so a caller can tell a bad file from an I/O failure.
var ErrInvalidScenario = errors.New("invalid scenario")

// Bounds that keep a run finite and its arithmetic exact: simulated times
// stay far below the int64 nanosecond range.
const (
	// MaxTasks bounds tasks per run.
	MaxTasks = 10_000_000
	// MaxDuration bounds every duration of a scenario.
	MaxDuration = 1000 * time.Hour
	maxRate     = 1e7
	minRate     = 1e-3
	maxCapacity = 1_000_000
	// maxRefreshes bounds the table rebuilds of one run (Run checks it).
	maxRefreshes = 5_000_000
	maxModels    = 1000
	maxNodes     = 10_000
	maxEvents    = 100_000
)

// ErrUnknownScenario is returned by Load for a name that is neither a
// built-in scenario nor a readable file.
var ErrUnknownScenario = errors.New("unknown scenario")

// ScenarioError says which field of a scenario is wrong and why.
type ScenarioError struct {
	// Field is a JSON path such as "models[2].profile[0].latency.dist"
	// (empty for a syntax error).
	Field string
	// Reason is what is wrong with it.
	Reason string
}

func (e *ScenarioError) Error() string {
	if e.Field == "" {
		return "invalid scenario: " + e.Reason
	}
	return "invalid scenario: " + e.Field + ": " + e.Reason
}

// Unwrap lets errors.Is(err, ErrInvalidScenario) match.
func (e *ScenarioError) Unwrap() error { return ErrInvalidScenario }

func invalid(field, format string, args ...any) error {
	return &ScenarioError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// Duration is a time.Duration written in JSON as a Go duration string
// ("250ms", "2m30s").
type Duration time.Duration

// UnmarshalJSON accepts a duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("want a duration string such as \"250ms\", got %s", b)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("want a duration string such as \"250ms\": %w", err)
	}
	*d = Duration(v)
	return nil
}

// MarshalJSON writes a duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// Scenario is a simulated cluster and workload. Zero fields take the
// defaults shown; ParseScenario fills them in.
type Scenario struct {
	// Name of the scenario (default: the file name).
	Name string `json:"name"`
	// Description is shown in reports.
	Description string `json:"description,omitempty"`
	// Tasks is the number of tasks when the caller does not say
	// (default 20000).
	Tasks int `json:"tasks,omitempty"`
	// Arrival is the task arrival process.
	Arrival Arrival `json:"arrival"`
	// MaxAttempts per task, failovers included (default 3).
	MaxAttempts int `json:"max_attempts,omitempty"`
	// Timeout of one attempt, as the worker enforces it (default 5s). An
	// attempt whose drawn latency exceeds it is a timeout.
	Timeout Duration `json:"timeout,omitempty"`
	// DeadlineSlack is added to the timeout to form the dispatch deadline
	// (default 10s, the dispatcher's MLSCHED_DEADLINE_SLACK): a queued
	// attempt not started by then expires.
	DeadlineSlack Duration `json:"deadline_slack,omitempty"`
	// LostGrace is how long after the deadline the dispatcher's sweeper
	// declares an unanswered attempt lost (default 1s, its sweep interval).
	LostGrace Duration `json:"lost_grace,omitempty"`
	// RetryBackoff delays the retry after a failed attempt, doubled per
	// attempt up to RetryBackoffMax (defaults 100ms and 5s, the
	// dispatcher's MLSCHED_RETRY_BACKOFF and MLSCHED_RETRY_BACKOFF_MAX).
	RetryBackoff    Duration `json:"retry_backoff,omitempty"`
	RetryBackoffMax Duration `json:"retry_backoff_max,omitempty"`
	// Refresh is how often the dispatcher rebuilds its table (default
	// 250ms).
	Refresh Duration `json:"refresh,omitempty"`
	// NodeTTL is how long a crashed node still appears in the heartbeat
	// bucket (default 10s, the dispatcher's MLSCHED_NODE_TTL default).
	NodeTTL Duration `json:"node_ttl,omitempty"`
	// Window of the statistics store (default 5m in 10s buckets, the
	// dispatcher's defaults).
	Window WindowSpec `json:"window,omitempty"`
	// ChangeAt marks the moment of the change whose recovery is measured
	// (optional; set for drift).
	ChangeAt *Duration `json:"change_at,omitempty"`
	// Rollout, when set, runs a rollout of a new version (rollout.go).
	Rollout *ScenarioRollout `json:"rollout,omitempty"`
	// TenantWeights are the tenants' shares inside a priority (the
	// dispatcher's MLSCHED_TENANT_WEIGHTS; default 1). Flow control only.
	TenantWeights map[string]float64 `json:"tenant_weights,omitempty"`
	// QueueTarget is the dispatcher's MLSCHED_QUEUE_TARGET (default 0:
	// automatic, each (model, node)'s from its measured latency, as the
	// dispatcher's default; negative: off, only the deadline): a node
	// counts as saturated once a task would wait plus run this long there,
	// so the backlog waits in the hold, in priority and tenant order.
	QueueTarget Duration `json:"queue_target,omitempty"`
	// MaxAckPending bounds what the dispatchers have pulled of one
	// priority band and not finished (the band consumer's MaxAckPending,
	// default 2048: 2 x MLSCHED_MAX_IN_FLIGHT); the rest waits in the
	// stream in stream order. Flow control only.
	MaxAckPending int `json:"max_ack_pending,omitempty"`
	// ParkAbove is the dispatcher's tenant parking threshold (default
	// 256; -1: no parking): a task pulled from a band's stream while its
	// tenant has at least this many tasks held in the band, and another
	// tenant's task was pulled from the band in the last 60 s, is parked
	// out of the band's pull window in a queue of its tenant, which is
	// pulled with at most 2 x ParkAbove of its tasks pending. So a
	// flooding tenant's backlog does not fill the window. Flow control
	// only.
	ParkAbove int `json:"park_above,omitempty"`
	// Prefetch is the workers' MLSCHED_PREFETCH (default 32; -1: none,
	// the worker's 0, arrival order): a node takes this many dispatches
	// beyond its running ones and starts them highest priority first,
	// tenants in turn, oldest first (nodequeue.go); the rest wait in its
	// stream in arrival order.
	Prefetch int `json:"prefetch,omitempty"`
	// MinSuccess is the cost policy's success bar per task type ("*":
	// every type not named; default 0.99, the dispatcher's
	// MLSCHED_MIN_SUCCESS and _BY_TYPE).
	MinSuccess map[string]float64 `json:"min_success,omitempty"`
	// Pipelines makes a share of the tasks pipelines of several steps of
	// different types (pipeline.go; optional).
	Pipelines *PipelineMix `json:"pipelines,omitempty"`
	Models    []Model      `json:"models"`
	Nodes     []Node       `json:"nodes"`
	Events    []Event      `json:"events,omitempty"`

	// trace is the loaded arrival trace (trace.go); nil: Poisson arrivals.
	trace *traceData
}

// WindowSpec configures the statistics window.
type WindowSpec struct {
	// Size (default 5m).
	Size Duration `json:"size,omitempty"`
	// Bucket (default 10s, or the size if smaller).
	Bucket Duration `json:"bucket,omitempty"`
	// Recent is the span of the recent counts policies compare with the
	// rest of the window to notice a change (default 2 buckets, the
	// stats.Window default; at most the size).
	Recent Duration `json:"recent,omitempty"`
}

// Arrival is a Poisson arrival process, or the replay of a trace's.
type Arrival struct {
	// Rate in tasks per simulated second (required without a trace; must
	// be absent with one).
	Rate float64 `json:"rate,omitempty"`
	// Trace replays the arrivals of a CSV file (trace.go), one per row at
	// its own time, instead of the Poisson process: a path relative to the
	// scenario file's directory. The task count defaults to its rows, and
	// a longer run replays it again.
	Trace string `json:"trace,omitempty"`
	// TimeColumn holds each row's time: a timestamp or seconds (default
	// TIMESTAMP, or else the first column).
	TimeColumn string `json:"time_column,omitempty"`
	// SizeColumn holds each row's task size (default: none, size 0).
	SizeColumn string `json:"size_column,omitempty"`
	// TypeColumn holds each row's task type, which must be in Types
	// (default: drawn by Types' weights).
	TypeColumn string `json:"type_column,omitempty"`
	// TenantColumn holds each row's tenant: the task takes the first flow
	// of that tenant (default: flows drawn by share).
	TenantColumn string `json:"tenant_column,omitempty"`
	// TimeScale multiplies the trace's times (default 1; 0.05 replays it
	// 20 times faster).
	TimeScale float64 `json:"time_scale,omitempty"`
	// RateMultiplier scales the number of arrivals (default 1): 0.5 keeps
	// every other row, 2 replays each row twice, the copy halfway to the
	// next row.
	RateMultiplier float64 `json:"rate_multiplier,omitempty"`
	// Types maps task types to relative weights (required).
	Types map[string]float64 `json:"types"`
	// Profile changes the rate over time: each step applies from its At
	// until the next step (optional; Rate applies before the first).
	Profile []RateStep `json:"profile,omitempty"`
	// Flows split the arrivals by priority, tenant and deadline (flow
	// control, docs/policies.md "Flow control"): each task's flow is drawn
	// by share. Without flows every task is priority 0 of tenant default
	// with no deadline, and the run is exactly what it was before flow
	// control.
	Flows []Flow `json:"flows,omitempty"`
}

// Flow is a share of the arrivals with one priority, tenant and deadline.
type Flow struct {
	// Name in reports (default "<tenant>/p<priority>").
	Name string `json:"name,omitempty"`
	// Share is the flow's relative weight among the flows (required, > 0).
	Share float64 `json:"share"`
	// Priority is the task's priority, -10..10 (default 0; negative is
	// sheddable).
	Priority int `json:"priority,omitempty"`
	// Tenant is the fairness key (default "default").
	Tenant string `json:"tenant,omitempty"`
	// Deadline is deadline_ms: the task's whole budget from submission
	// (default none).
	Deadline Duration `json:"deadline,omitempty"`
}

// RateStep is an arrival rate from At on.
type RateStep struct {
	At   Duration `json:"at"`
	Rate float64  `json:"rate"`
}

// Model is a simulated model.
type Model struct {
	Name string `json:"name"`
	// Types the model serves.
	Types []string `json:"types"`
	// Profile is the model's behaviour over time: each step applies from
	// its At until the next step. The first step must be at 0 and give
	// both fields; later steps inherit what they omit.
	Profile []Step `json:"profile"`
	// Cost is the model's price (optional, cost.go): reports then give
	// the cost per successful task, and the cost policies run.
	Cost *ModelCost `json:"cost,omitempty"`
	// Batch makes the model batch on its nodes (optional; default one
	// attempt per call): see ModelBatch.
	Batch *ModelBatch `json:"batch,omitempty"`
}

// ModelBatch is a simulated model's dynamic batching (worker/batch.go,
// with max_delay 0): when a node slot frees for the model, up to MaxSize
// of its waiting attempts there, in the node's order, run as one call on
// that slot. A call of n attempts takes the first attempt's drawn latency
// (the call's fixed cost) plus n x PerItem; each attempt draws its own
// failure. The node announces batch_max_size, as a worker does.
type ModelBatch struct {
	MaxSize int      `json:"max_size"`
	PerItem Duration `json:"per_item,omitempty"`
}

// Step is a model's behaviour from At on.
type Step struct {
	At          Duration `json:"at"`
	FailureProb *float64 `json:"failure_prob,omitempty"`
	Latency     *Dist    `json:"latency,omitempty"`
	// LatencyPerUnit is added to the drawn latency for each unit of the
	// task's size (default 0): a request of 4,000 tokens takes longer than
	// one of 100, so a trace's sizes shape its service times.
	LatencyPerUnit *Duration `json:"latency_per_unit,omitempty"`
}

// sizePart is the latency a task of this size adds on this step.
func (s *Step) sizePart(size float64) time.Duration {
	if s.LatencyPerUnit == nil || *s.LatencyPerUnit <= 0 || size <= 0 {
		return 0
	}
	return time.Duration(min(float64(*s.LatencyPerUnit)*size, float64(100*time.Hour)))
}

// exceed is P(latency > t) for a task of this size.
func (s *Step) exceed(t time.Duration, size float64) float64 {
	if p := s.sizePart(size); p > 0 {
		if p >= t {
			return 1
		}
		t -= p
	}
	return s.Latency.exceed(t)
}

// Node is a simulated worker node.
type Node struct {
	Name string `json:"name"`
	// Capacity is the number of attempts the node runs at once (default
	// 16). Further attempts wait, and start in the worker's order
	// (Scenario.Prefetch).
	Capacity int `json:"capacity,omitempty"`
	// Models hosted by the node.
	Models []string `json:"models"`
	// Slowdown multiplies the latency of every attempt on the node
	// (default 1): a slow node, e.g. an older GPU or a noisy neighbour.
	Slowdown float64 `json:"slowdown,omitempty"`
}

// Event kinds.
const (
	EventNodeCrash    = "node_crash"
	EventNodeRecover  = "node_recover"
	EventModelJoin    = "model_join"
	EventFailureBurst = "failure_burst"
)

// Event is something that happens to the cluster at a moment.
type Event struct {
	At   Duration `json:"at"`
	Kind string   `json:"kind"`
	// Node for node_crash and node_recover.
	Node string `json:"node,omitempty"`
	// Model for model_join.
	Model string `json:"model,omitempty"`
	// Until ends a failure_burst.
	Until Duration `json:"until,omitempty"`
	// Models hit by a failure_burst (empty = every model).
	Models []string `json:"models,omitempty"`
	// FailureProb during a failure_burst: a hit model fails with at least
	// this probability.
	FailureProb float64 `json:"failure_prob,omitempty"`
}

// Builtin returns the names of the embedded scenarios, sorted.
func Builtin() []string {
	ents, _ := builtinFS.ReadDir("scenarios")
	var names []string
	for _, e := range ents {
		names = append(names, strings.TrimSuffix(e.Name(), ".json"))
	}
	sort.Strings(names)
	return names
}

// BuiltinJSON returns the JSON text of a built-in scenario.
func BuiltinJSON(name string) ([]byte, error) {
	b, err := builtinFS.ReadFile(path.Join("scenarios", name+".json"))
	if err != nil {
		return nil, fmt.Errorf("%w %q (built-in: %s)", ErrUnknownScenario, name, strings.Join(Builtin(), ", "))
	}
	return b, nil
}

// Load returns a built-in scenario by name, or else parses the file at
// nameOrPath.
func Load(nameOrPath string) (*Scenario, error) {
	if b, err := BuiltinJSON(nameOrPath); err == nil {
		return parseScenario(b, builtinOpener)
	}
	f, err := os.Open(nameOrPath)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%w %q: not built in (%s) and no such file", ErrUnknownScenario, nameOrPath, strings.Join(Builtin(), ", "))
		}
		return nil, fmt.Errorf("open scenario: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("read scenario %s: %w", nameOrPath, err)
	}
	sc, err := parseScenario(b, dirOpener(filepath.Dir(nameOrPath)))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", nameOrPath, err)
	}
	if sc.Name == "" {
		sc.Name = strings.TrimSuffix(path.Base(nameOrPath), ".json")
	}
	return sc, nil
}

// ParseScenario decodes and validates a scenario and fills its defaults.
// Unknown fields are errors, so that a typo does not silently change a run.
// Every error wraps ErrInvalidScenario and is a *ScenarioError naming the
// field.
//
// A trace the arrival names (trace.go) is read relative to the working
// directory; Load reads it relative to the scenario file's.
func ParseScenario(data []byte) (*Scenario, error) {
	return parseScenario(data, dirOpener(""))
}

func parseScenario(data []byte, open opener) (*Scenario, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var sc Scenario
	if err := dec.Decode(&sc); err != nil {
		var se *json.SyntaxError
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &se):
			return nil, invalid("", "JSON syntax error at byte %d: %v", se.Offset, err)
		case errors.As(err, &te):
			return nil, invalid(te.Field, "wrong type: want %v, got JSON %s", te.Type, te.Value)
		case strings.HasPrefix(err.Error(), "json: unknown field"):
			return nil, invalid("", "%s", strings.TrimPrefix(err.Error(), "json: "))
		default:
			return nil, invalid("", "%v", err)
		}
	}
	if dec.More() {
		return nil, invalid("", "trailing data after the scenario object")
	}
	if err := sc.validate(open); err != nil {
		return nil, err
	}
	return &sc, nil
}

func validName(field, s string) error {
	if s == "" {
		return invalid(field, "is empty")
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || c == '.' || c == '*' || c == '>' {
			return invalid(field, "%q contains %q: names must be subject tokens", s, c)
		}
	}
	return nil
}

func validProb(field string, p float64) error {
	if math.IsNaN(p) || p < 0 || p > 1 {
		return invalid(field, "%g is outside 0..1", p)
	}
	return nil
}

func (sc *Scenario) validate(open opener) error {
	if sc.Tasks < 0 || sc.Tasks > MaxTasks {
		return invalid("tasks", "%d is outside 0..%d", sc.Tasks, MaxTasks)
	}
	if err := sc.validateTrace(open); err != nil {
		return err
	}
	if sc.Tasks == 0 {
		sc.Tasks = 20000
	}
	if sc.MaxAttempts < 0 || sc.MaxAttempts > 10 {
		return invalid("max_attempts", "%d is outside 1..10", sc.MaxAttempts)
	}
	if sc.MaxAttempts == 0 {
		sc.MaxAttempts = 3
	}
	if sc.Window.Bucket == 0 && sc.Window.Size > 0 && sc.Window.Size.D() < 10*time.Second {
		sc.Window.Bucket = sc.Window.Size
	}
	for _, d := range []struct {
		field string
		v     *Duration
		def   time.Duration
	}{
		{"timeout", &sc.Timeout, 5 * time.Second},
		{"refresh", &sc.Refresh, 250 * time.Millisecond},
		{"deadline_slack", &sc.DeadlineSlack, 10 * time.Second},
		{"lost_grace", &sc.LostGrace, time.Second},
		{"retry_backoff", &sc.RetryBackoff, 100 * time.Millisecond},
		{"retry_backoff_max", &sc.RetryBackoffMax, 5 * time.Second},
		{"node_ttl", &sc.NodeTTL, 10 * time.Second},
		{"window.size", &sc.Window.Size, 5 * time.Minute},
		{"window.bucket", &sc.Window.Bucket, 10 * time.Second},
		{"window.recent", &sc.Window.Recent, 0},
	} {
		if *d.v < 0 || d.v.D() > MaxDuration {
			return invalid(d.field, "%v is outside 0..%v", d.v.D(), MaxDuration)
		}
		if *d.v == 0 {
			*d.v = Duration(d.def)
		}
	}
	if sc.Window.Bucket > sc.Window.Size {
		return invalid("window.bucket", "%v is larger than window.size (%v)", sc.Window.Bucket.D(), sc.Window.Size.D())
	}
	if sc.Window.Recent == 0 {
		sc.Window.Recent = Duration(min(2*sc.Window.Bucket.D(), sc.Window.Size.D()))
	}
	if sc.Window.Recent > sc.Window.Size {
		return invalid("window.recent", "%v is larger than window.size (%v)", sc.Window.Recent.D(), sc.Window.Size.D())
	}
	if sc.Refresh.D() < time.Millisecond {
		return invalid("refresh", "%v is below 1ms", sc.Refresh.D())
	}
	if sc.ChangeAt != nil && (*sc.ChangeAt < 0 || sc.ChangeAt.D() > MaxDuration) {
		return invalid("change_at", "%v is outside 0..%v", sc.ChangeAt.D(), MaxDuration)
	}
	if sc.trace == nil && (math.IsNaN(sc.Arrival.Rate) || sc.Arrival.Rate < minRate || sc.Arrival.Rate > maxRate) {
		return invalid("arrival.rate", "%g: want tasks per second > 0, in %g..%g", sc.Arrival.Rate, minRate, maxRate)
	}
	for i, st := range sc.Arrival.Profile {
		f := fmt.Sprintf("arrival.profile[%d]", i)
		if math.IsNaN(st.Rate) || st.Rate < minRate || st.Rate > maxRate {
			return invalid(f+".rate", "%g: want tasks per second in %g..%g", st.Rate, minRate, maxRate)
		}
		if st.At < 0 || st.At.D() > MaxDuration || (i > 0 && st.At <= sc.Arrival.Profile[i-1].At) {
			return invalid(f+".at", "%v: want increasing times in 0..%v", st.At.D(), MaxDuration)
		}
	}
	if len(sc.Arrival.Types) == 0 {
		return invalid("arrival.types", "no task types")
	}
	var wsum float64
	for typ, w := range sc.Arrival.Types {
		if err := validName("arrival.types", typ); err != nil {
			return err
		}
		if math.IsNaN(w) || math.IsInf(w, 0) || w < 0 {
			return invalid("arrival.types."+typ, "weight %g is not a finite number >= 0", w)
		}
		wsum += w
	}
	if wsum <= 0 {
		return invalid("arrival.types", "weights sum to 0")
	}
	if len(sc.Models) == 0 {
		return invalid("models", "no models")
	}
	if len(sc.Models) > maxModels {
		return invalid("models", "%d models, at most %d", len(sc.Models), maxModels)
	}
	if len(sc.Nodes) > maxNodes {
		return invalid("nodes", "%d nodes, at most %d", len(sc.Nodes), maxNodes)
	}
	if len(sc.Events) > maxEvents {
		return invalid("events", "%d events, at most %d", len(sc.Events), maxEvents)
	}
	models := map[string]*Model{}
	served := map[string]bool{}
	for i := range sc.Models {
		m := &sc.Models[i]
		f := fmt.Sprintf("models[%d]", i)
		if err := validName(f+".name", m.Name); err != nil {
			return err
		}
		if models[m.Name] != nil {
			return invalid(f+".name", "duplicate model %q", m.Name)
		}
		models[m.Name] = m
		if len(m.Types) == 0 {
			return invalid(f+".types", "model %q serves no task type", m.Name)
		}
		for j, t := range m.Types {
			if err := validName(fmt.Sprintf("%s.types[%d]", f, j), t); err != nil {
				return err
			}
			served[t] = true
		}
		if len(m.Profile) == 0 {
			return invalid(f+".profile", "model %q has no profile steps", m.Name)
		}
		if b := m.Batch; b != nil {
			if b.MaxSize < 1 || b.MaxSize > 4096 {
				return invalid(f+".batch.max_size", "%d is outside 1..4096", b.MaxSize)
			}
			if b.PerItem < 0 {
				return invalid(f+".batch.per_item", "%v is negative", b.PerItem.D())
			}
		}
		for j := range m.Profile {
			s := &m.Profile[j]
			sf := fmt.Sprintf("%s.profile[%d]", f, j)
			if j == 0 {
				if s.At != 0 {
					return invalid(sf+".at", "the first step must be at 0s, not %v", s.At.D())
				}
				if s.FailureProb == nil {
					return invalid(sf+".failure_prob", "required in the first step")
				}
				if s.Latency == nil {
					return invalid(sf+".latency", "required in the first step")
				}
			} else {
				if s.At.D() > MaxDuration {
					return invalid(sf+".at", "%v is beyond %v", s.At.D(), MaxDuration)
				}
				if s.At <= m.Profile[j-1].At {
					return invalid(sf+".at", "%v is not after the previous step (%v)", s.At.D(), m.Profile[j-1].At.D())
				}
				if s.FailureProb == nil {
					s.FailureProb = m.Profile[j-1].FailureProb
				}
				if s.Latency == nil {
					s.Latency = m.Profile[j-1].Latency
				}
				if s.LatencyPerUnit == nil {
					s.LatencyPerUnit = m.Profile[j-1].LatencyPerUnit
				}
			}
			if err := validProb(sf+".failure_prob", *s.FailureProb); err != nil {
				return err
			}
			if err := s.Latency.validate(sf + ".latency"); err != nil {
				return err
			}
			if s.LatencyPerUnit != nil && (*s.LatencyPerUnit < 0 || s.LatencyPerUnit.D() > time.Hour) {
				return invalid(sf+".latency_per_unit", "%v is outside 0..1h", s.LatencyPerUnit.D())
			}
		}
	}
	for typ := range sc.Arrival.Types {
		if !served[typ] && sc.Arrival.Types[typ] > 0 {
			return invalid("arrival.types."+typ, "no model serves task type %q", typ)
		}
	}
	if len(sc.Nodes) == 0 {
		return invalid("nodes", "no nodes")
	}
	nodes := map[string]bool{}
	hosted := map[string]bool{}
	for i := range sc.Nodes {
		n := &sc.Nodes[i]
		f := fmt.Sprintf("nodes[%d]", i)
		if err := validName(f+".name", n.Name); err != nil {
			return err
		}
		if nodes[n.Name] {
			return invalid(f+".name", "duplicate node %q", n.Name)
		}
		nodes[n.Name] = true
		if n.Capacity < 0 || n.Capacity > maxCapacity {
			return invalid(f+".capacity", "%d is outside 1..%d", n.Capacity, maxCapacity)
		}
		if n.Capacity == 0 {
			n.Capacity = 16
		}
		if math.IsNaN(n.Slowdown) || n.Slowdown < 0 || n.Slowdown > 1000 {
			return invalid(f+".slowdown", "%g is outside 0..1000", n.Slowdown)
		}
		if n.Slowdown == 0 {
			n.Slowdown = 1
		}
		if len(n.Models) == 0 {
			return invalid(f+".models", "node %q hosts no model", n.Name)
		}
		for j, m := range n.Models {
			if models[m] == nil {
				return invalid(fmt.Sprintf("%s.models[%d]", f, j), "unknown model %q", m)
			}
			hosted[m] = true
		}
	}
	for i, m := range sc.Models {
		if !hosted[m.Name] {
			return invalid(fmt.Sprintf("models[%d]", i), "model %q is hosted by no node", m.Name)
		}
	}
	for i := range sc.Events {
		e := &sc.Events[i]
		f := fmt.Sprintf("events[%d]", i)
		if e.At < 0 || e.At.D() > MaxDuration {
			return invalid(f+".at", "%v is outside 0..%v", e.At.D(), MaxDuration)
		}
		if e.Until.D() > MaxDuration {
			return invalid(f+".until", "%v is beyond %v", e.Until.D(), MaxDuration)
		}
		switch e.Kind {
		case EventNodeCrash, EventNodeRecover:
			if !nodes[e.Node] {
				return invalid(f+".node", "unknown node %q", e.Node)
			}
		case EventModelJoin:
			if models[e.Model] == nil {
				return invalid(f+".model", "unknown model %q", e.Model)
			}
		case EventFailureBurst:
			if e.Until <= e.At {
				return invalid(f+".until", "%v is not after at (%v)", e.Until.D(), e.At.D())
			}
			if err := validProb(f+".failure_prob", e.FailureProb); err != nil {
				return err
			}
			for j, m := range e.Models {
				if models[m] == nil {
					return invalid(fmt.Sprintf("%s.models[%d]", f, j), "unknown model %q", m)
				}
			}
		case "":
			return invalid(f+".kind", "missing (want %s, %s, %s or %s)", EventNodeCrash, EventNodeRecover, EventModelJoin, EventFailureBurst)
		default:
			return invalid(f+".kind", "unknown kind %q (want %s, %s, %s or %s)", e.Kind, EventNodeCrash, EventNodeRecover, EventModelJoin, EventFailureBurst)
		}
	}
	if err := sc.validateFlows(); err != nil {
		return err
	}
	if err := sc.validatePipelines(); err != nil {
		return err
	}
	if err := sc.validateCosts(); err != nil {
		return err
	}
	if sc.Rollout != nil {
		return sc.Rollout.validate(sc)
	}
	return nil
}

// validateFlows checks the flow-control fields with the bounds of the wire
// protocol (docs/protocol.md) and fills their defaults.
func (sc *Scenario) validateFlows() error {
	names := map[string]bool{}
	for i := range sc.Arrival.Flows {
		fl := &sc.Arrival.Flows[i]
		f := fmt.Sprintf("arrival.flows[%d]", i)
		if math.IsNaN(fl.Share) || math.IsInf(fl.Share, 0) || fl.Share <= 0 {
			return invalid(f+".share", "%g: want a relative weight > 0", fl.Share)
		}
		if fl.Priority < protocol.MinPriority || fl.Priority > protocol.MaxPriority {
			return invalid(f+".priority", "%d is outside %d..%d", fl.Priority, protocol.MinPriority, protocol.MaxPriority)
		}
		if fl.Tenant == "" {
			fl.Tenant = protocol.DefaultTenant
		}
		if err := protocol.ValidToken(fl.Tenant, protocol.MaxTenantLen); err != nil {
			return invalid(f+".tenant", "%q: %v", fl.Tenant, err)
		}
		if fl.Deadline < 0 || fl.Deadline.D() > time.Duration(protocol.DefaultLimits.MaxDeadlineMs)*time.Millisecond {
			return invalid(f+".deadline", "%v is outside 0..24h", fl.Deadline.D())
		}
		if fl.Name == "" {
			fl.Name = fmt.Sprintf("%s/p%d", fl.Tenant, fl.Priority)
		}
		if err := validName(f+".name", fl.Name); err != nil {
			return err
		}
		if names[fl.Name] {
			return invalid(f+".name", "duplicate flow %q", fl.Name)
		}
		names[fl.Name] = true
	}
	for tenant, w := range sc.TenantWeights {
		if err := protocol.ValidToken(tenant, protocol.MaxTenantLen); err != nil {
			return invalid("tenant_weights", "%q: %v", tenant, err)
		}
		if math.IsNaN(w) || w <= 0 || w > 1000 {
			return invalid("tenant_weights."+tenant, "%g is outside (0, 1000]", w)
		}
	}
	if sc.QueueTarget.D() > MaxDuration {
		return invalid("queue_target", "%v is over %v (negative: off)", sc.QueueTarget.D(), MaxDuration)
	}
	if sc.MaxAckPending < 0 || sc.MaxAckPending > 1_000_000 {
		return invalid("max_ack_pending", "%d is outside 1..1000000", sc.MaxAckPending)
	}
	if sc.MaxAckPending == 0 {
		sc.MaxAckPending = 2048
	}
	if sc.ParkAbove < -1 || sc.ParkAbove > 1_000_000 {
		return invalid("park_above", "%d is outside 1..1000000 (-1: off)", sc.ParkAbove)
	}
	if sc.ParkAbove == 0 {
		sc.ParkAbove = 256
	}
	if sc.Prefetch < -1 || sc.Prefetch > 1_000_000 {
		return invalid("prefetch", "%d is outside 1..1000000 (-1: arrival order)", sc.Prefetch)
	}
	if sc.Prefetch == 0 {
		sc.Prefetch = 32
	}
	return nil
}

// step returns the model's profile step in force at offset t.
func (m *Model) step(t time.Duration) *Step {
	i := sort.Search(len(m.Profile), func(i int) bool { return m.Profile[i].At.D() > t })
	return &m.Profile[i-1]
}

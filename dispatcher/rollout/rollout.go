// Package rollout is the state machine of a model version's rollout: the
// steps of exposure it earns, the sequential test that promotes it or rolls
// it back, and the record of every transition. It is pure: the dispatcher
// (dispatcher/rollouts.go) stores a Rollout in the MLSCHED_ROLLOUTS KV
// bucket, feeds it first-attempt outcomes and applies its Share as a cap
// (dispatcher/internal/policy Split), and the simulator drives the same type.
package rollout

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/mlsched/mlsched/shared/protocol"
)

// State is where a rollout is.
type State string

const (
	// Running: the new version gets its step's share; the test decides.
	Running State = "running"
	// Paused: the share holds and nothing is decided automatically.
	Paused State = "paused"
	// Promoted: the new version takes every task of its family (final).
	Promoted State = "promoted"
	// RolledBack: the test, the breaker or the timeout rule found the new
	// version worse: its share is 0 (final).
	RolledBack State = "rolled_back"
	// Aborted: an operator stopped the rollout: its share is 0 (final).
	Aborted State = "aborted"
)

// Final reports whether no transition leaves the state.
func (s State) Final() bool { return s == Promoted || s == RolledBack || s == Aborted }

// ErrInvalid is wrapped by every error of a bad Spec or a refused command.
var ErrInvalid = errors.New("invalid rollout")

// Defaults of a Spec's zero fields.
const (
	DefaultMinTasks      = 300
	DefaultMaxDrop       = 0.01
	DefaultAlpha         = 0.01
	DefaultBeta          = 0.05
	DefaultTimeoutMargin = 0.02
)

// DefaultSteps are the shares, in percent, of a rollout that names none.
var DefaultSteps = []float64{1, 5, 25, 50, 100}

// Spec is what an operator declares.
type Spec struct {
	// Model is the new version, family@version.
	Model string `json:"model"`
	// Steps are the shares of the family's tasks, in percent, the new
	// version gets in turn; increasing, in (0, 100]. Reaching 100, or
	// passing the last step, promotes it.
	Steps []float64 `json:"steps"`
	// MinTasks is the fewest first-attempt outcomes of the new version in
	// a step before it may be promoted out of it.
	MinTasks int64 `json:"min_tasks"`
	// MaxDrop is the largest drop of first-attempt success, absolute
	// (0.01 = 1 pp), the new version may show.
	MaxDrop float64 `json:"max_drop"`
	// Alpha and Beta are the test's error rates per step (SPRT).
	Alpha float64 `json:"alpha"`
	Beta  float64 `json:"beta"`
	// TimeoutMargin: the new version is rolled back when its timeout rate
	// exceeds the incumbent's by more than this (absolute).
	TimeoutMargin float64 `json:"timeout_margin"`
	// Split, when set, pins the new version's share at this percent with
	// no promotion (an A/B comparison); rollback still applies.
	Split float64 `json:"split,omitempty"`
}

// Family is the family the rollout is of.
func (s Spec) Family() string { return protocol.ModelFamily(s.Model) }

// WithDefaults fills the zero fields.
func (s Spec) WithDefaults() Spec {
	if len(s.Steps) == 0 && s.Split == 0 {
		s.Steps = slices.Clone(DefaultSteps)
	}
	if s.Split > 0 {
		s.Steps = []float64{s.Split}
	}
	if s.MinTasks == 0 {
		s.MinTasks = DefaultMinTasks
	}
	if s.MaxDrop == 0 {
		s.MaxDrop = DefaultMaxDrop
	}
	if s.Alpha == 0 {
		s.Alpha = DefaultAlpha
	}
	if s.Beta == 0 {
		s.Beta = DefaultBeta
	}
	if s.TimeoutMargin == 0 {
		s.TimeoutMargin = DefaultTimeoutMargin
	}
	return s
}

// Validate checks a spec with its defaults filled.
func (s Spec) Validate() error {
	if err := protocol.ValidToken(s.Model, 128); err != nil {
		return fmt.Errorf("%w: model %q: %v", ErrInvalid, s.Model, err)
	}
	if protocol.ModelVersion(s.Model) == "" {
		return fmt.Errorf("%w: model %q names no version: give family@version (e.g. fraud@v8)", ErrInvalid, s.Model)
	}
	if s.Split < 0 || s.Split >= 100 {
		return fmt.Errorf("%w: split %g%% for the new version: want more than 0 and less than 100", ErrInvalid, s.Split)
	}
	prev := 0.0
	for _, st := range s.Steps {
		if !(st > prev && st <= 100) {
			return fmt.Errorf("%w: steps %s: want increasing shares in (0, 100]", ErrInvalid, FormatSteps(s.Steps))
		}
		prev = st
	}
	if s.MinTasks < 1 {
		return fmt.Errorf("%w: min-tasks %d: want at least 1", ErrInvalid, s.MinTasks)
	}
	if !(s.MaxDrop > 0 && s.MaxDrop < 0.5) {
		return fmt.Errorf("%w: max-drop %g: want more than 0 and less than 0.5 (50pp)", ErrInvalid, s.MaxDrop)
	}
	if !(s.Alpha > 0 && s.Alpha < 0.5 && s.Beta > 0 && s.Beta < 0.5) {
		return fmt.Errorf("%w: alpha %g, beta %g: want each in (0, 0.5)", ErrInvalid, s.Alpha, s.Beta)
	}
	if !(s.TimeoutMargin > 0 && s.TimeoutMargin < 1) {
		return fmt.Errorf("%w: timeout margin %g: want in (0, 1)", ErrInvalid, s.TimeoutMargin)
	}
	return nil
}

// Test is the spec's sequential test.
func (s Spec) Test() SPRT { return SPRT{MaxDrop: s.MaxDrop, Alpha: s.Alpha, Beta: s.Beta} }

// Evidence is what a rollback (or a promotion) rested on.
type Evidence struct {
	New       Counts  `json:"new"`
	Incumbent Counts  `json:"incumbent"`
	NewRate   float64 `json:"new_failure_rate"`
	IncRate   float64 `json:"incumbent_failure_rate"`
	LLR       float64 `json:"llr"`
	Lower     float64 `json:"llr_lower"`
	Upper     float64 `json:"llr_upper"`
	Verdict   string  `json:"verdict"`
}

// Event is one transition, kept in the history.
type Event struct {
	At    time.Time `json:"at"`
	Model string    `json:"model"`
	From  State     `json:"from,omitempty"`
	To    State     `json:"to"`
	// Step is the step index after the transition, Share its percent.
	Step  int     `json:"step"`
	Share float64 `json:"share"`
	// By is "auto" or "operator".
	By       string    `json:"by"`
	Reason   string    `json:"reason"`
	Evidence *Evidence `json:"evidence,omitempty"`
}

// HistoryLimit is how many events a family's record keeps.
const HistoryLimit = 200

// Rollout is a family's current (or last) rollout and its history. It is
// the value of the family's key in the KV bucket.
type Rollout struct {
	Spec
	State State `json:"state"`
	// Step indexes Spec.Steps.
	Step int `json:"step"`
	// New and Incumbent are the step's first-attempt outcomes.
	New       Counts    `json:"new_counts"`
	Incumbent Counts    `json:"incumbent_counts"`
	Started   time.Time `json:"started"`
	StepSince time.Time `json:"step_since"`
	Updated   time.Time `json:"updated"`
	// Evidence is the last automatic decision's (set on rollback).
	Evidence *Evidence `json:"evidence,omitempty"`
	History  []Event   `json:"history"`
}

// Start begins a rollout of spec at its first step; prev, if not nil, is
// the family's earlier record, whose history carries over. A running or
// paused rollout of the family must be finished first.
func Start(spec Spec, prev *Rollout, now time.Time) (*Rollout, error) {
	spec = spec.WithDefaults()
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	r := &Rollout{Spec: spec, Started: now, StepSince: now}
	if prev != nil {
		if !prev.State.Final() {
			return nil, fmt.Errorf("%w: %s is %s in family %s: promote or abort it first", ErrInvalid, prev.Model, prev.State, prev.Family())
		}
		r.History = slices.Clone(prev.History)
	}
	r.transition(now, Running, "operator", "started", nil)
	return r, nil
}

// Share is the new version's share of its family's tasks now, in [0, 1].
func (r *Rollout) Share() float64 {
	switch r.State {
	case Running, Paused:
		return r.Steps[r.Step] / 100
	case Promoted:
		return 1
	}
	return 0
}

// Observe counts a first-attempt outcome in the current step.
func (r *Rollout) Observe(isNew bool, c Counts) {
	if r.State.Final() {
		return
	}
	if isNew {
		r.New = r.New.Add(c)
	} else {
		r.Incumbent = r.Incumbent.Add(c)
	}
}

// Evidence is the test's reading of the current step.
func (r *Rollout) evidence() *Evidence {
	t := r.Test()
	v, llr := t.Judge(r.New, r.Incumbent)
	lo, hi := t.Bounds()
	return &Evidence{New: r.New, Incumbent: r.Incumbent, NewRate: r.New.FailureRate(), IncRate: r.Incumbent.FailureRate(),
		LLR: llr, Lower: lo, Upper: hi, Verdict: v.String()}
}

// Reading is the test's current statistic and verdict, for status.
func (r *Rollout) Reading() Evidence { return *r.evidence() }

// Evaluate applies the automatic rules to a running rollout and reports
// whether it changed: rollback when the test says Worse, when the new
// version's breaker is open, or when it times out more than the incumbent
// by TimeoutMargin; promotion to the next step when the test says NotWorse
// and the step has MinTasks outcomes of the new version (never for a
// pinned split). A paused or final rollout does not change.
func (r *Rollout) Evaluate(now time.Time, breakerOpen bool) bool {
	if r.State != Running {
		return false
	}
	ev := r.evidence()
	switch {
	case breakerOpen:
		r.Evidence = ev
		r.transition(now, RolledBack, "auto", "the new version's breaker is open", ev)
	case ev.Verdict == Worse.String():
		r.Evidence = ev
		r.transition(now, RolledBack, "auto", fmt.Sprintf("sequential test: failure rate %.2f%% against the incumbent's %.2f%% is worse by %s (LLR %.2f >= %.2f)",
			100*ev.NewRate, 100*ev.IncRate, FormatDrop(r.MaxDrop), ev.LLR, ev.Upper), ev)
	case timeoutsAbove(r.New, r.Incumbent, r.TimeoutMargin):
		r.Evidence = ev
		r.transition(now, RolledBack, "auto", fmt.Sprintf("timeouts: %.2f%% against the incumbent's %.2f%%, above by more than %s",
			100*r.New.TimeoutRate(), 100*r.Incumbent.TimeoutRate(), FormatDrop(r.TimeoutMargin)), ev)
	case r.Split == 0 && ev.Verdict == NotWorse.String() && r.New.N() >= r.MinTasks:
		r.advance(now, "auto", fmt.Sprintf("sequential test: failure rate %.2f%% against the incumbent's %.2f%%, not worse by %s (LLR %.2f <= %.2f) over %d tasks",
			100*ev.NewRate, 100*ev.IncRate, FormatDrop(r.MaxDrop), ev.LLR, ev.Lower, r.New.N()), ev)
	default:
		return false
	}
	return true
}

// advance moves to the next step, or promotes at 100% or past the last.
func (r *Rollout) advance(now time.Time, by, reason string, ev *Evidence) {
	r.New, r.Incumbent = Counts{}, Counts{}
	r.StepSince = now
	if r.Step+1 >= len(r.Steps) || r.Steps[r.Step+1] >= 100 {
		r.Step = len(r.Steps) - 1
		r.transition(now, Promoted, by, reason, ev)
		return
	}
	r.Step++
	r.transition(now, Running, by, reason, ev)
}

// Command is an operator's action on a rollout.
type Command string

const (
	Pause   Command = "pause"
	Resume  Command = "resume"
	Promote Command = "promote" // to the next step (to 100%: promoted)
	Abort   Command = "abort"
)

// Apply carries out an operator's command.
func (r *Rollout) Apply(cmd Command, now time.Time) error {
	switch {
	case r.State.Final():
		return fmt.Errorf("%w: %s is %s already", ErrInvalid, r.Model, r.State)
	case cmd == Pause && r.State == Running:
		r.transition(now, Paused, "operator", "paused", nil)
	case cmd == Resume && r.State == Paused:
		r.transition(now, Running, "operator", "resumed", nil)
	case cmd == Promote:
		if r.State == Paused {
			r.State = Running
		}
		r.advance(now, "operator", "promoted by hand", r.evidence())
	case cmd == Abort:
		r.transition(now, Aborted, "operator", "aborted", r.evidence())
	case cmd == Pause || cmd == Resume:
		return fmt.Errorf("%w: cannot %s a rollout that is %s", ErrInvalid, cmd, r.State)
	default:
		return fmt.Errorf("%w: unknown command %q (want pause, resume, promote or abort)", ErrInvalid, cmd)
	}
	return nil
}

func (r *Rollout) transition(now time.Time, to State, by, reason string, ev *Evidence) {
	from := r.State
	r.State = to
	r.Updated = now
	r.History = append(r.History, Event{At: now, Model: r.Model, From: from, To: to, Step: r.Step, Share: 100 * r.Share(),
		By: by, Reason: reason, Evidence: ev})
	if n := len(r.History) - HistoryLimit; n > 0 {
		r.History = slices.Delete(r.History, 0, n)
	}
}

// ParseSteps reads "1,5,25,50,100".
func ParseSteps(s string) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(f), "%"), 64)
		if err != nil {
			return nil, fmt.Errorf("%w: steps %q: %q is not a number", ErrInvalid, s, f)
		}
		out = append(out, v)
	}
	return out, nil
}

// FormatSteps writes steps as ParseSteps reads them.
func FormatSteps(steps []float64) string {
	parts := make([]string, len(steps))
	for i, s := range steps {
		parts[i] = strconv.FormatFloat(s, 'g', -1, 64)
	}
	return strings.Join(parts, ",")
}

// ParseDrop reads a drop as "1pp" (percentage points), "1%" (the same) or
// a fraction ("0.01").
func ParseDrop(s string) (float64, error) {
	t := strings.TrimSpace(s)
	scale := 1.0
	for _, suf := range []string{"pp", "%"} {
		if strings.HasSuffix(t, suf) {
			t, scale = strings.TrimSuffix(t, suf), 0.01
			break
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || math.IsNaN(v) {
		return 0, fmt.Errorf("%w: %q: want e.g. 1pp or 0.01", ErrInvalid, s)
	}
	return v * scale, nil
}

// FormatDrop writes an absolute drop in percentage points.
func FormatDrop(d float64) string { return strconv.FormatFloat(100*d, 'g', 3, 64) + "pp" }

// ParseSplit reads "90/10": the incumbent's and the new version's shares,
// summing to 100; it returns the new version's.
func ParseSplit(s string) (float64, error) {
	a, b, ok := strings.Cut(s, "/")
	inc, err1 := strconv.ParseFloat(strings.TrimSpace(a), 64)
	nw, err2 := strconv.ParseFloat(strings.TrimSpace(b), 64)
	if !ok || err1 != nil || err2 != nil || math.Abs(inc+nw-100) > 1e-9 || nw <= 0 || inc <= 0 {
		return 0, fmt.Errorf("%w: split %q: want INCUMBENT/NEW percentages summing to 100, e.g. 90/10", ErrInvalid, s)
	}
	return nw, nil
}

package simulate

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/mlsched/mlsched/dispatcher/internal/policy"
	"github.com/mlsched/mlsched/dispatcher/rollout"
	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/shared/protocol"
)

// ScenarioRollout declares a rollout (dispatcher/rollout) of a new version,
// started at At, as an operator's `mlsched rollout start` would: the
// simulated dispatcher caps the version at each step's share, counts first
// attempts, and evaluates the rollout at every refresh. The oracle ignores
// it.
type ScenarioRollout struct {
	// Model is the new version, family@version; the other versions of the
	// family are the incumbents.
	Model string   `json:"model"`
	At    Duration `json:"at,omitempty"`
	// Steps (percent), MinTasks, MaxDrop (absolute, 0.01 = 1pp) and Split
	// as rollout.Spec (defaults: its defaults).
	Steps    []float64 `json:"steps,omitempty"`
	MinTasks int64     `json:"min_tasks,omitempty"`
	MaxDrop  float64   `json:"max_drop,omitempty"`
	Split    float64   `json:"split,omitempty"`
}

func (sr *ScenarioRollout) spec() rollout.Spec {
	return rollout.Spec{Model: sr.Model, Steps: sr.Steps, MinTasks: sr.MinTasks, MaxDrop: sr.MaxDrop, Split: sr.Split}.WithDefaults()
}

func (sr *ScenarioRollout) validate(sc *Scenario) error {
	if err := sr.spec().Validate(); err != nil {
		return invalid("rollout", "%v", err)
	}
	if !slices.ContainsFunc(sc.Models, func(m Model) bool { return m.Name == sr.Model }) {
		return invalid("rollout.model", "%q is not among the models", sr.Model)
	}
	if sr.At < 0 || sr.At.D() > MaxDuration {
		return invalid("rollout.at", "want a duration in [0, %v]", MaxDuration)
	}
	return nil
}

// RolloutResult is what a run's rollout did.
type RolloutResult struct {
	Model string        `json:"model"`
	Final rollout.State `json:"final_state"`
	Steps []float64     `json:"steps"`
	Step  int           `json:"step"`
	// EndedAfterS is the time from the rollout's start to its promotion or
	// rollback, in simulated seconds (-1: still running at the end).
	EndedAfterS float64 `json:"ended_after_s"`
	// NewTasks are the first attempts the new version took before the
	// rollout ended (all of them for a pinned split or an unfinished one).
	NewTasks int64 `json:"new_first_attempts"`
	// NewFailedFirst are those that failed, and FailedFirstShare their
	// share of every task of the run: the first attempts lost to the
	// canary.
	NewFailedFirst   int64   `json:"new_failed_first_attempts"`
	FailedFirstShare float64 `json:"failed_first_share_of_all"`
	// LostToCanary are tasks whose first attempt failed on the new
	// version and that did not succeed in the end.
	LostToCanary int `json:"lost_to_canary"`
	// MaxOverCapPP is the largest excess, in percentage points, of the new
	// version's share of the family's first attempts over the step's cap,
	// over windows of 200 first attempts inside one step.
	MaxOverCapPP float64         `json:"max_over_cap_pp"`
	History      []rollout.Event `json:"history"`
}

// simRollout runs a scenario's rollout in one simulated replica.
type simRollout struct {
	sc      *ScenarioRollout
	eng     *policy.Engine
	r       *rollout.Rollout
	split   *policy.Split
	started time.Duration
	ended   time.Duration
	res     RolloutResult
	// the current window of the family's first attempts
	win, winNew int
	winStep     int
	canaryFail  map[int]bool // tasks whose first attempt failed on the new version
}

func newSimRollout(sr *ScenarioRollout, eng *policy.Engine) *simRollout {
	return &simRollout{sc: sr, eng: eng, ended: -1, canaryFail: map[int]bool{}, res: RolloutResult{Model: sr.Model}}
}

// tick starts the rollout at its time and evaluates it (every refresh).
func (ro *simRollout) tick(s *sim) {
	if ro.r == nil {
		if s.now < ro.sc.At.D() {
			return
		}
		r, err := rollout.Start(ro.sc.spec(), nil, s.clock())
		if err != nil { // validated with the scenario
			panic(err)
		}
		ro.r, ro.started, ro.winStep = r, s.now, r.Step
		ro.split = policy.NewSplit(r.Model, r.Share())
		ro.eng.SetSplits([]*policy.Split{ro.split})
		return
	}
	if ro.r.Evaluate(s.clock(), false) && ro.r.State.Final() && ro.ended < 0 {
		ro.ended = s.now
	}
	ro.split.SetShare(ro.r.Share())
}

func (ro *simRollout) inFamily(model string) bool {
	return ro.r != nil && protocol.ModelFamily(model) == ro.r.Family()
}

// dispatched sees a first attempt's decision.
func (ro *simRollout) dispatched(model string) {
	if !ro.inFamily(model) || ro.r.State.Final() {
		return
	}
	if ro.r.Step != ro.winStep {
		ro.win, ro.winNew, ro.winStep = 0, 0, ro.r.Step
	}
	ro.win++
	if model == ro.r.Model {
		ro.winNew++
		ro.res.NewTasks++
	}
	if ro.win == rollout.Window {
		ro.res.MaxOverCapPP = max(ro.res.MaxOverCapPP, 100*(float64(ro.winNew)/rollout.Window-ro.r.Share()))
		ro.win, ro.winNew = 0, 0
	}
}

// observed counts a first attempt's outcome.
func (ro *simRollout) observed(task int, model string, kind stats.Kind) {
	if !ro.inFamily(model) {
		return
	}
	c, ok := rollout.CountsOf(kind)
	if !ok {
		return
	}
	isNew := model == ro.r.Model
	if isNew && c.Failures > 0 && !ro.r.State.Final() {
		ro.res.NewFailedFirst++
		ro.canaryFail[task] = true
	}
	ro.r.Observe(isNew, c)
}

func (ro *simRollout) result(s *sim) *RolloutResult {
	res := ro.res
	if ro.r == nil {
		res.Final, res.EndedAfterS = "not_started", -1
		return &res
	}
	res.Final, res.Steps, res.Step, res.History = ro.r.State, ro.r.Steps, ro.r.Step, ro.r.History
	res.EndedAfterS = -1
	if ro.ended >= 0 {
		res.EndedAfterS = (ro.ended - ro.started).Seconds()
	}
	for i := range s.tasks {
		if ro.canaryFail[i] && !s.tasks[i].succeeded {
			res.LostToCanary++
		}
	}
	res.FailedFirstShare = float64(res.NewFailedFirst) / math.Max(float64(len(s.tasks)), 1)
	return &res
}

// rolloutLine is the report's line for a rollout.
func (r *RolloutResult) line() string {
	ended := "still running"
	if r.EndedAfterS >= 0 {
		ended = fmt.Sprintf("after %.0fs", r.EndedAfterS)
	}
	return fmt.Sprintf("rollout %s: %s %s at step %d/%d; %d first attempts on it, %d failed (%.3f%% of all tasks), %d tasks lost to it, share at most %.1fpp over its cap (windows of %d)",
		r.Model, r.Final, ended, r.Step+1, len(r.Steps), r.NewTasks, r.NewFailedFirst, 100*r.FailedFirstShare, r.LostToCanary, r.MaxOverCapPP, rollout.Window)
}

package rollout

import (
	"math/rand/v2"
	"time"

	"github.com/mlsched/mlsched/dispatcher/internal/policy"
)

// Trial is the outcome of one simulated rollout (Simulate).
type Trial struct {
	Final State
	// Tasks is every task of the family routed; NewTasks those the new
	// version took, NewFailures its failed first attempts.
	Tasks, NewTasks, NewFailures int64
	// MaxOverCap is the largest excess, in percentage points, of the new
	// version's share over its step's cap in any window of Window tasks
	// wholly inside one step.
	MaxOverCap float64
}

// Window is the number of tasks over which Simulate measures the share.
const Window = 200

// Simulate runs one rollout of spec on a stream of tasks in which the new
// version fails a first attempt with probability newFail and the
// incumbent with incFail, routing tasks by a policy.Split at the current
// share, as the dispatcher does, and evaluating after every outcome, until the rollout
// ends or maxTasks tasks have run. It is the model of the sequential test's
// error rates; dispatcher/internal/simulate runs rollouts through the whole scheduler.
func Simulate(spec Spec, newFail, incFail float64, seed uint64, maxTasks int64) Trial {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	t0 := time.Unix(0, 0)
	r, err := Start(spec, nil, t0)
	if err != nil {
		panic(err)
	}
	var tr Trial
	var win, winNew int64
	step := r.Step
	split := policy.NewSplit(spec.Model, r.Share())
	for tr.Tasks < maxTasks && !r.State.Final() {
		share := r.Share()
		split.SetShare(share)
		isNew := split.Take()
		fail := rng.Float64() < incFail
		if isNew {
			fail = rng.Float64() < newFail
			tr.NewTasks++
			winNew++
			if fail {
				tr.NewFailures++
			}
		}
		tr.Tasks++
		win++
		c := Counts{Successes: 1}
		if fail {
			c = Counts{Failures: 1}
		}
		r.Observe(isNew, c)
		r.Evaluate(t0.Add(time.Duration(tr.Tasks)*time.Millisecond), false)
		if r.Step != step || r.State.Final() {
			step, win, winNew = r.Step, 0, 0
			continue
		}
		if win == Window {
			tr.MaxOverCap = max(tr.MaxOverCap, 100*(float64(winNew)/Window-share))
			win, winNew = 0, 0
		}
	}
	tr.Final = r.State
	return tr
}

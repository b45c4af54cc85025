package simulate

import (
	"math/rand/v2"
	"slices"
	"time"

	"github.com/mlsched/mlsched/shared/protocol"
)

// Pipelines in a scenario (docs/protocol.md, "Pipelines"; issue 45): a
// share of the tasks run several steps of different types, one after the
// other, each step with its own attempts and the model chosen afresh for
// its type, as the dispatcher runs them. A pipeline succeeds when its last
// step does; a step that fails (attempts exhausted, no candidate in time,
// its deadline passed) fails it. So policies compare on multi-step tasks,
// where a step's failure costs the whole chain.

// PipelineMix is a scenario's share of pipeline tasks.
type PipelineMix struct {
	// Share of the arrivals that are pipelines, in (0, 1].
	Share float64 `json:"share"`
	// MinSteps and MaxSteps bound a pipeline's steps (defaults 2 and 3);
	// each pipeline's count is drawn uniformly between them. Its first
	// step is of the arrival's type, each later one of a type not yet in
	// it, drawn from arrival.types by weight: steps of different types.
	MinSteps int `json:"min_steps,omitempty"`
	MaxSteps int `json:"max_steps,omitempty"`
}

// validatePipelines checks the mix and fills its defaults.
func (sc *Scenario) validatePipelines() error {
	m := sc.Pipelines
	if m == nil {
		return nil
	}
	if !(m.Share > 0 && m.Share <= 1) {
		return invalid("pipelines.share", "%g is outside (0, 1]", m.Share)
	}
	if m.MinSteps == 0 {
		m.MinSteps = 2
	}
	if m.MaxSteps == 0 {
		m.MaxSteps = max(3, m.MinSteps)
	}
	if m.MinSteps < 2 || m.MaxSteps < m.MinSteps || m.MaxSteps > protocol.MaxPipelineSteps {
		return invalid("pipelines", "min_steps %d, max_steps %d: want 2 <= min_steps <= max_steps <= %d", m.MinSteps, m.MaxSteps, protocol.MaxPipelineSteps)
	}
	types := 0
	for _, w := range sc.Arrival.Types {
		if w > 0 {
			types++
		}
	}
	if m.MaxSteps > types {
		return invalid("pipelines.max_steps", "%d steps of different types, but arrival.types has %d with a weight", m.MaxSteps, types)
	}
	return nil
}

// SetPipelines makes share of the scenario's tasks pipelines of 2-3 steps
// (`mlsched simulate -pipelines`); 0 removes them. The scenario must have
// at least 3 task types with a weight.
func (sc *Scenario) SetPipelines(share float64) error {
	if share == 0 {
		sc.Pipelines = nil
		return nil
	}
	sc.Pipelines = &PipelineMix{Share: share}
	return sc.validatePipelines()
}

// newPipeStream is the stream the pipelines are drawn from: its own, so
// that a scenario without pipelines runs exactly as before, and shared by
// every policy's run, as the arrivals are.
func newPipeStream(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 2)) }

// pickSteps makes t a pipeline, by the scenario's share, drawing its steps.
func (s *sim) pickSteps(t *task) {
	m := s.sc.Pipelines
	u, k := s.pipe.Float64(), s.pipe.IntN(m.MaxSteps-m.MinSteps+1)
	if u >= m.Share {
		return
	}
	steps := make([]string, 1, m.MinSteps+k)
	steps[0] = t.typ
	for len(steps) < m.MinSteps+k {
		var sum float64
		for _, typ := range s.types {
			if !slices.Contains(steps, typ) {
				sum += s.sc.Arrival.Types[typ]
			}
		}
		x := s.pipe.Float64() * sum
		pick := ""
		for _, typ := range s.types {
			w := s.sc.Arrival.Types[typ]
			if w == 0 || slices.Contains(steps, typ) {
				continue
			}
			pick = typ
			if x < w {
				break
			}
			x -= w
		}
		steps = append(steps, pick)
	}
	t.steps = steps
}

// nextStep: t's step succeeded and the pipeline goes on. The next step
// starts at once as a task of its type with attempts of its own (the
// dispatcher's hand-off, storing the step's message, about 1 ms, is not
// simulated).
func (s *sim) nextStep(t *task) {
	t.prior += len(t.history)
	t.history = nil
	t.step++
	t.typ = t.steps[t.step]
	t.waitFrom = -1
}

// drawSeed is the seed and key of an attempt's outcome and latency draws: (task,
// attempt) for a plain task and a pipeline's first step, as before
// pipelines, and the step in the stream's seed for a later step.
func (s *sim) drawSeed(a *attempt) (uint64, uint64) {
	seed := s.opt.Seed ^ 0x9e3779b97f4a7c15
	if a.t.step > 0 {
		seed ^= uint64(a.t.step) * 0xbf58476d1ce4e5b9
	}
	return seed, uint64(a.t.idx)<<8 | uint64(a.n)
}

// PipelineSummary is a policy's figures on the pipelines of a scenario
// with pipelines.
type PipelineSummary struct {
	// Pipelines is how many of the tasks were pipelines.
	Pipelines float64 `json:"pipelines"`
	// Success is the share of them that succeeded (every step did);
	// VsOracle the difference to the oracle run's, in points.
	Success  float64 `json:"success"`
	VsOracle float64 `json:"vs_oracle_pp"`
	// Clean is the share that succeeded with every step's first attempt:
	// no retry anywhere along the chain.
	Clean float64 `json:"clean"`
	// PlainSuccess is the final success of the other tasks, same run.
	PlainSuccess float64 `json:"plain_success"`
	// Steps is the mean number of steps per pipeline, StepsRun the mean
	// that ran (a failed step ends its pipeline).
	Steps    float64 `json:"steps"`
	StepsRun float64 `json:"steps_run"`
	// MeanLatencyMs from submission to the pipeline's end, MeanAttempts
	// over all its steps.
	MeanLatencyMs float64 `json:"mean_latency_ms"`
	MeanAttempts  float64 `json:"mean_attempts"`
}

func summarizePipelines(ts []taskResult) *PipelineSummary {
	var p PipelineSummary
	var plain, plainOK, ok int
	var lat time.Duration
	for _, t := range ts {
		if t.steps == 0 {
			plain++
			if t.succeeded {
				plainOK++
			}
			continue
		}
		p.Pipelines++
		if t.succeeded {
			ok++
			if t.attempts == t.steps {
				p.Clean++
			}
		}
		p.Steps += float64(t.steps)
		p.StepsRun += float64(t.stepsRun)
		p.MeanAttempts += float64(t.attempts)
		lat += t.latency
	}
	if plain > 0 {
		p.PlainSuccess = float64(plainOK) / float64(plain)
	}
	if p.Pipelines > 0 {
		p.Success = float64(ok) / p.Pipelines
		p.Clean /= p.Pipelines
		p.Steps /= p.Pipelines
		p.StepsRun /= p.Pipelines
		p.MeanAttempts /= p.Pipelines
		p.MeanLatencyMs = float64(lat) / p.Pipelines / float64(time.Millisecond)
	}
	return &p
}

// aggregatePipelines averages the runs' summaries.
func aggregatePipelines(rs []Result) *PipelineSummary {
	if rs[0].Pipelines == nil {
		return nil
	}
	var out PipelineSummary
	n := float64(len(rs))
	for _, r := range rs {
		p := r.Pipelines
		out.Pipelines += p.Pipelines / n
		out.Success += p.Success / n
		out.VsOracle += p.VsOracle / n
		out.Clean += p.Clean / n
		out.PlainSuccess += p.PlainSuccess / n
		out.Steps += p.Steps / n
		out.StepsRun += p.StepsRun / n
		out.MeanLatencyMs += p.MeanLatencyMs / n
		out.MeanAttempts += p.MeanAttempts / n
	}
	return &out
}

package policy

// cost is the cost policy: among the candidates reliable enough for the
// task (their success lower bound, times their chance to finish in time,
// clears the type's bar), the cheapest; when none is, reliability's
// choice. It answers the question teams with several models for one job
// ask every day: is the cheap model reliable enough? From the measured
// success of each model, not from a price list alone.
//
// Without a task it ranks as reliability does; the engine binds it to each
// task (costChoice) to give it the task's bar and size.
type cost struct {
	// rel is reliability with its exploration: the fallback when no
	// candidate clears the bar, and the whole policy when no candidate
	// declares a cost.
	rel        explore
	minSamples int64
	share      float64
	cap        float64 // Config.CostExploreCap
}

func (cost) Name() string { return Cost }

func (p cost) Choose(r *Rand, cands []*Candidate, q []Queue) int { return p.rel.Choose(r, cands, q) }

// costChoice is the cost policy bound to one task. The engine keeps it in
// the decision's pooled scratch, so that binding allocates nothing.
type costChoice struct {
	cost
	bar  float64 // the success the task must be bought
	size float64 // the task's size, which prices each model
}

// Choose returns the cheapest candidate that clears the bar (ties: the
// higher expected success), or reliability's choice when none does or no
// candidate declares a cost.
//
// Exploration: a share of the decisions (ExploreShare, 5% by default) goes
// to the least measured of the candidates that have fewer than MinSamples
// outcomes (so that the fallbacks stay measured: when the cheap model
// fails, the next one is known at once) or that are cheaper than the
// choice and not yet proven, while their upper bound still lets them clear
// the bar and they hold less than CostExploreCap (1.5%) of the type's
// judged outcomes in the window. So an unproven cheap model never takes
// more than about that cap, and one measured below the bar stops being
// tried once its upper bound falls under it.
func (p *costChoice) Choose(r *Rand, cands []*Candidate, q []Queue) int {
	priced := false
	for _, c := range cands {
		if c.Priced() {
			priced = true
			break
		}
	}
	if !priced {
		return p.rel.Choose(r, cands, q)
	}
	best := -1
	var bestCost, bestScore float64
	for i, c := range cands {
		if !p.clears(c, &q[i]) {
			continue
		}
		cc, sc := c.Cost(p.size), c.Score*q[i].Fit
		if best < 0 || cc < bestCost || cc == bestCost && sc > bestScore {
			best, bestCost, bestScore = i, cc, sc
		}
	}
	if best < 0 {
		return p.rel.Choose(r, cands, q)
	}
	if p.share > 0 && len(cands) > 1 && r.Float64() < p.share {
		var total int64
		for _, c := range cands {
			total += c.Samples()
		}
		limit := p.cap * float64(total)
		i := leastMeasured(r, cands, func(i int) bool {
			c := cands[i]
			if i == best || q[i].Saturated {
				return false
			}
			if c.Samples() < p.minSamples {
				return true
			}
			return c.Cost(p.size) < bestCost && c.Upper*q[i].InTime >= p.bar && float64(c.Samples()) < limit
		})
		if i >= 0 {
			return i
		}
	}
	return best
}

// clears reports whether a candidate is reliable enough for the task: the
// Wilson lower bound reliability ranks by, times the load model's chance
// that the attempt starts and finishes before the deadline, is at least
// the bar, and its nodes can start it in time.
func (p *costChoice) clears(c *Candidate, q *Queue) bool {
	return !q.Saturated && c.Score*q.InTime >= p.bar
}

// barFor is the success a task must be bought: its own min_success_rate
// when it sets one, else its type's Config.MinSuccess, else the "*" entry,
// else DefaultMinSuccess.
func (e *Engine) barFor(req *Request) float64 {
	if req.MinSuccessRate > 0 {
		return req.MinSuccessRate
	}
	if b, ok := e.cfg.MinSuccess[req.Type]; ok {
		return b
	}
	if b, ok := e.cfg.MinSuccess["*"]; ok {
		return b
	}
	return DefaultMinSuccess
}

// MinSuccessFor is the cost policy's bar for a task type (without a
// task's own min_success_rate).
func (e *Engine) MinSuccessFor(taskType string) float64 {
	return e.barFor(&Request{Type: taskType})
}

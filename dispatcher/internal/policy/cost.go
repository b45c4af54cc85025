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
	// rel is reliability with its exploration: the whole policy when no
	// candidate declares a cost, and the fallback (without the posterior
	// draws) when none clears the bar.
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
	// the fallback's candidates that may still clear the bar (reused)
	sub  []*Candidate
	subq []Queue
	idx  []int
}

// Choose returns the cheapest candidate that clears the bar (ties: the
// higher expected success), or reliability's choice when none does or no
// candidate declares a cost.
//
// Exploration: a share of the decisions (ExploreShare, 5% by default) goes
// to the least measured of
//   - the candidates with fewer than MinSamples outcomes, whatever their
//     price, so that every fallback is known a little;
//   - the candidates cheaper than the choice and not proven yet (they may
//     have become good enough);
//   - the standby: the next dearer candidate, while it is not proven and
//     has fewer outcomes than proving the bar takes (proof). When the
//     choice fails (an incident of the cheap model), the standby clears the
//     bar at once and is bought, instead of reliability's choice, which is
//     usually the dearest.
//
// The last two only while their upper bound still lets them clear the
// bar and they hold less than CostExploreCap (1.5%) of the type's judged
// outcomes in the window. So an unproven cheap model never takes more than
// about that cap, and one measured below the bar stops being tried once
// its upper bound falls under it.
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
		return p.fallback(r, cands, q)
	}
	if p.share > 0 && len(cands) > 1 && r.Float64() < p.share {
		var total int64
		standby := -1 // the next dearer candidate, unless it is proven
		for i, c := range cands {
			total += c.Samples()
			if cc := c.Cost(p.size); cc > bestCost && (standby < 0 || cc < cands[standby].Cost(p.size)) {
				standby = i
			}
		}
		if standby >= 0 && p.clears(cands[standby], &q[standby]) {
			standby = -1
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
			if c.Upper*q[i].InTime < p.bar || float64(c.Samples()) >= limit {
				return false
			}
			return c.Cost(p.size) < bestCost || i == standby && float64(c.Samples()) < p.proof()
		})
		if i >= 0 {
			return i
		}
	}
	return best
}

// fallback is reliability's choice among the candidates that may still
// clear the bar (their upper bound, times their chance to finish in time,
// reaches it), or among all of them when none may. A model measured below
// the bar is thus not bought while another may still be good enough: when
// the bar lies between two close models (99.7% and 99.9% against 99.8%),
// reliability alone cannot tell them apart for long and keeps buying the
// cheaper, which the bar excludes.
func (p *costChoice) fallback(r *Rand, cands []*Candidate, q []Queue) int {
	p.sub, p.subq, p.idx = p.sub[:0], p.subq[:0], p.idx[:0]
	for i, c := range cands {
		if c.Upper*q[i].InTime >= p.bar {
			p.sub, p.subq, p.idx = append(p.sub, c), append(p.subq, q[i]), append(p.idx, i)
		}
	}
	// Without reliability's posterior exploration: the dearer models'
	// exploration has its own budget here (CostExploreCap).
	rel := p.rel
	rel.posterior = false
	if len(p.sub) == 0 || len(p.sub) == len(cands) {
		return rel.Choose(r, cands, q)
	}
	return p.idx[rel.Choose(r, p.sub, p.subq)]
}

// proof is about how many judged outcomes a model must have to show that
// it clears the bar: twice those a model without failures needs for its
// bound (at Score's z) to reach it, z²·bar/(1-bar) (about 330 at 0.99).
func (p *costChoice) proof() float64 { return 2 * scoreZ * scoreZ * p.bar / (1 - p.bar) }

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

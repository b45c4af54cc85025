package policy

import (
	"math"
	"sync/atomic"

	"github.com/mlsched/mlsched/shared/protocol"
)

// Split caps a model's share of its family's tasks: a rollout's step
// (dispatcher/rollout). Of the first attempts of tasks its model could take,
// Take sends the model Share and keeps it from the rest, whatever the
// policy prefers; inside that, constraints, breakers, the load model and
// failover apply as ever, and a retry never goes to it (a failed canary
// attempt is retried on the incumbent).
//
// The share is met by error diffusion rather than by a random or hashed
// draw: a credit grows by Share per task and a task goes to the model each
// time it reaches one, so that over any run of n tasks the model gets
// Share*n within one task. Replicas each keep their own credit, so the
// cluster's share is within one task per replica over any window: a random
// draw's share over 200 tasks at 50% strays by 3.5 pp (one standard
// deviation), this one by 0.5 pp per replica.
type Split struct {
	// Model is the capped version, family@version.
	Model  string
	share  atomic.Uint64 // math.Float64bits of the share in [0, 1]
	credit atomic.Int64  // in units of 1/splitUnit tasks
}

const splitUnit = 1 << 30

// NewSplit caps model at share (clamped to [0, 1]).
func NewSplit(model string, share float64) *Split {
	s := &Split{Model: model}
	s.SetShare(share)
	return s
}

// SetShare changes the share (a rollout's next step), keeping the credit.
func (s *Split) SetShare(share float64) {
	if math.IsNaN(share) {
		share = 0
	}
	s.share.Store(math.Float64bits(min(max(share, 0), 1)))
}

// Share is the current share.
func (s *Split) Share() float64 { return math.Float64frombits(s.share.Load()) }

// Take reports whether the next task goes to the model.
func (s *Split) Take() bool {
	sh := s.Share()
	if sh >= 1 {
		return true
	}
	if sh <= 0 {
		return false
	}
	if s.credit.Add(int64(sh*splitUnit)) < splitUnit {
		return false
	}
	s.credit.Add(-splitUnit)
	return true
}

// SetSplits replaces the engine's splits (nil or empty: none). Splits of
// models no candidate of a task's type serves are ignored for it.
func (e *Engine) SetSplits(splits []*Split) {
	if len(splits) == 0 {
		e.splits.Store(nil)
		return
	}
	cp := append([]*Split(nil), splits...)
	e.splits.Store(&cp)
}

// splitOf returns the split of a model, nil if none.
func splitOf(splits []*Split, model string) *Split {
	for _, sp := range splits {
		if sp.Model == model {
			return sp
		}
	}
	return nil
}

// pinned reports whether the allow-list names the model itself (not its
// family): such a task is not subject to the model's split.
func pinned(req *Request, model string) bool {
	for _, m := range req.Models {
		if m == model {
			return true
		}
	}
	return false
}

// steer applies the splits to a decision: it returns the candidate the
// task must go to (a split's model that took it), and marks in s.capped
// the candidates the task must not go to. ok is false when no split
// concerns the type.
func (e *Engine) steer(s *scratch, te *typeEntry, req *Request, splits []*Split) (forced *typeCand) {
	s.capped = s.capped[:0]
	for _, tc := range te.cands {
		sp := splitOf(splits, tc.m.Model)
		if sp == nil || !protocol.AllowedBy(req.Models, tc.m.Model) || pinned(req, tc.m.Model) {
			continue
		}
		if forced == nil && len(req.Tried) == 0 && sp.Take() {
			forced = tc
			continue
		}
		s.capped = append(s.capped, tc)
	}
	return forced
}

package finish

import (
	"sync"
	"sync/atomic"

	"github.com/mlsched/mlsched/shared/protocol"
)

// maxTypes bounds the per-type result counts: task types are producers'
// words, and junk ones (each rejected with no_model) must not grow the
// report without limit. The rest are counted under otherTypes.
const maxTypes = 256

const otherTypes = "(other)"

// TypeCounts counts final results per task type, for the dashboard's
// per-type figures.
type TypeCounts struct {
	mu sync.Mutex
	m  map[string]*protocol.TypeCounts
}

func (tc *TypeCounts) Add(typ string, st protocol.Status) {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	if tc.m == nil {
		tc.m = map[string]*protocol.TypeCounts{}
	}
	c := tc.m[typ]
	if c == nil {
		if len(tc.m) >= maxTypes {
			typ = otherTypes
		}
		if c = tc.m[typ]; c == nil {
			c = &protocol.TypeCounts{}
			tc.m[typ] = c
		}
	}
	switch st {
	case protocol.StatusSucceeded:
		c.Succeeded++
	case protocol.StatusFailed:
		c.Failed++
	case protocol.StatusRejected:
		c.Rejected++
	case protocol.StatusCancelled:
		c.Cancelled++
	}
}

func (tc *TypeCounts) Snapshot() map[string]protocol.TypeCounts {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	if len(tc.m) == 0 {
		return nil
	}
	out := make(map[string]protocol.TypeCounts, len(tc.m))
	for k, v := range tc.m {
		out[k] = *v
	}
	return out
}

// Counts are the finisher's counters, cumulative, per replica (the
// dispatcher's Counters embed them).
type Counts struct {
	// Results counts the results stored, Rejected the rejected ones.
	Results, Rejected atomic.Int64
	// Suppressed counts results refused because the task already had one.
	Suppressed atomic.Int64
	// Succeeded and Failed count the stored results by status; Shed the
	// failed ones that waited their deadline with every candidate
	// saturated (code saturated).
	Succeeded, Failed, Shed atomic.Int64
	// Ended counts the tasks ended without being started, by priority
	// band (FlowBands) and flow-control code (FlowCodes): shed counts per
	// band, with bounded labels.
	Ended [3][3]atomic.Int64
	// Expired counts tasks whose deadline_ms passed before they started:
	// found by admission, or by the outcome stage at the node.
	Expired atomic.Int64
	// Types counts results per task type.
	Types TypeCounts
}

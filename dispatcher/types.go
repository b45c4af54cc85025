package dispatcher

import (
	"sync"

	"github.com/mlsched/mlsched/shared/protocol"
)

// maxTypes bounds the per-type result counts: task types are producers'
// words, and junk ones (each rejected with no_model) must not grow the
// report without limit. The rest are counted under otherTypes.
const maxTypes = 256

const otherTypes = "(other)"

// typeCounts counts final results per task type, for the dashboard's
// per-type figures.
type typeCounts struct {
	mu sync.Mutex
	m  map[string]*protocol.TypeCounts
}

func (tc *typeCounts) add(typ string, st protocol.Status) {
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

func (tc *typeCounts) snapshot() map[string]protocol.TypeCounts {
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

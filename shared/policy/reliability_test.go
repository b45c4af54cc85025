package policy

import (
	"testing"
	"time"

	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/stats"
)

func TestReliabilityPrefersWellMeasured(t *testing.T) {
	t.Parallel()
	snap := snapshot(map[string]stats.Series{
		"big":   series(970, 30, 20*time.Millisecond, 20*time.Millisecond),
		"small": series(3, 0, 20*time.Millisecond, 0),
	})
	tab := NewTable(snap, []protocol.Heartbeat{hb("n1", "t", 8, "big", "small")}, t0)
	e := engine(t, Config{ExploreShare: -1})
	got := counts(t, e, tab, &Request{Type: "t"}, 200)
	if got["big"] != 200 {
		t.Fatalf("reliability chose %v, want big every time", got)
	}
}

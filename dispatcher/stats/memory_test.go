package stats_test

import (
	"testing"
	"time"

	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/dispatcher/stats/statstest"
)

func TestMemoryConformance(t *testing.T) {
	t.Parallel()
	statstest.Run(t, func(t *testing.T, now func() time.Time) stats.Store {
		return stats.NewMemory(statstest.Window, stats.WithClock(now))
	})
}

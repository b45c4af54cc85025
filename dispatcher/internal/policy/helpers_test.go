package policy

import (
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/shared/protocol"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// series builds a stats series with s successes at lat and f failures at
// failLat.
func series(s, f int64, lat, failLat time.Duration) stats.Series {
	var x stats.Series
	x.Successes = s
	x.ModelErrors = f
	for i := int64(0); i < s; i++ {
		x.Latency.Observe(lat)
	}
	x.FailLatencySumUs = f * failLat.Microseconds()
	x.LastOutcome = t0
	return x
}

// snapshot builds a snapshot from model series; node series are copies of
// the model series unless set later.
func snapshot(models map[string]stats.Series) *stats.Snapshot {
	snap := &stats.Snapshot{Taken: t0, Window: 5 * time.Minute, Models: map[string]*stats.ModelStats{}}
	for name, s := range models {
		snap.Models[name] = &stats.ModelStats{Series: s, Nodes: map[string]*stats.Series{}}
	}
	return snap
}

// hb is a heartbeat of a node hosting models for one type.
func hb(node, typ string, capacity int, models ...string) protocol.Heartbeat {
	h := protocol.Heartbeat{Node: node, Capacity: capacity, SentAt: t0}
	for _, m := range models {
		h.Models = append(h.Models, protocol.ModelInfo{Name: m, Types: []string{typ}})
	}
	return h
}

func engine(t testing.TB, cfg Config) *Engine {
	t.Helper()
	if cfg.Seed == 0 {
		cfg.Seed = testSeed()
	}
	e, err := NewEngine(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// counts runs n decisions and counts the chosen models.
func counts(t testing.TB, e *Engine, tab *Table, req *Request, n int) map[string]int {
	t.Helper()
	out := map[string]int{}
	for i := 0; i < n; i++ {
		d, err := e.Decide(tab, req)
		if err != nil {
			t.Fatal(err)
		}
		out[d.Model]++
	}
	return out
}

func testSeed() uint64 {
	if s := os.Getenv("POLICY_SEED"); s != "" {
		n, _ := strconv.ParseUint(s, 10, 64)
		return n
	}
	return 42
}

package protocol_test

import (
	"math"
	"strings"
	"testing"

	"github.com/mlsched/mlsched/shared/protocol"
)

// A model's declared cost is a number in 0..MaxCost; anything else refuses
// the heartbeat with a message naming the model, so a typo in a models file
// cannot make a model look free or take the cost policy's arithmetic to NaN.
func TestHeartbeatModelCost(t *testing.T) {
	for _, tc := range []struct {
		name          string
		perTask, unit float64
		ok            bool
	}{
		{"none", 0, 0, true},
		{"per task", 1.5, 0, true},
		{"per unit", 0, 0.002, true},
		{"both at the bound", protocol.MaxCost, protocol.MaxCost, true},
		{"negative", -1, 0, false},
		{"negative per unit", 0, -0.1, false},
		{"NaN", math.NaN(), 0, false},
		{"infinite per unit", 0, math.Inf(1), false},
		{"above the bound", protocol.MaxCost * 2, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hb := protocol.Heartbeat{Node: "n1", Capacity: 1, Models: []protocol.ModelInfo{
				{Name: "m", Types: []string{"t"}, CostPerTask: tc.perTask, CostPerUnit: tc.unit}}}
			err := hb.Validate("n1")
			if tc.ok && err != nil {
				t.Fatalf("refused: %v", err)
			}
			if !tc.ok && (err == nil || !strings.Contains(err.Error(), "model m: cost")) {
				t.Fatalf("got %v, want a refusal naming model m's cost", err)
			}
		})
	}
	m := protocol.ModelInfo{CostPerTask: 2, CostPerUnit: 0.01}
	if got := m.Cost(300); got != 5 {
		t.Fatalf("Cost(300) = %g, want 5", got)
	}
}

package protocol

import (
	"fmt"
	"time"
)

// Bounds of a heartbeat. A heartbeat is written by a node, which the
// dispatcher does not trust: its node id becomes a subject token, its
// names become statistics keys, and its capacity steers traffic, so each
// is bounded.
const (
	MaxHeartbeatModels = 64 // models per node
	MaxModelTypes      = 64 // task types per model
	MaxModelTimeout    = 24 * time.Hour
	maxNodeIDLen       = 64
	maxModelNameLen    = 128
	maxTypeLen         = 64
)

// Validate checks a heartbeat stored under key: the node id is the key and
// a subject token, names are tokens, counts and timeouts are bounded.
func (h *Heartbeat) Validate(key string) error {
	if h.Node != key {
		return fmt.Errorf("node %q is stored under key %q", truncate(h.Node, 80), truncate(key, 80))
	}
	if err := ValidToken(h.Node, maxNodeIDLen); err != nil {
		return fmt.Errorf("node id %q %v", truncate(h.Node, 80), err)
	}
	// Load figures (capacity, in-flight) are clamped, not refused: see Clamp.
	if len(h.Models) > MaxHeartbeatModels {
		return fmt.Errorf("%d models, the limit is %d", len(h.Models), MaxHeartbeatModels)
	}
	for _, m := range h.Models {
		if err := ValidToken(m.Name, maxModelNameLen); err != nil {
			return fmt.Errorf("model name %q %v", truncate(m.Name, 80), err)
		}
		if len(m.Types) > MaxModelTypes {
			return fmt.Errorf("model %s: %d task types, the limit is %d", m.Name, len(m.Types), MaxModelTypes)
		}
		for _, t := range m.Types {
			if err := ValidToken(t, maxTypeLen); err != nil {
				return fmt.Errorf("model %s: task type %q %v", m.Name, truncate(t, 80), err)
			}
		}
		if m.TimeoutMs < 0 || m.TimeoutMs > MaxModelTimeout.Milliseconds() {
			return fmt.Errorf("model %s: timeout %d ms is outside 0..%d", m.Name, m.TimeoutMs, MaxModelTimeout.Milliseconds())
		}
		if !validCost(m.CostPerTask) || !validCost(m.CostPerUnit) {
			return fmt.Errorf("model %s: cost %g per task, %g per unit: each must be a number in 0..%g", m.Name, m.CostPerTask, m.CostPerUnit, MaxCost)
		}
	}
	return nil
}

// MaxCost bounds a model's declared cost per task and per unit: far above
// any real price, low enough that a cost times a task's size stays finite.
const MaxCost = 1e9

func validCost(c float64) bool { return c >= 0 && c <= MaxCost } // false for NaN

// maxHostLen bounds a heartbeat's host name (a DNS name's limit).
const maxHostLen = 253

// HostName is the heartbeat's host name when it can be shown as it is: 1
// to 253 bytes of printable ASCII without white space; "" otherwise. A node
// is not trusted, and a name that is not displayable never refuses its
// heartbeat: it is not shown.
func (h *Heartbeat) HostName() string {
	if h.Host == "" || len(h.Host) > maxHostLen {
		return ""
	}
	for i := 0; i < len(h.Host); i++ {
		if c := h.Host[i]; c <= ' ' || c >= 0x7f {
			return ""
		}
	}
	return h.Host
}

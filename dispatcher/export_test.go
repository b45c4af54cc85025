package dispatcher

import "github.com/mlsched/mlsched/shared/protocol"

// SealForTest is d's seal under key, for tests that forge outcomes.
func SealForTest(key []byte, d *protocol.Dispatch) string { return newSealer(key).Seal(d) }

package protocol

import (
	"encoding/json"
	"fmt"
)

// LoadShare is what one dispatcher replica tells the others, on
// topology.SubjectLoad (core NATS, no stream), of the load it changed since
// its last message: per (model, node), the attempts it dispatched there
// minus the outcomes of that pair it settled. A replica settles only the
// outcomes that reach it (direct reports and the outcome stream are shared
// by every replica), so without these messages each replica's count of a
// node's work drifts from the node's between two statistics snapshots, and
// flow control holds tasks for nodes that have room, or sends to nodes
// that have none. The counts are hints for the load model, never for a
// task's fate: a lost message costs accuracy until the next snapshot.
type LoadShare struct {
	// Replica is the sender's random id, so that it ignores its own.
	Replica string      `json:"r"`
	Pairs   []LoadDelta `json:"p"`
}

// LoadDelta is one (model, node)'s change: dispatched minus settled.
type LoadDelta struct {
	Model string `json:"m"`
	Node  string `json:"n"`
	Delta int64  `json:"d"`
}

// Bounds of a LoadShare: a replica sends at most one per few milliseconds.
const (
	MaxLoadPairs = 4096
	MaxLoadDelta = 1 << 20
	maxReplicaID = 64
)

// EncodeLoadShare is the message's one codec.
func EncodeLoadShare(l *LoadShare) ([]byte, error) { return json.Marshal(l) }

// DecodeLoadShare reads and checks a LoadShare: the replica id and the
// names are tokens, the pairs and deltas bounded.
func DecodeLoadShare(data []byte) (LoadShare, error) {
	var l LoadShare
	if err := json.Unmarshal(data, &l); err != nil {
		return LoadShare{}, fmt.Errorf("load share: %w", err)
	}
	if err := ValidToken(l.Replica, maxReplicaID); err != nil {
		return LoadShare{}, fmt.Errorf("load share: replica id %q %v", truncate(l.Replica, 80), err)
	}
	if len(l.Pairs) > MaxLoadPairs {
		return LoadShare{}, fmt.Errorf("load share: %d pairs, the limit is %d", len(l.Pairs), MaxLoadPairs)
	}
	for _, p := range l.Pairs {
		if err := ValidToken(p.Model, maxModelNameLen); err != nil {
			return LoadShare{}, fmt.Errorf("load share: model %q %v", truncate(p.Model, 80), err)
		}
		if err := ValidToken(p.Node, maxNodeIDLen); err != nil {
			return LoadShare{}, fmt.Errorf("load share: node %q %v", truncate(p.Node, 80), err)
		}
		if p.Delta < -MaxLoadDelta || p.Delta > MaxLoadDelta {
			return LoadShare{}, fmt.Errorf("load share: %s on %s: delta %d is outside ±%d", p.Model, p.Node, p.Delta, MaxLoadDelta)
		}
	}
	return l, nil
}

package topology

import (
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Shared holds the settings every process (dispatchers and workers) must
// set alike, declared once: whichever process starts first creates the
// streams and buckets with them, and the node TTL is both the heartbeat
// bucket's TTL and the dispatcher's expiry. Embed it in a process's
// configuration; its variables are MLSCHED_NODE_TTL, MLSCHED_STORAGE and
// MLSCHED_STREAM_REPLICAS.
type Shared struct {
	// NodeTTL: a node without a heartbeat for this long is dead (default 10s).
	NodeTTL time.Duration `envconfig:"NODE_TTL" default:"10s" desc:"a node without heartbeat for this long is dead (the same in every process)"`
	// Storage of the streams created when they do not exist: file or memory
	// (default file).
	Storage string `envconfig:"STORAGE" default:"file" desc:"stream storage when creating streams: file or memory (the same in every process)"`
	// AttemptStorage of MLSCHED_DISPATCH and MLSCHED_OUTCOMES: memory
	// (default) or file. Memory saves an fsync per dispatch and per stored
	// outcome; nothing is lost in a crash, since the task stays in
	// MLSCHED_TASKS until its result is stored (docs/protocol.md).
	AttemptStorage string `envconfig:"ATTEMPT_STORAGE" default:"memory" desc:"storage of the dispatch and outcome streams when creating them: memory (no fsync; a crash costs the attempts in flight, retried from the unacknowledged task) or file (the same in every process)"`
	// StreamReplicas of the streams created when they do not exist (default 1).
	StreamReplicas int `envconfig:"STREAM_REPLICAS" default:"1" desc:"stream replicas when creating streams (the same in every process)"`
}

// Validate checks the values; prefix is the variables' prefix (MLSCHED).
func (s Shared) Validate(prefix string) error {
	switch {
	case s.NodeTTL <= 0:
		return fmt.Errorf("invalid %s_NODE_TTL=%v: must be positive", prefix, s.NodeTTL)
	case s.Storage != "file" && s.Storage != "memory":
		return fmt.Errorf("invalid %s_STORAGE=%v: must be file or memory", prefix, s.Storage)
	case s.AttemptStorage != "" && s.AttemptStorage != "file" && s.AttemptStorage != "memory":
		return fmt.Errorf("invalid %s_ATTEMPT_STORAGE=%v: must be file or memory", prefix, s.AttemptStorage)
	case s.StreamReplicas < 1:
		return fmt.Errorf("invalid %s_STREAM_REPLICAS=%v: must be at least 1", prefix, s.StreamReplicas)
	}
	return nil
}

// Config is the stream configuration they give (ResultsMaxAge at its default).
func (s Shared) Config() Config {
	c := Config{NodeTTL: s.NodeTTL, Replicas: s.StreamReplicas}
	if s.Storage == "memory" {
		c.Storage = jetstream.MemoryStorage
	}
	if s.AttemptStorage != "file" { // "" (a literal Shared): the default, memory
		c.AttemptStorage = jetstream.MemoryStorage
	}
	return c
}

package policy

import (
	"time"

	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/shared/protocol"
)

// Policy names.
const (
	Reliability = "reliability"
	Thompson    = "thompson"
	Latency     = "latency"
	LeastLoaded = "least-loaded"
	RoundRobin  = "round-robin"
	Random      = "random"
	// Cost buys the cheapest model whose success clears the type's bar
	// (Config.MinSuccess), and falls back to reliability when none does
	// (cost.go, docs/policies.md).
	Cost = "cost"
)

// DefaultMinSuccess is the cost policy's success bar for a type that
// Config.MinSuccess does not name.
const DefaultMinSuccess = 0.99

// Config configures an Engine. Zero fields take the defaults shown.
type Config struct {
	// Default policy for types not in PerType (default "reliability").
	Default string
	// PerType maps a task type to a policy name.
	PerType map[string]string
	// MinSamples: a model with fewer judged outcomes in the window is
	// explored rather than excluded (default 20).
	MinSamples int
	// ExploreShare is the share of decisions that go to under-sampled
	// models (default 0.05; negative disables exploration).
	ExploreShare float64
	// LatencyWeight makes thompson prefer faster models among similar ones
	// (default 0: success only).
	LatencyWeight float64
	// MinSuccess is the cost policy's success bar per task type: a model
	// is bought only while the Wilson lower bound reliability ranks by
	// (Candidate.Score), times its chance to finish in time, is at least
	// the bar. A task's own min_success_rate, when set, is its bar. The
	// key "*" sets the bar of the types not named (default
	// DefaultMinSuccess, 0.99). Values in (0, 1).
	MinSuccess map[string]float64
	// CostExploreCap caps what the cost policy's exploration gives a model
	// that is cheaper than its choice and not proven to clear the bar: at
	// most this share of the type's judged outcomes in the window
	// (default 0.015; negative: such a model is never explored, only
	// bought once proven). The idea of a rollout's cap: an unproven cheap
	// model never takes much traffic, whatever its price.
	CostExploreCap float64
	Breaker        BreakerConfig
	// Timeout is the attempt timeout when a Request gives none (default
	// 30s, the dispatcher's default), and Deadline the time from a
	// dispatch to its deadline (default 40s: that timeout plus the
	// dispatcher's default slack). The load model judges queues by them.
	Timeout, Deadline time.Duration
	// QueueTarget bounds what the load model lets a node queue (the
	// dispatcher's MLSCHED_QUEUE_TARGET): a (model, node) counts as
	// saturated once a new attempt would wait plus run longer than its
	// target there, so the backlog waits with the caller (the dispatcher's
	// hold, in flow control's order) instead of on the node. 0 (the
	// default): each pair's target sets itself from the model's measured
	// service time on that node (AutoQueueTarget); > 0: this fixed target
	// for every pair; < 0: none, only the attempt's deadline.
	QueueTarget time.Duration
	// Seed, when non-zero, makes every random choice reproducible for a
	// given sequence of decisions (tests, the simulator). Default 0: seeded
	// from math/rand/v2, so that replicas do not make the same choices.
	Seed uint64
}

// BreakerConfig configures circuit breaking per model and per (model, node).
type BreakerConfig struct {
	// ConsecutiveFailures opens a breaker (default 5).
	ConsecutiveFailures int
	// FailureRate opens a breaker once MinRequests outcomes are seen
	// (default 0.5).
	FailureRate float64
	// MinRequests for the failure-rate rule (default 20).
	MinRequests int
	// Cooldown before an open breaker goes half-open (default 10s).
	Cooldown time.Duration
	// HalfOpenProbes is how many tasks a half-open breaker lets through per
	// cooldown (default 3).
	HalfOpenProbes int
}

// Request is what the engine needs to know about one task.
type Request struct {
	Type           string
	Models         []string // allow-list, empty = any
	MaxLatencyMs   int64
	MinSuccessRate float64
	// Cheapest decides with the cost policy whatever the type's policy:
	// the cheapest model that clears the type's success bar (a budget
	// that degrades at its limit, dispatcher/internal/budget).
	Cheapest bool
	// Size is the task's size in its type's own unit (tokens, pixels;
	// protocol.Task.Size, 0 when it gives none): the cost policy prices
	// each model for it (protocol.ModelInfo.Cost).
	Size float64
	// Tried are the task's earlier attempts: failover prefers a model not
	// tried yet, then a node not tried yet.
	Tried []protocol.Attempt
	// Timeout is the attempt's timeout and Deadline the time from the
	// dispatch to its deadline (the timeout plus the dispatcher's slack); 0
	// takes Config's. An attempt must start and finish before the deadline,
	// and a wait as long as the timeout costs as much as a failed attempt:
	// the load model weighs each node's queue by them.
	Timeout, Deadline time.Duration
	// Ahead says the task goes first where it is sent: nothing held by the
	// caller comes before it in flow control's order, and it overtakes
	// held tasks. A node that orders its queue (Heartbeat.Prefetch) starts
	// it at its next free slot, ahead of the work queued there, as long as
	// that work fits the node's ordered room: the load model counts one
	// slot's wait for it there, not the whole queue.
	Ahead bool
	// Priority is the task's priority. With Ahead and not AheadInBand, it
	// bounds the share of the node's ordered room the task may take
	// (aheadShare): the highest band all of it, the normal band half, the
	// low band a quarter, so that a band whose own flow leads (its tasks
	// while only lower bands are held) cannot fill the room a higher
	// band's next task needs to go first (issue 38, TestFlowTwoModels).
	Priority int
	// AheadInBand: tasks of the task's own band are held and it goes
	// before them (a quiet tenant's while another's are held): its rate
	// is its tenant's share, and it may use the whole ordered room.
	AheadInBand bool
	// FullDeadline: judge queues by the deadline alone, without the queue
	// target (Config.QueueTarget): whether a task held for the target is
	// saturated at all, or only waiting its turn.
	FullDeadline bool
}

// Decision is the chosen model and node.
type Decision struct {
	Model string
	Node  string
	// Panic is set when every candidate's breaker was open and the engine
	// routed among all of them anyway.
	Panic bool
	// Saturated is set when every candidate's nodes already hold more work
	// than they can start before the dispatch's deadline: the decision is
	// the least bad one, and the caller should rather keep the task and
	// decide again when capacity frees up (see docs/policies.md).
	Saturated bool
}

// Transition is a breaker change the dispatcher should write to the store
// with stats.Store.SetBreaker.
type Transition struct {
	Key      stats.BreakerKey
	From, To stats.Breaker
}

package protocol

import (
	"encoding/json"
	"strconv"
	"time"
)

// Status is a task's final status in its Result.
type Status string

const (
	StatusSucceeded Status = "succeeded"
	StatusFailed    Status = "failed"
	StatusRejected  Status = "rejected"
	// StatusCancelled: an operator cancelled the task (`mlsched cancel`)
	// before it had a result; it is not dispatched again and the outcome of
	// a running attempt is ignored as late.
	StatusCancelled Status = "cancelled"
)

// Result is the one final message for a task, published to
// mlsched.results.<id> and kept in the MLSCHED_RESULTS stream.
type Result struct {
	ID        string          `json:"id"`
	Type      string          `json:"type"`
	Status    Status          `json:"status"`
	Model     string          `json:"model,omitempty"`
	Node      string          `json:"node,omitempty"`
	Attempts  int             `json:"attempts"`
	Output    json.RawMessage `json:"output,omitempty"`
	Error     string          `json:"error,omitempty"`
	ErrorCode Code            `json:"error_code,omitempty"`
	LatencyMs float64         `json:"latency_ms"`
	History   []Attempt       `json:"history,omitempty"`
	// FinishedAt is when the dispatcher published the result (RFC 3339).
	FinishedAt time.Time `json:"finished_at"`
	// RetryAfterMs is set on a task shed, expired or over its quota: when a
	// resubmission could be served, estimated from the measured drain rate.
	RetryAfterMs int `json:"retry_after_ms,omitempty"`
	// Steps is a pipeline's record of its steps, in the order they ran;
	// FailedStep names the step a failed pipeline stopped at.
	Steps      []StepRecord `json:"steps,omitempty"`
	FailedStep string       `json:"failed_step,omitempty"`
}

// Attempt is one entry of a result's history.
type Attempt struct {
	Attempt   int           `json:"attempt"`
	Model     string        `json:"model"`
	Node      string        `json:"node"`
	Status    OutcomeStatus `json:"status"`
	Error     string        `json:"error,omitempty"`
	LatencyMs float64       `json:"latency_ms"`
	// BatchWaitMs and DeadlineLeftMs are the outcome's (Outcome): where
	// the attempt's time went on its node.
	BatchWaitMs    float64 `json:"batch_wait_ms,omitempty"`
	DeadlineLeftMs float64 `json:"deadline_left_ms,omitempty"`
}

// OutcomeStatus is how one attempt ended, as a worker reports it.
type OutcomeStatus string

const (
	// OutcomeSuccess: the model produced an output.
	OutcomeSuccess OutcomeStatus = "success"
	// OutcomeModelError: the model failed; counts against the model.
	OutcomeModelError OutcomeStatus = "model_error"
	// OutcomeTimeout: the model did not answer within the task timeout.
	OutcomeTimeout OutcomeStatus = "timeout"
	// OutcomeTaskError: the input was bad; never counts against the model
	// and is never retried.
	OutcomeTaskError OutcomeStatus = "task_error"
	// OutcomeExpired: the worker did not run the dispatch because its
	// deadline had passed or it was superseded.
	OutcomeExpired OutcomeStatus = "expired"
	// OutcomeLost: the dispatcher found the attempt unanswered at its
	// deadline (node died or hung); counts as a timeout for the model.
	OutcomeLost OutcomeStatus = "lost"
	// OutcomeNodeLost: the attempt's node left the registry (its
	// heartbeat expired) with the attempt unanswered: failed over at once,
	// not at its deadline, and not counted against the model (a node's
	// death is not the model's fault). Also an attempt unanswered at its
	// deadline whose node restarted after it was sent, or sent before the
	// sweeping replica's NATS connection was lost and made again.
	OutcomeNodeLost OutcomeStatus = "node_lost"
)

// Failed reports whether the outcome counts against the model.
func (s OutcomeStatus) Failed() bool {
	return s == OutcomeModelError || s == OutcomeTimeout || s == OutcomeLost
}

// Retryable reports whether another attempt may fix it.
func (s OutcomeStatus) Retryable() bool {
	return s == OutcomeModelError || s == OutcomeTimeout || s == OutcomeLost || s == OutcomeExpired || s == OutcomeNodeLost
}

// IsLost reports whether the dispatcher, not a worker, ended the attempt
// as unanswered (lost at its deadline, or its node gone): the attempt is
// superseded, and a late answer of it is refused.
func (s OutcomeStatus) IsLost() bool { return s == OutcomeLost || s == OutcomeNodeLost }

// Outcome is what a worker publishes to mlsched.outcomes.<node> after an
// attempt. The dispatch headers are echoed back on the outcome message, so
// the dispatcher needs no per-task state of its own. Task carries the
// original task bytes when the attempt did not succeed, for a retry.
type Outcome struct {
	TaskID    string          `json:"task_id"`
	Type      string          `json:"type"`
	Attempt   int             `json:"attempt"`
	Model     string          `json:"model"`
	Node      string          `json:"node"`
	Status    OutcomeStatus   `json:"status"`
	Output    json.RawMessage `json:"output,omitempty"`
	Error     string          `json:"error,omitempty"`
	LatencyMs float64         `json:"latency_ms"`
	// BatchWaitMs is how long the attempt waited on its node for its
	// batch to fill or fall due (a batching model's; 0 and absent
	// otherwise): what batching cost it. LatencyMs includes it; neither
	// includes the batch's wait for a node slot after that, as a lone
	// attempt's LatencyMs does not include its own.
	BatchWaitMs float64 `json:"batch_wait_ms,omitempty"`
	// DeadlineLeftMs is what was left of the dispatch's deadline when the
	// node received the dispatch (negative: already past; absent: none).
	// With the task's deadline_ms it tells the time spent before the node
	// (deadline_ms - deadline_left_ms when the task's deadline bounds the
	// dispatch) from the time spent on it.
	DeadlineLeftMs float64         `json:"deadline_left_ms,omitempty"`
	Task           json.RawMessage `json:"task,omitempty"`
}

// MsgID builds the Nats-Msg-Id of a message about one attempt of one
// submission of a task: kind ("d" dispatch, "o" outcome, "l" lost), task id,
// submission (HdrTaskSeq, may be empty) and attempt.
func MsgID(kind, taskID, submission string, attempt int) string {
	if submission == "" {
		return kind + ":" + taskID + ":" + strconv.Itoa(attempt)
	}
	return kind + ":" + taskID + ":" + submission + ":" + strconv.Itoa(attempt)
}

// ModelInfo is one model a node announces.
type ModelInfo struct {
	Name  string   `json:"name"`
	Types []string `json:"types"`
	// TimeoutMs is the model's per-task timeout when the task sets none; the
	// dispatcher derives the dispatch deadline from it.
	TimeoutMs int64 `json:"timeout_ms,omitempty"`
	// MaxConcurrency is the most attempts of this model the node runs at
	// once (0: no limit of its own, only the node's capacity). The worker
	// enforces it; the dispatcher counts it as the model's slots there.
	MaxConcurrency int `json:"max_concurrency,omitempty"`
	// InFlight is how many attempts of this model are running or waiting
	// for a slot on the node.
	InFlight int `json:"in_flight,omitempty"`
	// Version is the model's version when it has one: Name is then
	// family@version (ModelName), and Replaces the version of the same
	// family it replaces, if the models file says.
	Version  string `json:"version,omitempty"`
	Replaces string `json:"replaces,omitempty"`
	// CostPerTask and CostPerUnit are what one attempt of the model costs,
	// in the operator's own unit (cents, credits): CostPerTask + CostPerUnit
	// x the task's Size. Declared in the models file; the cost-aware policy
	// buys the cheapest model reliable enough, and budgets count it. 0 and
	// 0: the model declares no cost.
	CostPerTask float64 `json:"cost_per_task,omitempty"`
	CostPerUnit float64 `json:"cost_per_unit,omitempty"`
	// BatchMaxSize is the most attempts of this model the node runs in one
	// call (dynamic batching; 0: one per call). Each of the model's slots
	// there then holds up to this many attempts: the dispatcher's load
	// model counts them, so that it keeps the batches filled.
	BatchMaxSize int `json:"batch_max_size,omitempty"`
}

// Cost is what one attempt of the model costs for a task of the given size.
func (m ModelInfo) Cost(size float64) float64 { return m.CostPerTask + m.CostPerUnit*size }

// UnreadyModel is a hosted model a node does not announce, and why.
type UnreadyModel struct {
	Name   string `json:"name"`
	Reason string `json:"reason"`
	// Types are the task types the model serves once ready, so that a
	// dispatcher can tell a task whose only candidates are unready (it is
	// rejected at once, naming them) from one of a type nobody hosts.
	Types []string `json:"types,omitempty"`
	// Transient: the model withdrew itself for a short while (a model
	// server's 429 Retry-After cooldown) and is expected back by itself;
	// its tasks wait for it as for a starting node.
	Transient bool `json:"transient,omitempty"`
}

// Heartbeat is what a worker node announces, every heartbeat interval, in
// the MLSCHED_NODES key-value bucket under its node id.
type Heartbeat struct {
	Node string `json:"node"`
	// Host is the node's host name (in compose, its container's: the
	// short container id `docker ps` shows), announced so that operators
	// can tell nodes apart: a pool worker's node id is a 56-character key.
	// Informational only (HostName gives a displayable one).
	Host string `json:"host,omitempty"`
	// Models are the models the node serves now: dispatchers route only
	// to these.
	Models []ModelInfo `json:"models"`
	// Unready are models the node hosts but does not announce now (loading,
	// restarting, their server unready, cooling down after a 429), with
	// why: for operators; dispatchers ignore them.
	Unready  []UnreadyModel `json:"unready,omitempty"`
	Capacity int            `json:"capacity"`
	InFlight int            `json:"in_flight"`
	// Queued is the work sent to the node and not started yet: dispatches
	// waiting in the node's stream and those received but waiting for a
	// slot. The dispatcher's load model adds it to InFlight.
	Queued int `json:"queued,omitempty"`
	// Prefetch is how many dispatches beyond Capacity the node takes and
	// starts in priority and tenant order rather than arrival order (0: it
	// starts them in arrival order). A dispatcher may send a task that
	// would go first there beyond its queue target, up to Capacity +
	// Prefetch outstanding (docs/policies.md, "Flow control").
	Prefetch int `json:"prefetch,omitempty"`
	// Draining is set while the node shuts down: route nothing new to it.
	Draining bool `json:"draining,omitempty"`
	// CompactDispatch says the node reads the compact dispatch encoding
	// (HdrDispatch); dispatchers send the v1 headers to a node without it.
	CompactDispatch bool      `json:"compact_dispatch,omitempty"`
	StartedAt       time.Time `json:"started_at"`
	SentAt          time.Time `json:"sent_at"`
}

// DeadLetter is kept in MLSCHED_DLQ: an invalid message or a task that
// exhausted its attempts, with the reason and the original bytes.
type DeadLetter struct {
	Reason   string    `json:"reason"`
	Code     Code      `json:"code"`
	Subject  string    `json:"subject"`
	TaskID   string    `json:"task_id,omitempty"`
	History  []Attempt `json:"history,omitempty"`
	Original []byte    `json:"original"` // base64 in JSON: the bytes may not be JSON
	// Truncated is set when Original holds only the first
	// MaxDeadLetterOriginal bytes of a larger message; OriginalBytes and
	// OriginalSHA256 then describe the whole message. A truncated entry
	// cannot be replayed.
	Truncated      bool      `json:"truncated,omitempty"`
	OriginalBytes  int       `json:"original_bytes,omitempty"`
	OriginalSHA256 string    `json:"original_sha256,omitempty"`
	At             time.Time `json:"at"`
}

// Bounds of the load figures a heartbeat may announce; Clamp brings a
// figure outside them back in.
const (
	MaxCapacity = 1 << 16
	MaxQueued   = 1 << 24
	// MaxBatchSize bounds a model's announced batch size (the models
	// file's own bound is lower).
	MaxBatchSize = 1 << 16
)

// Clamp brings absurd load figures (negative, or above MaxCapacity or
// MaxQueued) back within bounds, and returns a description of each change
// (nil when none), for the caller to log. A node announcing nonsense is
// still routed to, as if it had announced the nearest sane figure.
func (h *Heartbeat) Clamp() []string {
	var out []string
	fix := func(name string, v *int, lo, hi int) {
		if *v < lo || *v > hi {
			out = append(out, name+" "+strconv.Itoa(*v)+" clamped to "+strconv.Itoa(min(max(*v, lo), hi)))
			*v = min(max(*v, lo), hi)
		}
	}
	fix("capacity", &h.Capacity, 0, MaxCapacity)
	fix("in_flight", &h.InFlight, 0, MaxQueued)
	fix("queued", &h.Queued, 0, MaxQueued)
	fix("prefetch", &h.Prefetch, 0, MaxQueued)
	for i := range h.Models {
		m := &h.Models[i]
		fix("model "+m.Name+" max_concurrency", &m.MaxConcurrency, 0, MaxCapacity)
		fix("model "+m.Name+" in_flight", &m.InFlight, 0, MaxQueued)
		fix("model "+m.Name+" batch_max_size", &m.BatchMaxSize, 0, MaxBatchSize)
	}
	return out
}

// MaxDeadLetterOriginal bounds the original bytes a dead letter keeps, so
// that the dead letter of an oversized message still fits the server's
// max_payload (base64 grows it by a third).
const MaxDeadLetterOriginal = 64 << 10

// TruncateOriginal keeps at most MaxDeadLetterOriginal bytes of the
// original, recording the whole message's size and SHA-256.
func (dl *DeadLetter) TruncateOriginal() {
	if len(dl.Original) <= MaxDeadLetterOriginal {
		return
	}
	dl.Truncated, dl.OriginalBytes, dl.OriginalSHA256 = true, len(dl.Original), TaskSum(dl.Original)
	dl.Original = dl.Original[:MaxDeadLetterOriginal:MaxDeadLetterOriginal]
}

// Package worker is an mlsched worker node: it hosts models, consumes the
// dispatches the dispatcher routes to the node, runs each on the chosen
// model and reports an Outcome, and announces the node by heartbeat.
//
// One process is one node. The cmd/worker binary configures a node from
// MLSCHED_* variables and a models file; Go programs (demos, end-to-end
// tests, benchmarks) embed nodes with New and Run, and register in-process
// models with WithHandler:
//
//	w, err := worker.New(cfg,
//		worker.WithHandler("upper", func(ctx context.Context, t worker.Task) (any, error) { ... }),
//		worker.WithModels([]worker.ModelSpec{{Name: "upper-v1", Types: []string{"text"},
//			Executor: "go", Go: &model.GoSpec{Handler: "upper"}}}))
//	err = w.Run(ctx) // until ctx ends, then drains
//
// Delivery contract: an outcome is always settled before the dispatch is
// acked, so a crash between the two re-runs the attempt but never loses it.
// A success is first reported straight to a dispatcher (a core-NATS request
// on mlsched.report.<node>, outcomes.go's outcomePublisher), which answers once the task's
// result is stored; without that answer, and for every other outcome, the
// outcome is stored in MLSCHED_OUTCOMES (JetStream-acked) first. Outcomes are published asynchronously, at most
// MLSCHED_CONCURRENCY + MLSCHED_PREFETCH unconfirmed, and the publish's callback acks each
// dispatch through the Completer once its outcome is confirmed (or naks it when the publish fails); the outcome's Nats-Msg-Id ("o:<task>:<attempt>") lets
// JetStream drop the duplicate. A dispatch past its deadline, or too close
// to it for the model's mean run here, is reported expired without running,
// so a restarted node does not work off a stale backlog.
//
// Order: the node takes MLSCHED_PREFETCH dispatches beyond its
// MLSCHED_CONCURRENCY slots and starts the waiting ones highest priority
// first, tenants in turn, oldest first (slots.go), so that what the
// dispatcher sent it waits in flow control's order, not arrival order; its
// heartbeat announces the prefetch, and dispatchers send a task that goes
// first past their queue target (docs/policies.md, "Flow control").
//
// Batching: a model with a batch section (docs/models.md, "Batching") has
// a batcher (batch.go): its dispatches wait there instead of for a slot
// each, and run max_size at a time as one executor call (executor.RunBatch)
// on one slot, when the batch is full, its first task has waited
// max_delay, a deadline cannot wait longer, or the model's tasks come too
// far apart for waiting to gather any. Each task is still reported and
// acked on its own goroutine.
//
// Readiness: a model whose executor can be unready (an http model server, an
// exec process loading or restarting, a model cooling down after a 429 with
// Retry-After) is announced only while ready; the node re-announces at once
// when that changes, and lists the withdrawn models with the reason. The
// models file, executors, error table and protocols are in docs/models.md.
package worker

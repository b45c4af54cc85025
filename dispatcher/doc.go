// Package dispatcher is mlsched's scheduling service. Any number of replicas
// share its durable consumers; none keeps per-task state of its own: what an
// attempt carries is a protocol.Dispatch, sent as the dispatch's headers and
// echoed on its outcome.
//
// A Dispatcher is only wiring (dispatcher.go): run builds every component
// from what it needs and runs them under one lifecycle.Group
// (shared/lifecycle: Start, Stop, Started), starting them in this order and
// stopping them in reverse, reporting every shutdown error:
//
//   - the statistics batcher (dispatcher/stats), flushed at Stop;
//   - superseded.go: the superseded-attempt and cancelled-task set, fed by a
//     watch on MLSCHED_SUPERSEDED;
//   - the node registry (internal/registry), fed by a watch on MLSCHED_NODES;
//   - snapshot.go: the refresher of the statistics snapshot and the decision
//     table, which also writes breaker transitions;
//   - the dispatch and result publishers (shared/jsplumb, each with its own
//     room, so that a dispatch backlog does not hold back results), and the
//     results' group commit (MLSCHED_GROUP_COMMIT: results published while
//     the stream is busy are stored as one atomic batch, one fsync);
//   - the Completer (shared/jsplumb): publish-then-ack, the one place a
//     consumed message (or a direct report) is acked once what handling it
//     published is stored, nak'ed for redelivery otherwise, or kept in
//     progress;
//   - taskack.go: the task keeper; a task stays unacknowledged in
//     MLSCHED_TASKS until its result is stored, so the attempt streams may
//     be in memory (docs/protocol.md, "What is stored where");
//   - sweeper.go: finds attempts still unanswered at their deadline in
//     MLSCHED_DISPATCH (the stream is the in-flight table) and fails them
//     over;
//   - streams.go: the samplers of the streams, off the dispatch path (the
//     backlog per type, and every stream's size against its bounds);
//   - observe.go, admin.go, cancel.go: the HTTP listener and readiness, the
//     dashboard, `mlsched stats` and `mlsched cancel`;
//   - the four stages along a task's path, each a type built from what it
//     needs, and the consumers that feed them (each stage package imports
//     only the stages after it: e2e's TestStagesImportForwardOnly):
//   - intake (package internal/intake: intake.go, park.go), the entry: validate a task (reject or
//     dead-letter bad input), end one already answered or cancelled, park a
//     flooding tenant's tasks beyond its share of a band, and hand the rest
//     to admission;
//   - admission (package internal/admission): each attempt, a task's first
//     or a retry, runs a chain of single-purpose steps that newChain
//     (admission.go) lists in the order they run: expiry, rate quota,
//     decide (the policy engine, internal/policy; a type no node serves
//     waits in unserved.go), hold (for want of capacity, or behind a
//     higher priority: hold.go), concurrency cap, budget, and publish
//     (seal the dispatch, trust.go's sealer, and republish the task bytes
//     unchanged to mlsched.node.<node>.tasks). A kept task resumes at the
//     step that stopped it, with its room's decision; the hold and the
//     waiting room own their queues;
//   - outcome (package internal/outcome, importing only finish after it):
//     a stored outcome of MLSCHED_OUTCOMES or a worker's direct report of
//     a success (a core-NATS request on mlsched.report.<node>, answered
//     with a protocol.ReportReply once the result is stored), checked
//     against its sealed dispatch and settled by the rule of
//     internal/settle: the final result, a retry (the one way back, to
//     admission through the outcome.Retrier it declares), or a failure
//     that is also dead-lettered;
//   - finish (package internal/finish, the last stage: it imports no other,
//     e2e's TestStagesImportForwardOnly): publish the one final result per
//     task (a second one is refused by JetStream's expected-last-subject-
//     sequence check) and, through the one dead-letter publisher, dead
//     letters.
//     A pipeline task (pipeline.go) goes through the same end: a step's
//     success stores the next step as a task message of its own, with the
//     pipeline's sealed progress in a header, instead of the result.
//
// One successful task, from client.Submit to client.Wait, passes through
// these files, in this order (54 files, each named once; the libraries'
// files not counted). e2e's TestDocPathIsTheTraceOfOneTask (make docpath)
// holds the list to the code one task really runs, read from coverage
// counters:
//
//  1. shared/client/client.go: Submit encodes the task and publishes it on
//     mlsched.tasks.<type>; Wait registers with
//  2. shared/client/waiters.go: the client's one results consumer and looks
//     the result up (Result, in client.go);
//  3. shared/client/group.go: the producer's group commit, when it is on;
//  4. shared/topology/topology.go: every subject on the way (task, dispatch,
//     outcome, report, result);
//  5. dispatcher/internal/intake/intake.go: HandleTask takes the task from its band's
//     consumer, then enter hands it to admission (the task has no pipeline:
//     none of pipeline.go's steps to run, docs/protocol.md, "Pipelines");
//  6. shared/protocol/task.go: DecodeTask validates it, in one pass on
//  7. shared/protocol/codec.go: the one codec of task, outcome and result
//     (segmentio/encoding, held to encoding/json's rules);
//  8. dispatcher/stats/window.go: the names a statistics key is made of are
//     checked;
//  9. dispatcher/superseded.go: a cancelled task would end here;
//  10. dispatcher/internal/intake/park.go: whether the tenant's tasks park (they do not);
//  11. dispatcher/internal/admission/admission.go: Dispatch runs admission's
//     chain of steps, in the order newChain lists them (expiry, quota,
//     decide, hold, cap, budget, publish), each one decision:
//  12. dispatcher/flow.go: the expiry step: its own deadline (flow control's
//     rules);
//  13. dispatcher/internal/quota/quota.go: the quota step: the tenant's
//     rate quota;
//  14. dispatcher/internal/admission/stage.go: the decide step asks with the
//     attempt's request (its timeout, by the one rule, and deadline),
//  15. dispatcher/snapshot.go: on the refresher's last decision table;
//  16. dispatcher/internal/policy/engine.go: the decide step: Decide picks
//     the model and the node,
//  17. dispatcher/internal/policy/rand.go: with the decision's own
//     generator,
//  18. dispatcher/internal/policy/policies.go: the policy's Choose,
//  19. dispatcher/internal/policy/load.go: the load model,
//  20. dispatcher/internal/policy/table.go: on the decision table, which
//     counts the dispatch;
//  21. dispatcher/internal/loadshare/loadshare.go: and tells the other
//     replicas (Note; the outcome's count below goes the same way);
//  22. dispatcher/internal/admission/hold.go: the hold step: the band's
//     hold, which this task passes by;
//  23. dispatcher/internal/registry/registry.go: the node's costs and its
//     compact dispatch form;
//  24. dispatcher/internal/quota/concurrency.go: the cap step: the
//     tenant's concurrency cap;
//  25. dispatcher/internal/budget/budget.go: the budget step: the budgets;
//  26. dispatcher/trust.go: the publish step seals the dispatch;
//  27. shared/protocol/dispatch.go: the dispatch's headers,
//  28. shared/protocol/compact.go: in their compact form;
//  29. shared/opshttp/labels.go: the metrics' label sets;
//  30. shared/jsplumb/publisher.go: the dispatch is published; its
//     acknowledgement, read in place, calls back
//  31. dispatcher/internal/admission/drain.go: admission's callback counts the
//     stored dispatch in the drain rate (retry_after_ms), and
//  32. shared/jsplumb/completer.go: which hands the task, unacknowledged,
//  33. dispatcher/taskack.go: to the task keeper until its result;
//  34. dispatcher/rollouts.go: a rollout of the model would count it;
//  35. worker/task.go: the node's consumer hands the dispatch to onMessage,
//  36. worker/redelivered.go: which remembers it until its deadline, so that
//     a delivery of it again (an ack lost in a cluster fault) is not run
//     twice; then process and run (no outcome of it kept from an earlier
//     delivery: that would be worker/unreported.go), then finish and report;
//  37. worker/admission.go: the node's admission,
//  38. worker/slots.go: its slots, in the node's order;
//  39. worker/worker.go: the model's typical run, against the deadline;
//  40. worker/executor/executor.go: the executor runs the model;
//  41. worker/observe.go: the node's metrics;
//  42. worker/outcomes.go: the outcome publisher sends a direct report
//     (publisher.go's Request);
//  43. shared/protocol/messages.go: the outcome's status and message ids;
//  44. dispatcher/internal/outcome/outcome.go: HandleReport (codec.go's
//     DecodeOutcome), then Settle checks it against the seal (trust.go
//     again) and reads the task's ack subject from the dispatch
//  45. dispatcher/internal/finish/taskack.go: (TaskAckFor);
//  46. dispatcher/internal/settle/settle.go: Settle says finish;
//  47. dispatcher/stats/batcher.go: the outcome goes into the statistics;
//  48. dispatcher/wiring.go: its observer tells the metrics, the load model
//     and the rollouts;
//  49. dispatcher/internal/pipeline/pipeline.go: the task's latency
//     (MsSince), for its result;
//  50. dispatcher/internal/finish/finish.go: the finish stage's End, the
//     one way a task ends, releases what the attempt held and publishes
//     the result;
//  51. dispatcher/metrics.go: the result in the metrics (finish.Metrics),
//  52. dispatcher/internal/finish/counts.go: and counted by type;
//  53. shared/jsplumb/groupcommit.go: on disk, with the results published
//     meanwhile (through publisher.go); its acknowledgement (completer.go again) acks
//     the task (taskack.go) and answers the report, acking the dispatch for
//     the worker (dispatch.go's ReportAcked, read by worker/task.go);
//  54. dispatcher/taskprune.go: the acked task is noted for the pruner;
//     client.Wait (client.go again) reads the result (codec.go's
//     DecodeResult).
//
// The shortest program that runs the system, a dispatcher and a worker in
// one process on an embedded NATS server with a producer submitting one
// task, is the runnable example in e2e/example (it lives in the e2e module,
// since this module does not depend on the worker's):
//
//	conn := natsconn.Config{URL: "nats://127.0.0.1:4222"} // shared/natsconn
//	cfg := dispatcher.DefaultConfig()
//	cfg.NATS = conn
//	d, _ := dispatcher.New(cfg)
//	w, _ := worker.New(worker.Config{NATS: conn, NodeID: "node-1"},
//		worker.WithHandler("upper", upper),
//		worker.WithModels([]worker.ModelSpec{{Name: "upper-v1", Types: []string{"text"},
//			Executor: model.ExecutorGo, Go: &model.GoSpec{Handler: "upper"}}}))
//	go d.Run(ctx)
//	go w.Run(ctx)
//	c, _ := client.Dial(conn) // or natsconn.Config{}: MLSCHED_NATS_URL, as the binaries
//	c.Submit(ctx, protocol.Task{ID: "t-1", Type: "text", Payload: json.RawMessage(`"hello"`)})
//	res, _ := c.Wait(ctx, "t-1") // succeeded upper-v1 node-1 "HELLO"
package dispatcher

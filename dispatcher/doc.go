// Package dispatcher is mlsched's scheduling service. Any number of replicas
// share its durable consumers; none keeps per-task state of its own: what an
// attempt carries is a protocol.Dispatch, sent as the dispatch's headers and
// echoed on its outcome.
//
// A Dispatcher is a few small components with one lifecycle
// (shared/lifecycle: Start, Stop, Started). Run starts them in this order
// and stops them in reverse, reporting every shutdown error:
//
//   - the statistics batcher (shared/stats), flushed at Stop;
//   - superseded.go: the superseded-attempt and cancelled-task set, fed by a
//     watch on MLSCHED_SUPERSEDED;
//   - the node registry (shared/registry), fed by a watch on MLSCHED_NODES;
//   - snapshot.go: the refresher of the statistics snapshot and the decision
//     table, which also writes breaker transitions;
//   - the dispatch and result publishers (shared/jspub, each with its own
//     room, so that a dispatch backlog does not hold back results): publishes
//     are asynchronous and each acknowledgement settles the message that
//     caused it (task or outcome) by callback, on the goroutine that read it;
//   - the completer (shared/jspub.Completer): publish-then-ack, the one
//     place a consumed message (or a direct report) is acked once what
//     handling it published is stored, nak'ed for redelivery otherwise;
//   - sweeper.go: finds attempts still unanswered at their deadline in
//     MLSCHED_DISPATCH (the stream is the in-flight table) and fails them
//     over;
//   - admin.go, cancel.go: answer `mlsched stats` and `mlsched cancel`;
//   - consume.go: the task and outcome consumers (durable pull consumption
//     that survives consumer deletion), whose handlers are:
//   - intake.go: validate a task (reject or dead-letter bad input), decide
//     model and node with the policy engine, and republish the task bytes
//     unchanged to mlsched.node.<node>.tasks;
//   - reports.go: a worker's direct report of a success, a core-NATS
//     request on mlsched.report.<node>, settled like a stored outcome and
//     answered once the result is stored (what it cannot settle at once it
//     sends back, and the worker stores it in MLSCHED_OUTCOMES);
//   - outcomes.go: settle an outcome by the rule of shared/settle: the final
//     result, a retry on another model after a backoff, or a failure that is
//     also dead-lettered;
//   - results.go, deadletter.go: publish the one final result per task (a
//     second one is refused by JetStream's expected-last-subject-sequence
//     check) and, through the one dead-letter publisher, dead letters.
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

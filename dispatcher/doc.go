// Package dispatcher is mlsched's scheduling service. Any number of replicas
// share its durable consumers; none keeps per-task state of its own.
//
// Where each step of the flow lives:
//
//   - intake.go: consume MLSCHED_TASKS, validate (reject or dead-letter bad
//     input), decide model and node with the policy engine, republish the task
//     bytes unchanged to mlsched.node.<node>.tasks with headers, and ack the
//     task once JetStream has acknowledged that publish.
//   - outcomes.go: consume MLSCHED_OUTCOMES, record statistics, retry failed
//     attempts on another model (with backoff), or publish the final result.
//   - results.go: publish the one final result per task (a second one is
//     refused by JetStream's expected-last-subject-sequence check) and dead
//     letters.
//   - sweeper.go: find attempts still unanswered at their deadline in
//     MLSCHED_DISPATCH (the stream is the in-flight table) and fail them over.
//   - snapshot.go: refresh the statistics snapshot and the decision table in
//     the background, and write breaker transitions.
//   - admin.go: answer `mlsched stats` requests.
//   - consume.go: durable pull consumption that survives consumer deletion.
package dispatcher

// Package policy decides, for each task, which model and which node run it.
//
// The dispatcher builds a Table from the latest statistics snapshot and the
// live nodes every refresh (NewTable, ~every 250ms; no store read per task),
// then asks an Engine to Decide for each task and reports the dispatch with
// Table.Dispatched so that load readings stay current until the next table.
// The simulator drives the very same Engine and Table.
//
// A decision goes through fixed steps, whatever the policy:
//
//  1. candidates: models that a live, non-draining node announces for the
//     task type (CodeNoModel if none), cut to the task's allow-list
//     (CodeUnknownModel if that leaves none);
//  2. constraints: max_latency_ms against the p95 of successful attempts
//     (no latency data yet passes) and min_success_rate against the smoothed
//     rate (CodeConstraints, naming each candidate and why, if none passes);
//  3. circuit breakers: models whose breaker is open, or all of whose nodes'
//     breakers are open, are skipped; a half-open one gets its probes first.
//     If every candidate is blocked, the engine routes among all of them
//     anyway and sets Decision.Panic rather than reject work;
//  4. failover: a model not in Request.Tried, else a tried model with a node
//     not tried yet, else a repeat;
//  5. the policy ranks what is left (see Policy and docs/policies.md);
//  6. the node: among the model's usable nodes, not tried ones first, by the
//     power of two choices on load over smoothed per-node success rate.
//
// Breaker state lives in the statistics store so that every dispatcher
// replica sees the same; Engine.Transitions computes the changes a fresh
// snapshot calls for and the dispatcher writes them with a compare-and-set.
//
// Decide takes no lock and allocates nothing: per-type candidate lists are
// precomputed in the Table, working memory is pooled, and each decision
// draws from its own small generator (Rand), seeded from math/rand/v2 or,
// for reproducible runs, from Config.Seed.
package policy

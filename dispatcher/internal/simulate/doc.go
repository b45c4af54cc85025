// Package simulate replays a scenario (models whose failure probability and
// latency change over time, nodes with capacity, crashes, bursts, new models)
// against the real decision code of packages policy and stats, on a
// simulated clock, to measure how each scheduling policy compares with an
// oracle that knows the true failure probabilities.
//
// Nothing here talks to NATS or Redis: the dispatcher's loop is reproduced
// in miniature. Every refresh interval the table is rebuilt from the
// in-memory store's snapshot and the simulated heartbeats, after breaker
// transitions are written back with SetBreaker; each attempt is decided on
// that table, recorded as dispatched, and its outcome recorded when it
// completes. Failed attempts fail over with the attempt history in
// policy.Request.Tried, up to the scenario's max attempts.
//
// Runs are deterministic for a seed. Arrivals and the random numbers that
// decide each attempt's outcome are drawn from streams keyed by the seed and
// the task (common random numbers), so every policy sees the same tasks and
// the same luck for the same choice, and differences between policies are
// due to their choices only.
package simulate

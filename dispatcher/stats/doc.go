// Package stats keeps rolling per-model and per-(model, node) statistics:
// successes, model errors, timeouts, task errors, latency histograms,
// dispatched and in-flight counts, and circuit-breaker state.
//
// Store is the interface every backend implements: the Redis store shared by
// all dispatcher replicas (package redisstats), and the in-memory store of
// the single-process mode and the simulator (Memory). Package statstest
// holds the conformance suite both must pass, so they agree on every rule
// below.
//
// # The window
//
// Time is cut into buckets of Window.Bucket (default 10s); bucket i holds
// the events with i = floor(At.UnixNano() / Bucket). The window is
// Window.Buckets() = ceil(Size/Bucket) buckets (default 30, five minutes):
// a snapshot taken at time now sums the buckets from cur-Buckets()+1 to
// cur+1, where cur is the bucket of now. A whole bucket leaves the window at
// once, so an event counts for between Size-Bucket and Size. The one bucket
// ahead absorbs small clock skew between replicas; an event dated further
// in the future is counted in the current bucket, and an event already out
// of the window only moves the gauges. An event with a zero At is dated by
// the store's clock (WithClock; the simulator passes its simulated clock).
//
// Windowed: the Counts, the success latency Histogram and FailLatencySumUs.
// Series.Recent holds the Counts of the most recent buckets only, from
// cur-RecentBuckets()+1 to cur+1 (Window.Recent, default 2 buckets): the
// policy engine compares them with the rest of the window to notice that a
// model has changed long before a count over the whole window would show it.
// Not windowed (gauges): InFlight (+1 per dispatch, -1 per outcome of any
// kind except a late one; a signed sum read clamped at 0, because an
// attempt's outcome may be recorded before its dispatch and the two must
// cancel out in either order), ConsecutiveFailures (+1 per model error or timeout,
// 0 on a success; task errors and expired dispatches leave it alone) and
// LastOutcome (the latest At of an outcome). Every event counts for its
// model and, when it names a node, for its (model, node).
//
// A snapshot lists a model or (model, node) when it has events in the
// window, a non-zero gauge or a non-closed breaker. Breakers are changed
// only by SetBreaker, a compare-and-set on (State, Since) so that replicas
// agree on one transition; a breaker never set is Breaker{}.
//
// # Redis key layout
//
// Every key starts with the store's prefix (default "mlsched:") and carries
// the hash tag {stats}, so the Lua scripts work on Redis Cluster too:
//
//	<prefix>{stats}:b:<i>   hash, bucket i; expires a window and a bucket
//	                        after the bucket ends
//	<prefix>{stats}:g       hash, the gauges; fields of a series unwritten
//	                        for the forget-after time (24h) are deleted
//	<prefix>{stats}:br      hash, the breakers; likewise
//	<prefix>{stats}:gen     string, the store's generation (a random name)
//	<prefix>{stats}:seq     integer, incremented by every Record
//	<prefix>{stats}:seeded  string, the last generation a re-seed started
//
// The generation and the sequence let a replica notice that the store was
// reset (restarted empty, or failed over to a replica that missed writes)
// and re-seed it from its last snapshot; see package redisstats.
//
// Hash fields name the series and the counter separated by spaces, which
// model and node names (protocol tokens) cannot contain; the model's own
// series has an empty node, hence two spaces:
//
//	"<model> <node> <c>"  in a bucket, c = d (dispatched), s (successes),
//	                      me (model errors), to (timeouts), te (task
//	                      errors), ex (expired), la (late), fl (summed
//	                      failure latency, µs), h0..h39 (latency histogram)
//	"<model> <node> <g>"  in the gauges, g = if (in flight), cf
//	                      (consecutive failures), lo (last outcome, Unix ns
//	                      zero-padded to 20 digits), tw (last written by a
//	                      Record, Unix ms: redisstats.Sweep deletes the
//	                      series' gauges and breaker when it is too old)
//	"<model> <node>"      in the breakers, value "<state>:<since Unix ns>"
//
// Record aggregates a batch in Go and applies it with one Lua script
// (EVALSHA, EVAL after a NOSCRIPT): HINCRBY per bucket field, and per series
// a gauge update composed in event order (in-flight = cur+a), so a batch is
// atomic and costs
// one round trip. Snapshot reads the window's buckets, the gauges and the
// breakers in one MULTI/EXEC. Fields a store does not recognise are ignored.
//
// # The Batcher: buffer or drop
//
// The dispatcher never waits for Redis on a task's path: it calls
// Batcher.Add, which appends to a buffer, and a loop writes the buffer with
// one Record every FlushInterval (default 50ms), or as soon as MaxBatch
// (default 1000) events wait. When Record fails (Redis down) the events stay
// buffered and the loop retries with backoff doubling from RetryMin (100ms)
// to RetryMax (5s); Stats().Degraded is true until a Record succeeds. The
// buffer holds at most MaxBuffer events (default 100000, about 8 MB): past
// that the oldest are dropped and counted in Stats().Dropped, because the
// freshest statistics matter most to routing, and old ones would soon leave
// the window anyway. Delivery is at least once: a batch whose reply was lost
// is written again. Stop writes what is left, retrying until its context
// ends.
package stats

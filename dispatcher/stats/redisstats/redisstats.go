// Package redisstats is the stats.Store shared by every dispatcher replica,
// kept in Redis. It is the only package that knows the Redis key layout
// (described in the stats package documentation).
//
// Record is one atomic Lua script call per batch, Snapshot one MULTI/EXEC
// pipeline, SetBreaker one Lua compare-and-set.
package redisstats

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/mlsched/mlsched/dispatcher/stats"
)

// DefaultPrefix starts every key of the store.
const DefaultPrefix = "mlsched:"

// Field names inside the hashes (see the stats package documentation).
const (
	fDispatched  = "d"
	fSuccesses   = "s"
	fModelErrors = "me"
	fTimeouts    = "to"
	fTaskErrors  = "te"
	fExpired     = "ex"
	fLate        = "la"
	fFailUs      = "fl"
	fHistPrefix  = "h" // h0 .. h39
	fInFlight    = "if"
	fConsecutive = "cf"
	fLastOutcome = "lo"
	fWritten     = "tw" // when a Record last wrote the series (ms), for Sweep
)

// DefaultForgetAfter is how long a series (a model, or a model on a node)
// may go unwritten before Sweep deletes its gauges and breaker.
const DefaultForgetAfter = 24 * time.Hour

var (
	//go:embed record.lua
	recordSrc    string
	recordScript = redis.NewScript(recordSrc)
	//go:embed breaker.lua
	breakerSrc    string
	breakerScript = redis.NewScript(breakerSrc)
	//go:embed forget.lua
	forgetSrc    string
	forgetScript = redis.NewScript(forgetSrc)
)

// Store is a stats.Store in Redis. It does not own the client: Close leaves
// it open.
type Store struct {
	c        redis.UniversalClient
	w        stats.Window
	prefix   string
	now      func() time.Time
	onReset  func(ResetInfo)
	noReseed bool
	// forget: series unwritten that long are deleted (0: never); Snapshot
	// sweeps at most every sweepEvery, by the store's clock.
	forget     time.Duration
	sweepEvery time.Duration
	lastSweep  atomic.Int64 // unix ns of the last sweep

	// what this replica knows of the store, to notice a reset and re-seed
	// it (reseed.go)
	mu       sync.Mutex
	view     view
	reseedMu sync.Mutex // one re-seed at a time
	resets   atomic.Int64
}

var _ stats.Store = (*Store)(nil)

// Option configures a Store.
type Option func(*Store)

// WithPrefix sets the prefix of every key (default "mlsched:"). Stores with
// different prefixes share a server without seeing each other.
func WithPrefix(p string) Option { return func(s *Store) { s.prefix = p } }

// WithClock sets the clock that dates events with a zero At and picks the
// window's buckets (default time.Now).
func WithClock(now func() time.Time) Option {
	return func(s *Store) {
		if now != nil {
			s.now = now
		}
	}
}

// WithForgetAfter sets how long a series (a model, or a model on a node)
// may go unwritten before its gauges (in flight, consecutive failures, last
// outcome) and its breaker are deleted, so that the names of models and
// nodes that are gone do not stay in Redis for ever (default
// DefaultForgetAfter; 0 keeps them). Their buckets expire with the window
// anyway. Keep it longer than the longest task timeout: an outcome after it
// counts from zero. Snapshot sweeps at most every quarter of it (5 minutes
// at most).
func WithForgetAfter(d time.Duration) Option { return func(s *Store) { s.forget = max(d, 0) } }

// New returns a store over window w (zero fields take the defaults of
// stats.Window). Every replica must use the same window.
func New(client redis.UniversalClient, w stats.Window, opts ...Option) *Store {
	s := &Store{c: client, w: w.WithDefaults(), prefix: DefaultPrefix, now: time.Now, forget: DefaultForgetAfter}
	for _, o := range opts {
		o(s)
	}
	s.sweepEvery = min(s.forget/4, 5*time.Minute)
	return s
}

// All keys share the hash tag {stats} so that the scripts and the snapshot
// transaction work on Redis Cluster too.
func (s *Store) bucketKey(idx int64) string {
	return s.prefix + "{stats}:b:" + strconv.FormatInt(idx, 10)
}
func (s *Store) gaugeKey() string   { return s.prefix + "{stats}:g" }
func (s *Store) breakerKey() string { return s.prefix + "{stats}:br" }
func (s *Store) genKey() string     { return s.prefix + "{stats}:gen" }
func (s *Store) seqKey() string     { return s.prefix + "{stats}:seq" }
func (s *Store) seededKey() string  { return s.prefix + "{stats}:seeded" }

// series names a model (node "") or a (model, node). As a hash field prefix
// it is "<model> <node>": names never hold a space.
type series struct{ model, node string }

func (k series) field(f string) string { return k.model + " " + k.node + " " + f }

type bucketSeries struct {
	idx int64
	series
}

type agg struct {
	counts stats.Counts
	failUs int64
	hist   stats.Histogram
}

// gaugeOp is the net effect of a batch on one series' gauges, composed in
// event order so that one script call matches applying events one by one:
// in-flight becomes cur+ifAdd (a signed sum, read clamped at 0, so that an
// outcome recorded before its dispatch cancels out; late outcomes do not
// count), and
// consecutive failures become cfAdd if reset, else cur+cfAdd.
type gaugeOp struct {
	ifAdd       int64
	reset       bool
	cfAdd       int64
	lastOutcome int64
}

func (g *gaugeOp) apply(k stats.Kind, late bool, at int64) {
	switch {
	case k == stats.KindDispatched:
		g.ifAdd++
	case !late:
		g.ifAdd--
	}
	switch {
	case k == stats.KindSuccess:
		g.reset, g.cfAdd = true, 0
	case k.IsFailure():
		g.cfAdd++
	}
	if k.IsOutcome() && at > g.lastOutcome {
		g.lastOutcome = at
	}
}

// Record applies the batch with one script call. An invalid event rejects
// the whole batch with stats.ErrInvalidEvent before Redis is contacted.
// When the script finds the store reset (see reseed.go) Record re-seeds it
// from what this replica remembers and applies the batch after that.
func (s *Store) Record(ctx context.Context, events []stats.Event) error {
	if len(events) == 0 {
		return nil
	}
	if err := stats.ValidateBatch(events); err != nil {
		return err
	}
	now := s.now()
	buckets := make(map[bucketSeries]*agg)
	var bucketOrder []int64
	seenBucket := make(map[int64]bool)
	gauges := make(map[series]*gaugeOp)
	var gaugeOrder []series

	for i := range events {
		ev := &events[i]
		idx, inWindow := s.w.EventBucket(ev.At, now)
		at := ev.At
		if at.IsZero() {
			at = now
		}
		atNs := max(stats.UnixNanos(at), 0)
		keys := [2]series{{ev.Model, ""}, {ev.Model, ev.Node}}
		nk := 2
		if ev.Node == "" {
			nk = 1
		}
		for _, k := range keys[:nk] {
			if inWindow {
				bk := bucketSeries{idx, k}
				a := buckets[bk]
				if a == nil {
					a = &agg{}
					buckets[bk] = a
					if !seenBucket[idx] {
						seenBucket[idx] = true
						bucketOrder = append(bucketOrder, idx)
					}
				}
				a.counts.Count(ev.Kind, ev.Late)
				if ev.Kind.IsFailure() {
					a.failUs += ev.Latency.Microseconds()
				}
				if ev.Kind == stats.KindSuccess {
					a.hist.Observe(ev.Latency)
				}
			}
			g := gauges[k]
			if g == nil {
				g = &gaugeOp{}
				gauges[k] = g
				gaugeOrder = append(gaugeOrder, k)
			}
			g.apply(ev.Kind, ev.Late, atNs)
		}
	}

	keys := make([]string, 0, 3+len(bucketOrder))
	keys = append(keys, s.gaugeKey(), s.genKey(), s.seqKey())
	args := make([]any, 0, 16*len(buckets)+6*len(gauges)+12)
	args = append(args, "", int64(0), "", "", now.UnixMilli()) // generation, sequence, replication id: set per try
	fieldsOf := make(map[int64][]any, len(bucketOrder))
	for bk, a := range buckets {
		fieldsOf[bk.idx] = appendFields(fieldsOf[bk.idx], bk.series, a)
	}
	span, bucket := int64(s.w.Span()), int64(s.w.Bucket)
	for _, idx := range bucketOrder {
		keys = append(keys, s.bucketKey(idx))
		// a bucket lives a window and a bucket past its end
		expireAt := (idx+1)*bucket + span + bucket
		ttlMs := max((expireAt-now.UnixNano()+int64(time.Millisecond)-1)/int64(time.Millisecond), 1)
		f := fieldsOf[idx]
		args = append(args, ttlMs, len(f)/2)
		args = append(args, f...)
	}
	args = append(args, len(gaugeOrder))
	for _, k := range gaugeOrder {
		g := gauges[k]
		reset := 0
		if g.reset {
			reset = 1
		}
		lo := ""
		if g.lastOutcome > 0 {
			lo = fmt.Sprintf("%020d", g.lastOutcome) // compared as strings in Lua
		}
		args = append(args, k.model+" "+k.node+" ", g.ifAdd, reset, g.cfAdd, lo)
	}
	for try := 0; ; try++ {
		k := s.known()
		cand := "" // names the store if nobody has yet
		if k.gen == "" {
			cand = newGeneration()
		}
		args[0], args[1], args[2], args[3] = k.gen, k.seq, cand, k.replid
		res, err := recordScript.Run(ctx, s.c, keys, args...).Slice()
		if err != nil {
			return fmt.Errorf("redisstats: record %d events: %w", len(events), err)
		}
		st, err := parseReply(res)
		if err != nil {
			return fmt.Errorf("redisstats: record %d events: %w", len(events), err)
		}
		if !st.reset {
			s.recorded(st, fieldsOf)
			return nil
		}
		if try == 2 {
			return fmt.Errorf("redisstats: record %d events: %w", len(events), errResetLoop)
		}
		if err := s.reseed(ctx, k.resets); err != nil {
			return fmt.Errorf("redisstats: record %d events: %w", len(events), err)
		}
	}
}

// appendFields appends the non-zero (field, delta) pairs of a.
func appendFields(out []any, k series, a *agg) []any {
	c := &a.counts
	for _, p := range [...]struct {
		f string
		v int64
	}{
		{fDispatched, c.Dispatched}, {fSuccesses, c.Successes}, {fModelErrors, c.ModelErrors},
		{fTimeouts, c.Timeouts}, {fTaskErrors, c.TaskErrors}, {fExpired, c.Expired},
		{fLate, c.Late}, {fFailUs, a.failUs},
	} {
		if p.v != 0 {
			out = append(out, k.field(p.f), p.v)
		}
	}
	for i, v := range a.hist {
		if v != 0 {
			out = append(out, k.field(fHistPrefix+strconv.Itoa(i)), v)
		}
	}
	return out
}

// Snapshot reads the window's buckets, the gauges and the breakers in one
// MULTI/EXEC round trip, after a sweep of idle series when one is due
// (Sweep). When it finds the store reset (see reseed.go) it
// re-seeds it from what this replica remembers and reads it again.
func (s *Store) Snapshot(ctx context.Context) (*stats.Snapshot, error) {
	s.maybeSweep(ctx)
	for try := 0; ; try++ {
		snap, reset, resets, err := s.snapshot(ctx)
		if err != nil || !reset {
			return snap, err
		}
		if try == 2 {
			return nil, fmt.Errorf("redisstats: snapshot: %w", errResetLoop)
		}
		if err := s.reseed(ctx, resets); err != nil {
			return nil, fmt.Errorf("redisstats: snapshot: %w", err)
		}
	}
}

func (s *Store) snapshot(ctx context.Context) (_ *stats.Snapshot, reset bool, resets int64, _ error) {
	now := s.now()
	first, last := s.w.Range(now)
	recent := s.w.RecentFirst(now)
	k := s.known() // before the read: the read must see what it names
	var bucketCmds []*redis.MapStringStringCmd
	var gaugeCmd, breakerCmd *redis.MapStringStringCmd
	var metaCmd *redis.Cmd
	_, err := s.c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		for idx := first; idx <= last; idx++ {
			bucketCmds = append(bucketCmds, p.HGetAll(ctx, s.bucketKey(idx)))
		}
		gaugeCmd = p.HGetAll(ctx, s.gaugeKey())
		breakerCmd = p.HGetAll(ctx, s.breakerKey())
		// EVAL, not EVALSHA: a transaction cannot fall back after NOSCRIPT
		metaCmd = p.Eval(ctx, metaSrc, []string{s.genKey(), s.seqKey()})
		return nil
	})
	if err != nil {
		return nil, false, 0, fmt.Errorf("redisstats: snapshot: %w", err)
	}
	meta, err := metaCmd.StringSlice()
	if err != nil || len(meta) != 3 {
		return nil, false, 0, fmt.Errorf("redisstats: snapshot: unexpected reply %v: %v", metaCmd.Val(), err)
	}
	gen, replid := meta[0], meta[2]
	seq, _ := strconv.ParseInt(meta[1], 10, 64)
	if k.gen != "" && (gen != k.gen || seq < k.seq || (k.replid != "" && replid != k.replid)) {
		return nil, true, k.resets, nil
	}
	// A store nobody has written to has no generation yet: the first
	// Record names it. A read never does, so that a reader that remembers
	// nothing (a new replica, the CLI) cannot pre-empt the replicas that
	// re-seed a store restarted empty.
	v := view{gen: gen, replid: replid, seq: seq, first: first, buckets: make(map[int64]map[string]string, len(bucketCmds)),
		gauges: gaugeCmd.Val(), breakers: breakerCmd.Val()}
	for i, c := range bucketCmds {
		if m := c.Val(); len(m) > 0 {
			v.buckets[first+int64(i)] = m
		}
	}
	s.remember(v)
	b := newBuilder()
	for i, c := range bucketCmds {
		isRecent := first+int64(i) >= recent
		for f, v := range c.Val() {
			b.bucketField(f, v, isRecent)
		}
	}
	for f, v := range gaugeCmd.Val() {
		b.gaugeField(f, v)
	}
	for f, v := range breakerCmd.Val() {
		b.breakerField(f, v)
	}
	return &stats.Snapshot{Taken: now, Window: s.w.Span(), Models: b.models()}, false, 0, nil
}

// builder assembles a snapshot from hash fields; a series is kept only when
// something justifies it (events in the window, a non-zero gauge, a
// non-closed breaker).
type builder struct {
	all map[series]*entry
}

type entry struct {
	stats.Series
	keep bool
}

func newBuilder() *builder { return &builder{all: make(map[series]*entry)} }

func (b *builder) entry(k series) *entry {
	e := b.all[k]
	if e == nil {
		e = &entry{}
		b.all[k] = e
	}
	return e
}

// splitField splits "<model> <node> <f>"; fields it cannot parse are not
// ours and are ignored.
func splitField(f string) (series, string, bool) {
	i := strings.IndexByte(f, ' ')
	j := strings.LastIndexByte(f, ' ')
	if i <= 0 || j == i {
		return series{}, "", false
	}
	return series{f[:i], f[i+1 : j]}, f[j+1:], true
}

// bucketField adds one field of a bucket hash; counts of a recent bucket
// also go to Series.Recent.
func (b *builder) bucketField(f, v string, recent bool) {
	k, name, ok := splitField(f)
	n, err := strconv.ParseInt(v, 10, 64)
	if !ok || err != nil || n == 0 {
		return
	}
	e := b.entry(k)
	if recent {
		addCount(&e.Recent, name, n)
	}
	if addCount(&e.Counts, name, n) {
		e.keep = true
		return
	}
	latencyField(e, name, n)
}

// addCount adds n to the counter of c a field names and reports whether
// the field is a counter.
func addCount(c *stats.Counts, name string, n int64) bool {
	switch name {
	case fDispatched:
		c.Dispatched += n
	case fSuccesses:
		c.Successes += n
	case fModelErrors:
		c.ModelErrors += n
	case fTimeouts:
		c.Timeouts += n
	case fTaskErrors:
		c.TaskErrors += n
	case fExpired:
		c.Expired += n
	case fLate:
		c.Late += n
	default:
		return false
	}
	return true
}

// latencyField adds a bucket's failure latency sum or histogram field.
func latencyField(e *entry, name string, n int64) {
	switch name {
	case fFailUs:
		e.FailLatencySumUs += n
	default:
		if !strings.HasPrefix(name, fHistPrefix) {
			return
		}
		i, err := strconv.Atoi(name[len(fHistPrefix):])
		if err != nil || i < 0 || i >= stats.NumLatencyBuckets {
			return
		}
		e.Latency[i] += n
	}
	e.keep = true
}

func (b *builder) gaugeField(f, v string) {
	k, name, ok := splitField(f)
	n, err := strconv.ParseInt(v, 10, 64)
	if !ok || err != nil {
		return
	}
	e := b.entry(k)
	switch name {
	case fInFlight:
		e.InFlight = max(n, 0)
		e.keep = e.keep || n > 0
	case fConsecutive:
		e.ConsecutiveFailures = n
		e.keep = e.keep || n != 0
	case fLastOutcome:
		e.LastOutcome = stats.FromUnixNanos(n)
	}
}

func (b *builder) breakerField(f, v string) {
	i := strings.IndexByte(f, ' ')
	if i <= 0 {
		return
	}
	br, ok := decodeBreaker(v)
	if !ok {
		return
	}
	e := b.entry(series{f[:i], f[i+1:]})
	e.Breaker = br
	e.keep = e.keep || br.State != stats.BreakerClosed
}

func (b *builder) models() map[string]*stats.ModelStats {
	out := make(map[string]*stats.ModelStats)
	model := func(name string) *stats.ModelStats {
		ms := out[name]
		if ms == nil {
			ms = &stats.ModelStats{}
			if e := b.all[series{name, ""}]; e != nil {
				ms.Series = e.Series
			}
			out[name] = ms
		}
		return ms
	}
	for k, e := range b.all {
		if !e.keep {
			continue
		}
		ms := model(k.model)
		if k.node != "" {
			if ms.Nodes == nil {
				ms.Nodes = make(map[string]*stats.Series)
			}
			s := e.Series
			ms.Nodes[k.node] = &s
		}
	}
	return out
}

func encodeBreaker(b stats.Breaker) string {
	return strconv.Itoa(int(b.State)) + ":" + strconv.FormatInt(stats.UnixNanos(b.Since), 10)
}

func decodeBreaker(v string) (stats.Breaker, bool) {
	st, since, ok := strings.Cut(v, ":")
	if !ok {
		return stats.Breaker{}, false
	}
	s, err1 := strconv.Atoi(st)
	n, err2 := strconv.ParseInt(since, 10, 64)
	if err1 != nil || err2 != nil || s < 0 || s > int(stats.BreakerHalfOpen) {
		return stats.Breaker{}, false
	}
	return stats.Breaker{State: stats.BreakerState(s), Since: stats.FromUnixNanos(n)}, true
}

// SetBreaker is a compare-and-set on (State, Since) in one script call; a
// breaker never set is Breaker{} (closed since the zero time).
func (s *Store) SetBreaker(ctx context.Context, key stats.BreakerKey, from, to stats.Breaker) (bool, error) {
	field := key.Model + " " + key.Node
	n, err := breakerScript.Run(ctx, s.c, []string{s.breakerKey()}, field, encodeBreaker(from), encodeBreaker(to)).Int()
	if err != nil {
		return false, fmt.Errorf("redisstats: set breaker %s/%s: %w", key.Model, key.Node, err)
	}
	return n == 1, nil
}

// Sweep deletes the gauges and breakers of the series (a model, or a model
// on a node) no Record has written for the forget-after time (see
// WithForgetAfter), by the store's clock, in one script call; it returns
// how many series it deleted. A series written by an older version, which
// has no write time, is given the current time. Snapshot calls it itself,
// at most every quarter of the forget-after time.
func (s *Store) Sweep(ctx context.Context) (int, error) {
	if s.forget <= 0 {
		return 0, nil
	}
	now := s.now()
	n, err := forgetScript.Run(ctx, s.c, []string{s.gaugeKey(), s.breakerKey()}, now.UnixMilli(), s.forget.Milliseconds()).Int()
	if err != nil {
		return 0, fmt.Errorf("redisstats: sweep idle series: %w", err)
	}
	s.lastSweep.Store(now.UnixNano())
	return n, nil
}

// maybeSweep sweeps when the last sweep is sweepEvery old; an error waits
// for the next snapshot.
func (s *Store) maybeSweep(ctx context.Context) {
	if s.forget <= 0 || s.now().UnixNano()-s.lastSweep.Load() < int64(s.sweepEvery) {
		return
	}
	_, _ = s.Sweep(ctx)
}

// Close does nothing: the caller owns the client.
func (s *Store) Close() error { return nil }

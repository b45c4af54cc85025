package redisstats

import (
	"context"
	"crypto/rand"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// A reset store is one that lost what it held: redis-server restarted
// without persistence (everything gone), or Sentinel promoted a replica that
// had not received the latest writes (some gone). Either way the dispatchers
// would start learning again from nothing, or from an older past, while each
// of them still remembers the store as it last read it.
//
// Detection. The store holds a generation (<prefix>{stats}:gen, a random
// name) and a write sequence (<prefix>{stats}:seq, incremented by every
// Record). Every Record and Snapshot compares them, and the master's
// replication id, with what this replica last saw: a generation missing or
// changed, a sequence behind one this replica has seen, or a new
// replication id (a replica was promoted, or the server restarted) is a
// reset, possibly partial. The Record script refuses to apply a batch
// to a reset store, so that nothing written after the reset is mistaken for
// the whole past.
//
// Re-seeding. The replica writes back what it remembers: the bucket hashes
// of its last snapshot plus the batches it recorded since, the gauges and
// the breakers. Every bucket field becomes the larger of the stored value
// and the remembered one: counts only grow within a bucket, so replicas
// re-seeding at once, or one re-seeding twice, never add up (a sum would
// count the same events once per replica). The gauges (in flight,
// consecutive failures) of the first replica to re-seed replace whatever
// the reset left for the series it knows (first writer wins; <prefix>
// {stats}:seeded tells a generation named by a replica that remembered
// nothing); the last outcome and each breaker take the later one. Each
// bucket keeps its index and expiry, so the re-seeded past leaves the window
// exactly as it would have. Then the store moves to a new generation
// (unless another replica already did), so that every replica notices the
// reset, merges what it remembers once, and goes on.
//
// What is still lost: events another replica wrote in the moments between
// two replicas' re-seeds, where the maximum keeps the larger of two values
// rather than their sum (counts err low, never double); and everything, when
// Redis and every replica restart together, since nobody remembers (hence
// persistence in compose).

var (
	//go:embed reseed_buckets.lua
	reseedBucketsSrc    string
	reseedBucketsScript = redis.NewScript(reseedBucketsSrc)
	//go:embed reseed_commit.lua
	reseedCommitSrc    string
	reseedCommitScript = redis.NewScript(reseedCommitSrc)
	//go:embed meta.lua
	metaSrc string
)

// errResetLoop: the store kept looking reset right after a re-seed.
var errResetLoop = errors.New("store still reset after re-seeding it")

// maxPending bounds the batches remembered between two snapshots.
const maxPending = 4096

// ResetInfo describes one re-seed, for logs.
type ResetInfo struct {
	// OldGeneration is the generation this replica knew; NewGeneration is
	// the store's after the re-seed.
	OldGeneration, NewGeneration string
	// First is true when this replica started the new generation: it was
	// the first to notice the reset.
	First bool
	// Buckets re-seeded, and Fields written (fields already at least as
	// large are left alone).
	Buckets, Fields int
	// Took is how long the re-seed took.
	Took time.Duration
	// Skipped is set when re-seeding is off (WithReseed(false)): the store
	// was adopted as found.
	Skipped bool
}

// WithOnReset calls f after every re-seed of a reset store (default none).
func WithOnReset(f func(ResetInfo)) Option { return func(s *Store) { s.onReset = f } }

// WithReseed turns re-seeding on or off (default on). Off, a replica that
// notices a reset adopts the store as it finds it and learns again from
// there: for measuring what re-seeding is worth, or to start afresh.
func WithReseed(on bool) Option { return func(s *Store) { s.noReseed = !on } }

// Resets is how many times this store re-seeded a reset store.
func (s *Store) Resets() int64 { return s.resets.Load() }

// view is what this replica knows of the store.
type view struct {
	gen    string // "" until the first read or write
	replid string // the master's replication id ("" until known)
	seq    int64  // the highest write sequence seen
	// the last snapshot's raw hashes; first is its oldest bucket
	first    int64
	buckets  map[int64]map[string]string
	gauges   map[string]string
	breakers map[string]string
	// batches recorded since that snapshot, oldest first
	pending []pendingBatch
}

type pendingBatch struct {
	seq    int64
	fields map[int64][]any // bucket -> field, delta pairs (as Record sends them)
}

// knowledge is what a read or write compares the store with.
type knowledge struct {
	gen, replid string
	seq, resets int64
}

func (s *Store) known() knowledge {
	s.mu.Lock()
	defer s.mu.Unlock()
	return knowledge{gen: s.view.gen, replid: s.view.replid, seq: s.view.seq, resets: s.resets.Load()}
}

// remember keeps a snapshot's raw hashes, unless a re-seed moved the view
// to another generation while it was read.
func (s *Store) remember(v view) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.view.gen != "" && v.gen != s.view.gen {
		return
	}
	keep := s.view.pending[:0]
	for _, p := range s.view.pending {
		if p.seq > v.seq {
			keep = append(keep, p)
		}
	}
	v.pending = keep
	v.seq = max(v.seq, s.view.seq)
	s.view = v
}

type recordReply struct {
	reset       bool
	gen, replid string
	seq         int64
}

func parseReply(res []any) (recordReply, error) {
	if len(res) != 4 {
		return recordReply{}, fmt.Errorf("unexpected script reply %v", res)
	}
	st, ok1 := res[0].(int64)
	gen, ok2 := res[1].(string)
	seq, ok3 := res[2].(int64)
	rid, ok4 := res[3].(string)
	if !ok1 || !ok2 || !ok3 || !ok4 {
		return recordReply{}, fmt.Errorf("unexpected script reply %v", res)
	}
	return recordReply{reset: st != 0, gen: gen, seq: seq, replid: rid}, nil
}

// recorded remembers a batch the store applied at sequence r.seq.
func (s *Store) recorded(r recordReply, fields map[int64][]any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.view.gen == "" {
		s.view.gen = r.gen
	}
	if r.gen != s.view.gen {
		return
	}
	s.view.replid = r.replid
	s.view.seq = max(s.view.seq, r.seq)
	if len(s.view.pending) >= maxPending {
		s.view.pending = s.view.pending[1:]
	}
	s.view.pending = append(s.view.pending, pendingBatch{seq: r.seq, fields: fields})
}

func newGeneration() string { return rand.Text()[:16] }

// reseed writes back what this replica remembers (see the top of this
// file). resets is Resets() when the caller saw the reset: if another call
// re-seeded since, there is nothing left to do.
func (s *Store) reseed(ctx context.Context, resets int64) error {
	s.reseedMu.Lock()
	defer s.reseedMu.Unlock()
	if s.resets.Load() != resets {
		return nil
	}
	start := time.Now()
	if s.noReseed {
		return s.adopt(ctx, start)
	}
	s.mu.Lock()
	v := s.view
	v.pending = append([]pendingBatch(nil), v.pending...)
	s.mu.Unlock()

	now := s.now()
	first, _ := s.w.Range(now)
	span, bucket := int64(s.w.Span()), int64(s.w.Bucket)
	info := ResetInfo{OldGeneration: v.gen}
	for idx, fields := range v.bucketValues(first) {
		expireAt := (idx+1)*bucket + span + bucket
		ttlMs := max((expireAt-now.UnixNano()+int64(time.Millisecond)-1)/int64(time.Millisecond), 1)
		args := make([]any, 0, 1+2*len(fields))
		args = append(args, ttlMs)
		for f, n := range fields {
			args = append(args, f, n)
		}
		n, err := reseedBucketsScript.Run(ctx, s.c, []string{s.bucketKey(idx)}, args...).Int()
		if err != nil {
			return fmt.Errorf("re-seed bucket %d: %w", idx, err)
		}
		info.Buckets++
		info.Fields += n
	}
	args := []any{v.gen, newGeneration(), v.seq, len(v.gauges)}
	for f, val := range v.gauges {
		args = append(args, f, val)
	}
	zero := v.zeroGauges()
	args = append(args, len(zero))
	for _, f := range zero {
		args = append(args, f)
	}
	for f, val := range v.breakers {
		args = append(args, f, val)
	}
	res, err := reseedCommitScript.Run(ctx, s.c, []string{s.gaugeKey(), s.breakerKey(), s.genKey(), s.seqKey(), s.seededKey()}, args...).Slice()
	if err != nil {
		return fmt.Errorf("re-seed: %w", err)
	}
	if len(res) != 3 {
		return fmt.Errorf("re-seed: unexpected script reply %v", res)
	}
	gen, ok1 := res[0].(string)
	n, ok2 := res[1].(int64)
	rid, ok3 := res[2].(string)
	if !ok1 || !ok2 || !ok3 {
		return fmt.Errorf("re-seed: unexpected script reply %v", res)
	}
	info.NewGeneration, info.First, info.Fields = gen, gen == args[1], info.Fields+int(n)
	s.mu.Lock()
	s.view.gen, s.view.replid = gen, rid
	s.mu.Unlock()
	s.resets.Add(1)
	info.Took = time.Since(start)
	if s.onReset != nil {
		s.onReset(info)
	}
	return nil
}

// bucketValues are the remembered bucket fields from bucket first on: the
// snapshot's values plus the deltas of the batches recorded since.
func (v *view) bucketValues(first int64) map[int64]map[string]int64 {
	out := make(map[int64]map[string]int64)
	get := func(idx int64) map[string]int64 {
		m := out[idx]
		if m == nil {
			m = make(map[string]int64)
			out[idx] = m
		}
		return m
	}
	for idx, h := range v.buckets {
		if idx < first {
			continue
		}
		m := get(idx)
		for f, val := range h {
			if n, err := strconv.ParseInt(val, 10, 64); err == nil && n > 0 {
				m[f] = n
			}
		}
	}
	for _, p := range v.pending {
		for idx, pairs := range p.fields {
			if idx < first {
				continue
			}
			m := get(idx)
			for i := 0; i+1 < len(pairs); i += 2 {
				f, _ := pairs[i].(string)
				d, _ := pairs[i+1].(int64)
				m[f] += d
			}
		}
	}
	return out
}

// adopt takes the store as it is, forgetting what this replica remembered.
func (s *Store) adopt(ctx context.Context, start time.Time) error {
	meta, err := s.c.Eval(ctx, metaSrc, []string{s.genKey(), s.seqKey()}).StringSlice()
	if err != nil || len(meta) != 3 {
		return fmt.Errorf("adopt a reset store: %v %w", meta, err)
	}
	gen := meta[0] // "" when empty: the next Record names it
	seq, _ := strconv.ParseInt(meta[1], 10, 64)
	s.mu.Lock()
	old := s.view.gen
	s.view = view{gen: gen, replid: meta[2], seq: seq}
	s.mu.Unlock()
	s.resets.Add(1)
	if s.onReset != nil {
		s.onReset(ResetInfo{OldGeneration: old, NewGeneration: gen, Skipped: true, Took: time.Since(start)})
	}
	return nil
}

// zeroGauges are the in-flight and consecutive-failure fields of the series
// the view knows that are absent from its gauges (zero): a first re-seed
// clears them, where a partial reset may have left older values.
func (v *view) zeroGauges() []string {
	known := map[string]bool{}
	add := func(f string) {
		if k, _, ok := splitField(f); ok {
			known[k.model+" "+k.node+" "] = true
		}
	}
	for _, h := range v.buckets {
		for f := range h {
			add(f)
		}
	}
	for f := range v.gauges {
		add(f)
	}
	var out []string
	for base := range known {
		for _, g := range []string{fInFlight, fConsecutive} {
			if _, ok := v.gauges[base+g]; !ok {
				out = append(out, base+g)
			}
		}
	}
	return out
}

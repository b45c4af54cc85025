package dispatcher

import (
	"context"
	"errors"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/dispatcher/internal/policy"
	"github.com/mlsched/mlsched/dispatcher/rollout"
	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/shared/lifecycle"
	"github.com/mlsched/mlsched/shared/protocol"
)

// rollouts is the dispatcher's side of model rollouts (dispatcher/rollout):
// it watches the MLSCHED_ROLLOUTS bucket and keeps the engine's splits at
// each rollout's share, counts the first-attempt outcomes of each rolling
// family, and every flush interval adds this replica's counts to the
// family's record by compare-and-set and evaluates it, so that whichever
// replica flushes last applies the test to the counts of all of them.
// A family without a rollout costs an outcome one atomic load.
// rolloutFlush is how often a replica stores its counts and evaluates: a
// bad version's rollback waits for it, at most, after the evidence.
const rolloutFlush = 250 * time.Millisecond

type rollouts struct {
	lifecycle.Loop
	store  rollout.Store
	engine *policy.Engine
	// breakerOpen reports whether a model's breaker is open (the last
	// statistics snapshot).
	breakerOpen func(model string) bool
	every       time.Duration
	log         zerolog.Logger
	now         func() time.Time

	active atomic.Bool // some family has a rollout
	mu     sync.Mutex
	fams   map[string]*rollingFamily
	seen   map[string]rollout.Event // last transition seen per family, to log each once
	// transitions counts the transitions this replica saw, by the state
	// they led to (read by the metrics).
	transitions map[rollout.State]int64
	ready       chan struct{}
}

type rollingFamily struct {
	r     *rollout.Rollout
	split *policy.Split
	// pending are outcomes counted here and not yet stored.
	newc, inc rollout.Counts
}

func newRollouts(kv jetstream.KeyValue, engine *policy.Engine, breakerOpen func(string) bool, every time.Duration, log zerolog.Logger) *rollouts {
	return &rollouts{store: rollout.Store{KV: kv}, engine: engine, breakerOpen: breakerOpen, every: every, log: log,
		now: time.Now, fams: map[string]*rollingFamily{}, seen: map[string]rollout.Event{},
		transitions: map[rollout.State]int64{}, ready: make(chan struct{})}
}

// observe counts an attempt's outcome for the rollout of its family, if
// any: only first attempts (a retry goes to the incumbent by design) and
// only judged outcomes.
func (ro *rollouts) observe(model string, kind stats.Kind, attempt int) {
	if ro == nil || !ro.active.Load() || attempt != 1 {
		return
	}
	c, ok := rollout.CountsOf(kind)
	if !ok {
		return
	}
	ro.mu.Lock()
	defer ro.mu.Unlock()
	f := ro.fams[protocol.ModelFamily(model)]
	if f == nil || f.r.State.Final() {
		return
	}
	if model == f.r.Model {
		f.newc = f.newc.Add(c)
	} else {
		f.inc = f.inc.Add(c)
	}
}

// Start loads the bucket, then watches it and flushes every interval.
func (ro *rollouts) Start(ctx context.Context) error {
	return ro.Go(ctx, func(rctx context.Context, ready func()) error {
		w, err := ro.store.KV.WatchAll(rctx)
		if err != nil {
			return err
		}
		defer func() { _ = w.Stop() }()
		t := time.NewTicker(ro.every)
		defer t.Stop()
		loaded := false
		for {
			select {
			case <-rctx.Done():
				fctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				ro.flush(fctx)
				cancel()
				return nil
			case e, ok := <-w.Updates():
				if !ok {
					return errors.New("rollouts watch closed")
				}
				if e == nil { // every stored rollout has been delivered
					if !loaded {
						loaded = true
						ready()
					}
					continue
				}
				ro.apply(e, loaded)
			case <-t.C:
				ro.flush(rctx)
			}
		}
	})
}

// apply takes a stored rollout into the engine's splits, and logs and
// counts its new transitions once the bucket is loaded (live).
func (ro *rollouts) apply(e jetstream.KeyValueEntry, live bool) {
	ro.mu.Lock()
	defer ro.mu.Unlock()
	fam := e.Key()
	if e.Operation() != jetstream.KeyValuePut {
		delete(ro.fams, fam)
		ro.setSplits()
		return
	}
	r, err := rollout.Decode(e.Value())
	if err != nil {
		ro.log.Error().Err(err).Str("family", fam).Msg("unreadable rollout in the bucket: ignored")
		return
	}
	f := ro.fams[fam]
	if f == nil || f.r.Model != r.Model {
		f = &rollingFamily{split: policy.NewSplit(r.Model, r.Share())}
		if old := ro.fams[fam]; old != nil && old.r.Started.Equal(r.Started) {
			f.newc, f.inc = old.newc, old.inc
		}
		ro.fams[fam] = f
	}
	if f.r != nil && f.r.Step != r.Step { // counts of the old step stay there
		f.newc, f.inc = rollout.Counts{}, rollout.Counts{}
	}
	f.r = r
	f.split.SetShare(r.Share())
	ro.setSplits()
	last, had := ro.seen[fam]
	if n := len(r.History); n > 0 {
		ro.seen[fam] = r.History[n-1]
	}
	if !live { // loading the bucket: what happened before is history, not news
		return
	}
	// the events after the last one seen (the history is trimmed at its
	// front, so its length says nothing)
	from := 0
	for i := len(r.History) - 1; had && i >= 0; i-- {
		if e := r.History[i]; e.At.Equal(last.At) && e.To == last.To && e.Model == last.Model && e.Reason == last.Reason {
			from = i + 1
			break
		}
	}
	for _, ev := range r.History[from:] {
		ro.transitions[ev.To]++
		l := ro.log.Info()
		if ev.To == rollout.RolledBack {
			l = ro.log.Warn()
		}
		if ev.Evidence != nil {
			x := ev.Evidence
			l = l.Int64("new_tasks", x.New.N()).Int64("new_failures", x.New.Failures).Int64("incumbent_tasks", x.Incumbent.N()).
				Int64("incumbent_failures", x.Incumbent.Failures).Float64("llr", x.LLR)
		}
		l.Str("family", fam).Str("model", ev.Model).Str("from", string(ev.From)).Str("to", string(ev.To)).
			Float64("share_pct", ev.Share).Str("by", ev.By).Str("reason", ev.Reason).Msg("rollout transition")
	}
}

// setSplits gives the engine the current splits; called with mu held.
func (ro *rollouts) setSplits() {
	splits := make([]*policy.Split, 0, len(ro.fams))
	for _, f := range ro.fams {
		splits = append(splits, f.split)
	}
	ro.active.Store(len(splits) > 0)
	ro.engine.SetSplits(splits)
}

// flush stores the counted outcomes and evaluates each running rollout.
func (ro *rollouts) flush(ctx context.Context) {
	type work struct {
		fam       string
		newc, inc rollout.Counts
		model     string
	}
	var todo []work
	ro.mu.Lock()
	for fam, f := range ro.fams {
		if f.r.State != rollout.Running && (f.newc.N()+f.inc.N() == 0 || f.r.State.Final()) {
			continue
		}
		open := ro.breakerOpen != nil && f.r.State == rollout.Running && ro.breakerOpen(f.r.Model)
		if f.newc.N()+f.inc.N() == 0 && !open {
			continue
		}
		todo = append(todo, work{fam: fam, newc: f.newc, inc: f.inc, model: f.r.Model})
		f.newc, f.inc = rollout.Counts{}, rollout.Counts{}
	}
	ro.mu.Unlock()
	for _, w := range todo {
		now := ro.now()
		_, err := ro.store.Update(ctx, w.fam, func(r *rollout.Rollout) (*rollout.Rollout, error) {
			if r == nil || r.Model != w.model || r.State.Final() {
				return nil, nil // gone, replaced or ended meanwhile: the counts are moot
			}
			r.Observe(true, w.newc)
			r.Observe(false, w.inc)
			r.Updated = now
			r.Evaluate(now, ro.breakerOpen != nil && ro.breakerOpen(r.Model))
			return r, nil
		})
		if err != nil {
			ro.log.Warn().Err(err).Str("family", w.fam).Msg("cannot store a rollout's counts: kept for the next flush")
			ro.mu.Lock()
			if f := ro.fams[w.fam]; f != nil && f.r.Model == w.model {
				f.newc, f.inc = f.newc.Add(w.newc), f.inc.Add(w.inc)
			}
			ro.mu.Unlock()
		}
	}
}

// rolloutView is a family's rollout as the report and the dashboard show it.
type rolloutView struct {
	Family  string
	Rollout *rollout.Rollout
}

// list returns the rollouts this replica follows, by family.
func (ro *rollouts) list() []rolloutView {
	if ro == nil {
		return nil
	}
	ro.mu.Lock()
	defer ro.mu.Unlock()
	out := make([]rolloutView, 0, len(ro.fams))
	for fam, f := range ro.fams {
		out = append(out, rolloutView{Family: fam, Rollout: f.r})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Family < out[j].Family })
	return out
}

// transitionCounts returns the transitions seen, by state.
func (ro *rollouts) transitionCounts() map[rollout.State]int64 {
	out := map[rollout.State]int64{}
	if ro == nil {
		return out
	}
	ro.mu.Lock()
	defer ro.mu.Unlock()
	for k, v := range ro.transitions {
		out[k] = v
	}
	return out
}

package dispatcher

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/dispatcher/internal/policy"
	"github.com/mlsched/mlsched/dispatcher/internal/registry"
	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/shared/lifecycle"
)

// refresher refreshes the statistics snapshot and the decision table every
// interval, so that no decision waits on Redis, and writes breaker
// transitions. When the store fails it keeps the last snapshot (degraded
// mode) with fresh node information.
type refresher struct {
	lifecycle.Loop
	store    stats.Store
	engine   *policy.Engine
	reg      *registry.Registry
	interval time.Duration
	log      zerolog.Logger

	table    atomic.Pointer[policy.Table]
	snap     atomic.Pointer[stats.Snapshot]
	degraded atomic.Pointer[string] // nil when the store answers
	// timeouts maps model names to their announced per-task timeout (ms).
	timeouts atomic.Pointer[map[string]int64]
	// share, when set, is told every count a table of this replica
	// changes (loadshare.Sharer.Note, policy.Table.ShareWith).
	share func(model, node string, d int64)
}

// Start builds the first table, so that the first decisions have one, then
// refreshes every interval, and rebuilds the table as soon as the nodes'
// membership changes, until Stop.
func (r *refresher) Start(ctx context.Context) error {
	return r.Go(ctx, func(rctx context.Context, ready func()) error {
		r.refresh(ctx)
		ready()
		t := time.NewTicker(r.interval)
		defer t.Stop()
		for {
			select {
			case <-rctx.Done():
				return nil
			case <-t.C:
				r.refresh(rctx)
			case <-r.reg.Changed():
				// a node joined, left or changed what it hosts: the
				// table follows now, on the last snapshot
				r.rebuild(time.Now(), r.snap.Load())
			}
		}
	})
}

// every runs f every interval until ctx is done.
func every(ctx context.Context, interval time.Duration, f func(context.Context)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f(ctx)
		}
	}
}

// refresh reads a snapshot, writes breaker transitions, and builds the next
// table.
func (r *refresher) refresh(ctx context.Context) {
	now := time.Now()
	rctx, cancel := context.WithTimeout(ctx, max(r.interval, time.Second))
	snap, err := r.store.Snapshot(rctx)
	cancel()
	if err != nil {
		reason := "statistics store unreachable: " + err.Error()
		if r.degraded.Swap(&reason) == nil {
			r.log.Warn().Err(err).Msg("degraded mode: deciding on the last statistics snapshot")
		}
		snap = r.snap.Load()
	} else {
		if r.degraded.Swap(nil) != nil {
			r.log.Info().Msg("statistics store is back: leaving degraded mode")
		}
		r.snap.Store(snap)
		for _, tr := range r.engine.Transitions(snap, now) {
			wctx, cancel := context.WithTimeout(ctx, time.Second)
			ok, err := r.store.SetBreaker(wctx, tr.Key, tr.From, tr.To)
			cancel()
			if err == nil && ok {
				r.log.Warn().Str("model", tr.Key.Model).Str("node", tr.Key.Node).
					Str("from", tr.From.State.String()).Str("to", tr.To.State.String()).Msg("circuit breaker changed")
			}
		}
	}
	r.rebuild(now, snap)
}

// rebuild builds the decision table from snap and the live nodes.
func (r *refresher) rebuild(now time.Time, snap *stats.Snapshot) {
	nodes := r.reg.Live()
	timeouts := map[string]int64{}
	for _, n := range nodes {
		for _, m := range n.Models {
			if m.TimeoutMs > timeouts[m.Name] {
				timeouts[m.Name] = m.TimeoutMs
			}
		}
	}
	r.timeouts.Store(&timeouts)
	t := policy.NewTable(snap, nodes, now)
	t.Carry(r.table.Load(), now)
	t.ShareWith(r.share)
	r.table.Store(t)
}

// Table is the decision table of the last snapshot (admission.Tables).
func (r *refresher) Table() *policy.Table { return r.table.Load() }

// Timeouts are the models' announced per-task timeouts (ms) of the last
// snapshot.
func (r *refresher) Timeouts() *map[string]int64 { return r.timeouts.Load() }

// breakerOpen reports whether a model's breaker is open in the last
// snapshot (rollouts roll back a version whose breaker opens).
func (r *refresher) breakerOpen(model string) bool {
	snap := r.snap.Load()
	if snap == nil {
		return false
	}
	m := snap.Models[model]
	return m != nil && m.Breaker.State == stats.BreakerOpen
}

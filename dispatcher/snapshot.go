package dispatcher

import (
	"context"
	"time"

	"github.com/mlsched/mlsched/shared/policy"
)

// snapshotLoop refreshes the statistics snapshot and the decision table
// every SnapshotInterval, so that no decision waits on Redis.
func (d *Dispatcher) snapshotLoop(ctx context.Context) {
	every(ctx, d.cfg.SnapshotInterval, d.refresh)
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
// table. When the store fails the dispatcher keeps deciding on its last
// snapshot (degraded mode) with fresh node information.
func (d *Dispatcher) refresh(ctx context.Context) {
	now := time.Now()
	rctx, cancel := context.WithTimeout(ctx, max(d.cfg.SnapshotInterval, time.Second))
	snap, err := d.store.Snapshot(rctx)
	cancel()
	if err != nil {
		reason := "statistics store unreachable: " + err.Error()
		if d.degraded.Swap(&reason) == nil {
			d.log.Warn().Err(err).Msg("degraded mode: deciding on the last statistics snapshot")
		}
		snap = d.snap.Load()
	} else {
		if d.degraded.Swap(nil) != nil {
			d.log.Info().Msg("statistics store is back: leaving degraded mode")
		}
		d.snap.Store(snap)
		for _, tr := range d.engine.Transitions(snap, now) {
			wctx, cancel := context.WithTimeout(ctx, time.Second)
			ok, err := d.store.SetBreaker(wctx, tr.Key, tr.From, tr.To)
			cancel()
			if err == nil && ok {
				d.log.Warn().Str("model", tr.Key.Model).Str("node", tr.Key.Node).
					Str("from", tr.From.State.String()).Str("to", tr.To.State.String()).Msg("circuit breaker changed")
			}
		}
	}
	nodes := d.reg.Live()
	timeouts := map[string]int64{}
	for _, n := range nodes {
		for _, m := range n.Models {
			if m.TimeoutMs > timeouts[m.Name] {
				timeouts[m.Name] = m.TimeoutMs
			}
		}
	}
	d.timeouts.Store(&timeouts)
	d.table.Store(policy.NewTable(snap, nodes, now))
}

package simulate

import (
	"context"
	"fmt"
	"time"

	"github.com/mlsched/mlsched/dispatcher/internal/policy"
	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/shared/protocol"
)

// policyDecider is the dispatcher's decision loop in miniature: the real
// Engine deciding on a real Table rebuilt from the real store.
type policyDecider struct {
	eng   *policy.Engine
	store stats.Store
	table *policy.Table
}

func newPolicyDecider(cfg policy.Config, store stats.Store, seed uint64) (*policyDecider, error) {
	if cfg.Seed == 0 {
		cfg.Seed = seed
	}
	eng, err := policy.NewEngine(cfg)
	if err != nil {
		return nil, err
	}
	return &policyDecider{eng: eng, store: store}, nil
}

// refresh applies due breaker transitions, as every dispatcher replica does
// on its snapshot refresh, and rebuilds the table.
func (d *policyDecider) refresh(ctx context.Context, now time.Time, nodes []protocol.Heartbeat) error {
	snap, err := d.store.Snapshot(ctx)
	if err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	changed := false
	for _, tr := range d.eng.Transitions(snap, now) {
		ok, err := d.store.SetBreaker(ctx, tr.Key, tr.From, tr.To)
		if err != nil {
			return fmt.Errorf("set breaker %v: %w", tr.Key, err)
		}
		changed = changed || ok
	}
	if changed {
		if snap, err = d.store.Snapshot(ctx); err != nil {
			return fmt.Errorf("snapshot: %w", err)
		}
	}
	d.table = policy.NewTable(snap, nodes, now)
	return nil
}

func (d *policyDecider) decide(req *policy.Request) (policy.Decision, error) {
	dec, err := d.eng.Decide(d.table, req)
	if err != nil {
		return dec, err
	}
	d.table.Dispatched(dec.Model, dec.Node)
	return dec, nil
}

func (d *policyDecider) peek(req *policy.Request) (policy.Decision, error) {
	return d.eng.Decide(d.table, req)
}

func (d *policyDecider) sent(model, node string) { d.table.Dispatched(model, node) }

func (d *policyDecider) completed(model, node string) { d.table.Completed(model, node) }

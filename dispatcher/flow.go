package dispatcher

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/mlsched/mlsched/dispatcher/internal/budget"
	"github.com/mlsched/mlsched/shared/config"
	"github.com/mlsched/mlsched/shared/protocol"
)

// Flow control (docs/policies.md, "Flow control"): a task's priority,
// tenant and deadline_ms. The priority bands are pulled through a consumer
// each (topology.BandConsumer); the hold (hold.go) serves the highest
// priority first and shares a band between tenants by weight; a deadline
// bounds the whole wait, so that an expired task is never started.

// flowRules is the flow-control configuration, parsed once.
type flowRules struct {
	// deadlines are the per-type default deadlines (MLSCHED_TYPE_DEADLINES)
	// of tasks that set no deadline_ms.
	deadlines map[string]time.Duration
	// weights are the tenants' shares inside a band
	// (MLSCHED_TENANT_WEIGHTS, default 1).
	weights map[string]float64
	// rates are the tenants' rate quotas (MLSCHED_TENANT_RATES, tasks/s).
	rates map[string]float64
	// caps are the tenants' concurrency caps (MLSCHED_TENANT_CONCURRENCY,
	// tasks in flight).
	caps map[string]int
	// budgets are the tenants' and types' cost budgets
	// (MLSCHED_TENANT_BUDGETS, MLSCHED_TYPE_BUDGETS).
	budgets []budget.Budget
}

// parseFlowRules reads the flow-control variables of c.
func parseFlowRules(c *Config) (*flowRules, error) {
	r := &flowRules{deadlines: map[string]time.Duration{}, weights: map[string]float64{}, rates: map[string]float64{},
		caps: map[string]int{}}
	for k, v := range c.TenantRates {
		tenant, val := strings.TrimSpace(k), strings.TrimSpace(v)
		rate, err := strconv.ParseFloat(val, 64)
		if err == nil && (rate <= 0 || math.IsInf(rate, 0) || math.IsNaN(rate)) {
			err = fmt.Errorf("must be a positive number of tasks per second")
		}
		if err == nil {
			err = protocol.ValidToken(tenant, protocol.MaxTenantLen)
		}
		if err != nil {
			return nil, fmt.Errorf("invalid %s_TENANT_RATES entry %s:%s: %w", config.Prefix, tenant, val, err)
		}
		r.rates[tenant] = rate
	}
	for k, v := range c.TenantConcurrency {
		tenant, val := strings.TrimSpace(k), strings.TrimSpace(v)
		n, err := strconv.Atoi(val)
		if err == nil && (n <= 0 || n > 1_000_000) {
			err = fmt.Errorf("must be a whole number of tasks in flight, 1 to 1000000")
		}
		if err == nil {
			err = protocol.ValidToken(tenant, protocol.MaxTenantLen)
		}
		if err != nil {
			return nil, fmt.Errorf("invalid %s_TENANT_CONCURRENCY entry %s:%s: %w", config.Prefix, tenant, val, err)
		}
		r.caps[tenant] = n
	}
	for _, set := range []struct {
		scope budget.Scope
		env   string
		m     map[string]string
		max   int
	}{{budget.Tenant, "TENANT_BUDGETS", c.TenantBudgets, protocol.MaxTenantLen}, {budget.Type, "TYPE_BUDGETS", c.TypeBudgets, 64}} {
		for k, v := range set.m {
			name, val := strings.TrimSpace(k), strings.TrimSpace(v)
			b, err := budget.Parse(set.scope, name, val)
			if err == nil {
				err = protocol.ValidToken(name, set.max)
			}
			if err != nil {
				return nil, fmt.Errorf("invalid %s_%s entry %s:%s: %w", config.Prefix, set.env, name, val, err)
			}
			r.budgets = append(r.budgets, b)
		}
	}
	for k, v := range c.TypeDeadlines {
		typ, val := strings.TrimSpace(k), strings.TrimSpace(v)
		d, err := time.ParseDuration(val)
		if err == nil && (d <= 0 || d > time.Duration(protocol.DefaultLimits.MaxDeadlineMs)*time.Millisecond) {
			err = fmt.Errorf("must be positive and at most 24h")
		}
		if err == nil {
			err = protocol.ValidToken(typ, 64)
		}
		if err != nil {
			return nil, fmt.Errorf("invalid %s_TYPE_DEADLINES entry %s:%s: %w", config.Prefix, typ, val, err)
		}
		r.deadlines[typ] = d
	}
	for k, v := range c.TenantWeights {
		tenant, val := strings.TrimSpace(k), strings.TrimSpace(v)
		w, err := strconv.ParseFloat(val, 64)
		if err == nil && (w <= 0 || math.IsInf(w, 0) || math.IsNaN(w) || w > 1000) {
			err = fmt.Errorf("must be in (0, 1000]")
		}
		if err == nil {
			err = protocol.ValidToken(tenant, protocol.MaxTenantLen)
		}
		if err != nil {
			return nil, fmt.Errorf("invalid %s_TENANT_WEIGHTS entry %s:%s: %w", config.Prefix, tenant, val, err)
		}
		r.weights[tenant] = w
	}
	return r, nil
}

// Weight is a tenant's share inside a band. A nil *flowRules has no rules.
func (r *flowRules) Weight(tenant string) float64 {
	if r == nil {
		return 1
	}
	if w, ok := r.weights[tenant]; ok {
		return w
	}
	return 1
}

// Expiry is when the task's deadline passes, counted from its submission
// (zero: it has none).
func (r *flowRules) Expiry(t *protocol.Task, submitted time.Time) time.Time {
	d := time.Duration(t.DeadlineMs) * time.Millisecond
	if d <= 0 && r != nil {
		d = r.deadlines[t.Type]
	}
	if d <= 0 || submitted.IsZero() {
		return time.Time{}
	}
	return submitted.Add(d)
}

// Rate is a tenant's rate quota in tasks/s (0: none).
func (r *flowRules) Rate(tenant string) float64 {
	if r == nil {
		return 0
	}
	return r.rates[tenant]
}

// Cap is a tenant's concurrency cap (0: none).
func (r *flowRules) Cap(tenant string) int {
	if r == nil {
		return 0
	}
	return r.caps[tenant]
}

package dispatcher

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
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

// weight is a tenant's share inside a band. A nil *flowRules has no rules.
func (r *flowRules) weight(tenant string) float64 {
	if r == nil {
		return 1
	}
	if w, ok := r.weights[tenant]; ok {
		return w
	}
	return 1
}

// expiry is when the task's deadline passes, counted from its submission
// (zero: it has none).
func (r *flowRules) expiry(t *protocol.Task, submitted time.Time) time.Time {
	d := time.Duration(t.DeadlineMs) * time.Millisecond
	if d <= 0 && r != nil {
		d = r.deadlines[t.Type]
	}
	if d <= 0 || submitted.IsZero() {
		return time.Time{}
	}
	return submitted.Add(d)
}

// expiredError is the error of a task whose deadline passed before it
// could start.
func expiredError(t *protocol.Task, expiry time.Time, where string) error {
	return protocol.Errorf(protocol.CodeExpired, "the task's deadline (%s after submission) passed at %s %s; it was not started",
		time.Duration(t.DeadlineMs)*time.Millisecond, expiry.UTC().Format(time.RFC3339Nano), where)
}

// drainMeter measures how fast this replica sends held work on (dispatches
// per second, smoothed), for the retry_after_ms of a task it sheds, rejects
// or lets expire.
type drainMeter struct {
	mu    sync.Mutex
	start time.Time
	n     int
	rate  float64 // per second, exponentially smoothed over 1 s windows
}

// dispatched counts one dispatch (a nil meter measures nothing).
func (m *drainMeter) dispatched(now time.Time) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.start.IsZero() {
		m.start = now
	}
	m.n++
	if el := now.Sub(m.start); el >= time.Second {
		r := float64(m.n) / el.Seconds()
		if m.rate == 0 {
			m.rate = r
		} else {
			m.rate = 0.7*m.rate + 0.3*r
		}
		m.start, m.n = now, 0
	}
}

// perSecond is the measured drain rate (0: none yet).
func (m *drainMeter) perSecond() float64 {
	if m == nil {
		return 0
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.rate
}

// retryAfter estimates when waiting work of the given size is drained: at
// least 100 ms, at most a minute; a second when nothing is measured yet.
func (m *drainMeter) retryAfter(waiting int) time.Duration {
	if m == nil {
		return time.Second
	}
	m.mu.Lock()
	rate := m.rate
	m.mu.Unlock()
	if rate <= 0 {
		return time.Second
	}
	d := time.Duration(float64(waiting+1) / rate * float64(time.Second))
	return min(max(d, 100*time.Millisecond), time.Minute)
}

// Package budget keeps the cost budgets of tenants and task types: so many
// cost units per period (a minute, an hour, a day), shared by every
// dispatcher replica through Redis, as the rate quotas are.
//
// A budget is charged when an attempt is dispatched, with what the chosen
// model declares for the task's size (protocol.ModelInfo.Cost): the cost of
// work is incurred when it runs, whatever its outcome, so retries are
// charged too. The charge and the check are one script on the Redis
// server's clock: an attempt is admitted only when it fits what is left of
// every budget it falls under, so no replica can spend what another
// already has, and a period's spending never exceeds its limit.
//
// Periods are calendar periods in UTC (each minute, hour or day starts on
// a multiple of its length since the Unix epoch): every replica sees the
// same period, and a refusal's retry-after is the time left in it.
//
// With Redis down each replica keeps a local ledger of its share (the limit
// divided by the replicas last seen live) and says so (Degraded): a budget
// still holds, to within the replicas' count, and no task is turned away
// for the fault itself.
package budget

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Scope is what a budget applies to.
type Scope string

// Scopes.
const (
	Tenant Scope = "tenant"
	Type   Scope = "type"
)

// Action is what happens to an attempt that does not fit its budget.
type Action string

// Actions.
const (
	// Refuse ends the task with budget_exceeded and a retry-after (the
	// default).
	Refuse Action = "refuse"
	// Degrade sends it on to the cheapest model that still clears the
	// type's success bar, and charges it (the budget may then be exceeded
	// by such attempts, which the metrics show).
	Degrade Action = "degrade"
)

// Budget is one limit.
type Budget struct {
	Scope  Scope
	Name   string        // the tenant or the task type
	Limit  float64       // cost units per period
	Period time.Duration // a whole number of milliseconds
	Action Action
}

// Key names the budget: "tenant:acme", "type:classify".
func (b Budget) Key() string { return string(b.Scope) + ":" + b.Name }

// Parse reads one budget from its configuration form, LIMIT/PERIOD or
// LIMIT/PERIOD/ACTION: "100/1h", "5000/day/degrade". PERIOD is a Go
// duration of at least a second or minute, hour, day.
func Parse(scope Scope, name, s string) (Budget, error) {
	b := Budget{Scope: scope, Name: name, Action: Refuse}
	parts := strings.Split(s, "/")
	if len(parts) < 2 || len(parts) > 3 {
		return b, fmt.Errorf("budget %s %q: want LIMIT/PERIOD[/refuse|degrade], e.g. 100/1h", b.Key(), s)
	}
	limit, err := strconv.ParseFloat(parts[0], 64)
	if err != nil || !(limit > 0) || math.IsInf(limit, 0) {
		return b, fmt.Errorf("budget %s %q: the limit %q is not a positive number", b.Key(), s, parts[0])
	}
	b.Limit = limit
	switch p := parts[1]; p {
	case "minute":
		b.Period = time.Minute
	case "hour":
		b.Period = time.Hour
	case "day":
		b.Period = 24 * time.Hour
	default:
		d, err := time.ParseDuration(p)
		if err != nil || d < time.Second || d%time.Millisecond != 0 {
			return b, fmt.Errorf("budget %s %q: the period %q is not minute, hour, day or a duration of at least 1s", b.Key(), s, p)
		}
		b.Period = d
	}
	if len(parts) == 3 {
		switch a := Action(parts[2]); a {
		case Refuse, Degrade:
			b.Action = a
		default:
			return b, fmt.Errorf("budget %s %q: the action %q is neither refuse nor degrade", b.Key(), s, parts[2])
		}
	}
	return b, nil
}

// Params configures a Ledger.
type Params struct {
	Budgets []Budget
	// Redis nil means the memory store (one replica).
	Redis redis.UniversalClient
	// Replicas counts the replicas that share the budgets, for degraded
	// mode: called on each charge through Redis (it should register the
	// replica and count, rate-limited) and with Redis down (it should
	// give the last count). nil: 1.
	Replicas func(context.Context) int
	// Now is the clock of the memory store and degraded mode (nil:
	// time.Now).
	Now func() time.Time
}

// Ledger charges attempts to their budgets. Safe for concurrent use; a nil
// Ledger has no budgets.
type Ledger struct {
	tenants, types map[string]Budget
	rc             redis.UniversalClient
	replicas       func(context.Context) int
	now            func() time.Time
	timeout        time.Duration

	mu    sync.Mutex
	local map[string]*period // degraded mode and the memory store
	// last is each budget's spending as last read (for Status).
	last     map[string]period
	degraded atomic.Pointer[string]
	retryAt  atomic.Int64 // after a Redis failure: local until then
}

type period struct {
	index int64   // the period's number since the epoch
	spent float64 // in it
}

// New builds a ledger of the given budgets.
func New(p Params) *Ledger {
	l := &Ledger{tenants: map[string]Budget{}, types: map[string]Budget{}, rc: p.Redis, replicas: p.Replicas, now: p.Now,
		timeout: 250 * time.Millisecond, local: map[string]*period{}, last: map[string]period{}}
	if l.now == nil {
		l.now = time.Now
	}
	if l.replicas == nil {
		l.replicas = func(context.Context) int { return 1 }
	}
	for _, b := range p.Budgets {
		if b.Scope == Tenant {
			l.tenants[b.Name] = b
		} else {
			l.types[b.Name] = b
		}
	}
	return l
}

// Limited reports whether a task of this tenant and type falls under any
// budget (nothing to charge otherwise).
func (l *Ledger) Limited(tenant, typ string) bool {
	if l == nil {
		return false
	}
	_, a := l.tenants[tenant]
	_, b := l.types[typ]
	return a || b
}

// Degraded is why budgets are kept per replica ("" when they are not):
// Redis did not answer.
func (l *Ledger) Degraded() string {
	if l == nil {
		return ""
	}
	if p := l.degraded.Load(); p != nil {
		return *p
	}
	return ""
}

// Verdict is a charge's answer.
type Verdict struct {
	// OK: the attempt fits every budget it falls under and is charged.
	OK bool
	// Over is the first budget it does not fit (when !OK), RetryAfter the
	// time left in that budget's period.
	Over       Budget
	RetryAfter time.Duration
}

// Charge charges cost to the budgets of the tenant and the type, all or
// none: when the cost does not fit one of them, nothing is charged and the
// verdict names that budget. force charges even then (a degraded task,
// a charge that must not be refused).
func (l *Ledger) Charge(ctx context.Context, tenant, typ string, cost float64, force bool) Verdict {
	bs := l.applicable(tenant, typ)
	if len(bs) == 0 || !(cost >= 0) {
		return Verdict{OK: true}
	}
	if l.rc != nil && l.now().UnixNano() >= l.retryAt.Load() {
		v, err := l.chargeRedis(ctx, bs, cost, force)
		if err == nil {
			l.replicas(ctx)
			l.degraded.Store(nil)
			return v
		}
		why := "redis: " + err.Error()
		l.degraded.Store(&why)
		l.retryAt.Store(l.now().Add(time.Second).UnixNano())
	}
	share := 1
	if l.rc != nil {
		share = max(1, l.replicas(ctx))
	}
	return l.chargeLocal(bs, cost, force, share)
}

func (l *Ledger) applicable(tenant, typ string) []Budget {
	var bs []Budget
	if b, ok := l.tenants[tenant]; ok {
		bs = append(bs, b)
	}
	if b, ok := l.types[typ]; ok {
		bs = append(bs, b)
	}
	return bs
}

func (l *Ledger) chargeLocal(bs []Budget, cost float64, force bool, share int) Verdict {
	now := l.now()
	ms := now.UnixMilli()
	l.mu.Lock()
	defer l.mu.Unlock()
	ps := make([]*period, len(bs))
	for i, b := range bs {
		idx := ms / b.Period.Milliseconds()
		p := l.local[b.Key()]
		if p == nil || p.index != idx {
			p = &period{index: idx}
			l.local[b.Key()] = p
		}
		ps[i] = p
		if !force && p.spent+cost > b.Limit/float64(share) {
			return Verdict{Over: b, RetryAfter: time.Duration((idx+1)*b.Period.Milliseconds()-ms) * time.Millisecond}
		}
	}
	for i, b := range bs {
		ps[i].spent += cost
		l.last[b.Key()] = *ps[i]
	}
	return Verdict{OK: true}
}

// chargeScript checks and charges every budget on the server's clock.
// KEYS: one hash per budget (period, spent). ARGV: cost, force, then each
// budget's limit and period in ms. Reply: {0, spent...} charged, or
// {i, ms left in budget i's period}.
var chargeScript = redis.NewScript(`
local cost, force = tonumber(ARGV[1]), ARGV[2] == '1'
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local spent, idx = {}, {}
for i, k in ipairs(KEYS) do
  local limit, per = tonumber(ARGV[1 + 2 * i]), tonumber(ARGV[2 + 2 * i])
  idx[i] = math.floor(now / per)
  local h = redis.call('HMGET', k, 'period', 'spent')
  spent[i] = 0
  if tonumber(h[1]) == idx[i] then spent[i] = tonumber(h[2]) or 0 end
  if not force and spent[i] + cost > limit then
    return {i, (idx[i] + 1) * per - now}
  end
end
local out = {0}
for i, k in ipairs(KEYS) do
  local per = tonumber(ARGV[2 + 2 * i])
  spent[i] = spent[i] + cost
  redis.call('HSET', k, 'period', idx[i], 'spent', tostring(spent[i]))
  redis.call('PEXPIRE', k, 2 * per)
  out[#out + 1] = tostring(spent[i])
  out[#out + 1] = idx[i]
end
return out
`)

// key is the budget's hash in Redis; the hash tag keeps a task's budgets
// in one slot of a Redis Cluster, as the script needs.
func key(b Budget) string { return "mlsched:budget:{budgets}:" + b.Key() }

func (l *Ledger) chargeRedis(ctx context.Context, bs []Budget, cost float64, force bool) (Verdict, error) {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	keys := make([]string, len(bs))
	args := []any{strconv.FormatFloat(cost, 'g', -1, 64), "0"}
	if force {
		args[1] = "1"
	}
	for i, b := range bs {
		keys[i] = key(b)
		args = append(args, strconv.FormatFloat(b.Limit, 'g', -1, 64), b.Period.Milliseconds())
	}
	v, err := chargeScript.Run(ctx, l.rc, keys, args...).Slice()
	if err != nil {
		return Verdict{}, err
	}
	if len(v) == 0 {
		return Verdict{}, errors.New("budget script: empty reply")
	}
	first, _ := v[0].(int64)
	if first > 0 {
		if int(first) > len(bs) || len(v) != 2 {
			return Verdict{}, errors.New("budget script: unexpected reply")
		}
		left, _ := v[1].(int64)
		return Verdict{Over: bs[first-1], RetryAfter: time.Duration(left) * time.Millisecond}, nil
	}
	if len(v) != 1+2*len(bs) {
		return Verdict{}, errors.New("budget script: unexpected reply")
	}
	l.mu.Lock()
	for i, b := range bs {
		s, _ := v[1+2*i].(string)
		spent, _ := strconv.ParseFloat(s, 64)
		idx, _ := v[2+2*i].(int64)
		l.last[b.Key()] = period{index: idx, spent: spent}
	}
	l.mu.Unlock()
	return Verdict{OK: true}, nil
}

// Status is one budget's spending in its current period, as this replica
// last charged or read it.
type Status struct {
	Budget
	Spent float64
	// Ends is when the current period ends.
	Ends time.Time
}

// Statuses are every budget's, in key order: what metrics and `mlsched
// stats` show. Spending of a period this replica has not charged in reads
// as 0 until Refresh reads it.
func (l *Ledger) Statuses() []Status {
	if l == nil {
		return nil
	}
	now := l.now().UnixMilli()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Status
	for _, m := range []map[string]Budget{l.tenants, l.types} {
		for _, b := range m {
			idx := now / b.Period.Milliseconds()
			s := Status{Budget: b, Ends: time.UnixMilli((idx + 1) * b.Period.Milliseconds()).UTC()}
			if p, ok := l.last[b.Key()]; ok && p.index == idx {
				s.Spent = p.spent
			}
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key() < out[j].Key() })
	return out
}

// Refresh reads every budget's spending from Redis (what other replicas
// charged too), for Statuses. Without Redis it does nothing.
func (l *Ledger) Refresh(ctx context.Context) error {
	if l == nil || l.rc == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	var bs []Budget
	for _, m := range []map[string]Budget{l.tenants, l.types} {
		for _, b := range m {
			bs = append(bs, b)
		}
	}
	pipe := l.rc.Pipeline()
	cmds := make([]*redis.SliceCmd, len(bs))
	for i, b := range bs {
		cmds[i] = pipe.HMGet(ctx, key(b), "period", "spent")
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("read budgets: %w", err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, b := range bs {
		v := cmds[i].Val()
		if len(v) != 2 {
			continue
		}
		ps, _ := v[0].(string)
		ss, _ := v[1].(string)
		idx, err1 := strconv.ParseInt(ps, 10, 64)
		spent, err2 := strconv.ParseFloat(ss, 64)
		if err1 == nil && err2 == nil {
			l.last[b.Key()] = period{index: idx, spent: spent}
		}
	}
	return nil
}

package quota

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Concurrency caps (MLSCHED_TENANT_CONCURRENCY): a tenant's tasks in
// flight, dispatched and not yet finished. With Redis each capped tenant
// has a sorted set of its task ids scored by their attempt's deadline (on
// the server's clock), pruned on every read: a replica that dies with
// tasks in flight leaks nothing past their deadlines, as a bare counter
// would. A task's final result, stored by any replica, takes its id out of
// every capped tenant's set (the outcome of a success does not name the
// tenant; ids are unique, and the capped tenants few). With the memory
// store the same sets are local; with Redis down each replica holds its
// tenants to the cap divided by the live replicas it last saw (at least 1).

// Capped reports whether the tenant has a concurrency cap.
func (l *Limiter) Capped(tenant string) bool {
	if l == nil {
		return false
	}
	_, ok := l.caps[tenant]
	return ok
}

// HasCaps reports whether any tenant is capped (Release costs nothing
// otherwise).
func (l *Limiter) HasCaps() bool { return l != nil && len(l.caps) > 0 }

// Cap is the tenant's concurrency cap (0: none).
func (l *Limiter) Cap(tenant string) int {
	if l == nil {
		return 0
	}
	return l.caps[tenant]
}

// Acquire counts the task in flight for its tenant until ttl from now
// (its attempt's deadline): ok, or how long until the earliest task in
// flight reaches its deadline. A task already counted is counted again
// (its deadline moved) whatever the cap; force counts it over the cap (a
// retry of a task that was in flight).
func (l *Limiter) Acquire(ctx context.Context, tenant, id string, ttl time.Duration, force bool) (ok bool, retryAfter time.Duration) {
	limit, capped := l.caps[tenant]
	if !capped {
		return true, 0
	}
	ttl = max(ttl, time.Millisecond)
	if l.rc != nil {
		if time.Now().UnixNano() >= l.retryAt.Load() {
			ok, wait, err := l.acquireRedis(ctx, tenant, id, limit, ttl, force)
			if err == nil {
				l.degraded.Store(nil)
				return ok, wait
			}
			l.redisFailed(err)
		}
		if l.Degraded() != "" {
			limit = max(1, limit/l.liveReplicas())
		}
	}
	return l.acquireLocal(tenant, id, limit, ttl, force, time.Now())
}

// Release: the task is finished (its final result is stored), in flight
// for no tenant any more.
func (l *Limiter) Release(ctx context.Context, id string) {
	if !l.HasCaps() {
		return
	}
	l.mu.Lock()
	for _, set := range l.flight {
		delete(set, id)
	}
	l.mu.Unlock()
	if l.rc == nil || time.Now().UnixNano() < l.retryAt.Load() {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	pipe := l.rc.Pipeline()
	for tenant := range l.caps {
		pipe.ZRem(ctx, flightKey(tenant), id)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		l.redisFailed(err) // the id leaves the set at its deadline anyway
	}
}

// InFlight is the tenant's count of tasks in flight as this replica sees
// it (Redis' when it answers).
func (l *Limiter) InFlight(ctx context.Context, tenant string) (int, error) {
	if l.rc == nil || l.Degraded() != "" {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.pruneLocked(tenant, time.Now())
		return len(l.flight[tenant]), nil
	}
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	n, err := countScript.Run(ctx, l.rc, []string{flightKey(tenant)}).Int()
	return n, err
}

func (l *Limiter) redisFailed(err error) {
	l.retryAt.Store(time.Now().Add(time.Second).UnixNano())
	why := fmt.Sprintf("Redis does not answer (%v): each replica enforces the quota divided by the %d replicas it last saw", err, l.liveReplicas())
	l.degraded.Store(&why)
}

func flightKey(tenant string) string { return "mlsched:inflight:{" + tenant + "}" }

func (l *Limiter) pruneLocked(tenant string, now time.Time) {
	for id, until := range l.flight[tenant] {
		if !now.Before(until) {
			delete(l.flight[tenant], id)
		}
	}
}

func (l *Limiter) acquireLocal(tenant, id string, limit int, ttl time.Duration, force bool, now time.Time) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	set := l.flight[tenant]
	if set == nil {
		set = map[string]time.Time{}
		l.flight[tenant] = set
	}
	l.pruneLocked(tenant, now)
	if _, in := set[id]; in || force || len(set) < limit {
		set[id] = now.Add(ttl)
		return true, 0
	}
	var first time.Time
	for _, until := range set {
		if first.IsZero() || until.Before(first) {
			first = until
		}
	}
	return false, max(first.Sub(now), time.Millisecond)
}

// acquireScript prunes the tenant's set by the server's clock and adds the
// task: {1, 0} or {0, ms until the earliest deadline}.
var acquireScript = redis.NewScript(`
local limit, id, ttl, force = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3]), ARGV[4] == '1'
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if force or redis.call('ZSCORE', KEYS[1], id) or redis.call('ZCARD', KEYS[1]) < limit then
  redis.call('ZADD', KEYS[1], now + ttl, id)
  if redis.call('PTTL', KEYS[1]) < ttl + 1000 then redis.call('PEXPIRE', KEYS[1], ttl + 1000) end
  return {1, 0}
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {0, math.max(1, tonumber(first[2]) - now)}
`)

// countScript prunes the tenant's set and counts it.
var countScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZCARD', KEYS[1])
`)

func (l *Limiter) acquireRedis(ctx context.Context, tenant, id string, limit int, ttl time.Duration, force bool) (bool, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	l.countReplicas(ctx)
	f := "0"
	if force {
		f = "1"
	}
	v, err := acquireScript.Run(ctx, l.rc, []string{flightKey(tenant)}, limit, id, ttl.Milliseconds()+1, f).Int64Slice()
	if err != nil {
		return false, 0, err
	}
	if len(v) != 2 {
		return false, 0, errors.New("concurrency script: unexpected reply")
	}
	return v[0] == 1, time.Duration(v[1]) * time.Millisecond, nil
}

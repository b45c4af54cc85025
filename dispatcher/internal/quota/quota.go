// Package quota enforces the tenants' rate quotas (tasks per second, a
// token bucket each) that every dispatcher replica shares. With Redis the
// buckets live there, one hash per tenant updated by one script on the
// server's clock, so the quota holds whatever the number of replicas. With
// the memory store (one replica) the same buckets are local. With Redis
// down each replica keeps a local bucket of the quota divided by the
// replicas it last saw live (each registers itself in Redis), and says so:
// Degraded. The same holds for the tenants' concurrency caps
// (concurrency.go).
package quota

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Limiter decides whether a tenant's next task is within its rate quota.
type Limiter struct {
	rates   map[string]float64 // tasks/s per tenant; a tenant absent has no quota
	caps    map[string]int     // tasks in flight per tenant; a tenant absent has no cap
	rc      redis.UniversalClient
	replica string
	timeout time.Duration

	mu       sync.Mutex
	local    map[string]*bucket
	flight   map[string]map[string]time.Time // tenant: task id: deadline (memory store, degraded mode)
	replicas int                             // live replicas last seen through Redis (1 before)
	seen     time.Time                       // when the replicas were last counted
	degraded atomic.Pointer[string]
	// retryAt: after a Redis failure the local share is used until then,
	// so that an outage does not cost every task a timeout.
	retryAt atomic.Int64
}

// Params configures a Limiter.
type Params struct {
	Rates map[string]float64 // tasks/s per tenant
	Caps  map[string]int     // tasks in flight per tenant
	// Redis nil means the memory store (one replica).
	Redis redis.UniversalClient
	// Replica names this replica in Redis' live set.
	Replica string
}

// New builds a limiter of the given rates and caps.
func New(p Params) *Limiter {
	return &Limiter{rates: p.Rates, caps: p.Caps, rc: p.Redis, replica: p.Replica, timeout: 250 * time.Millisecond,
		local: map[string]*bucket{}, flight: map[string]map[string]time.Time{}, replicas: 1}
}

// Limited reports whether the tenant has a quota at all (no cost
// otherwise).
func (l *Limiter) Limited(tenant string) bool {
	if l == nil {
		return false
	}
	_, ok := l.rates[tenant]
	return ok
}

// Degraded is why the quota is enforced per replica ("" when it is not):
// Redis did not answer.
func (l *Limiter) Degraded() string {
	if l == nil {
		return ""
	}
	if p := l.degraded.Load(); p != nil {
		return *p
	}
	return ""
}

// burst is a bucket's depth: a tenth of a second of its rate (at least
// one task), so that no window of 10 s admits more than 1% over the rate.
func burst(rate float64) float64 { return max(1, rate/10) }

// Allow takes one token of the tenant's bucket: ok, or how long until
// the next token.
func (l *Limiter) Allow(ctx context.Context, tenant string) (ok bool, retryAfter time.Duration) {
	rate, limited := l.rates[tenant]
	if !limited {
		return true, 0
	}
	if l.rc != nil {
		if time.Now().UnixNano() >= l.retryAt.Load() {
			ok, wait, err := l.allowRedis(ctx, tenant, rate)
			if err == nil {
				l.degraded.Store(nil)
				return ok, wait
			}
			l.redisFailed(err)
		}
		if l.Degraded() != "" {
			rate /= float64(l.liveReplicas())
		}
	}
	return l.allowLocal(tenant, rate, time.Now())
}

// Replicas registers this replica in Redis and counts the live ones (every
// 2 s at most; the last count when Redis does not answer): the divisor
// other shared limits (the cost budgets) use when Redis is down.
func (l *Limiter) Replicas(ctx context.Context) int {
	if l.rc != nil {
		ctx, cancel := context.WithTimeout(ctx, l.timeout)
		defer cancel()
		l.countReplicas(ctx)
	}
	return l.liveReplicas()
}

func (l *Limiter) liveReplicas() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return max(1, l.replicas)
}

type bucket struct {
	tokens float64
	at     time.Time
}

func (l *Limiter) allowLocal(tenant string, rate float64, now time.Time) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.local[tenant]
	if b == nil {
		b = &bucket{tokens: burst(rate), at: now}
		l.local[tenant] = b
	}
	b.tokens = math.Min(burst(rate), b.tokens+now.Sub(b.at).Seconds()*rate)
	b.at = now
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	return false, time.Duration((1 - b.tokens) / rate * float64(time.Second))
}

// takeScript refills the bucket by the server's clock and takes a token:
// {1, 0} or {0, ms until the next token}.
var takeScript = redis.NewScript(`
local rate, depth = tonumber(ARGV[1]), tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local b = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens, at = tonumber(b[1]), tonumber(b[2])
if tokens == nil or at == nil then tokens, at = depth, now end
tokens = math.min(depth, tokens + math.max(0, now - at) * rate / 1000)
local ok, wait = 0, 0
if tokens >= 1 then tokens = tokens - 1; ok = 1 else wait = math.ceil((1 - tokens) * 1000 / rate) end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', now)
redis.call('PEXPIRE', KEYS[1], 60000)
return {ok, wait}
`)

// presenceKey is the sorted set of live replicas, scored by their last
// registration (ms).
const presenceKey = "mlsched:quota:replicas"

func (l *Limiter) allowRedis(ctx context.Context, tenant string, rate float64) (bool, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	l.countReplicas(ctx)
	v, err := takeScript.Run(ctx, l.rc, []string{"mlsched:quota:{" + tenant + "}"}, rate, burst(rate)).Int64Slice()
	if err != nil {
		return false, 0, err
	}
	if len(v) != 2 {
		return false, 0, errors.New("quota script: unexpected reply")
	}
	return v[0] == 1, time.Duration(v[1]) * time.Millisecond, nil
}

// countReplicas registers this replica and counts the live ones, every 2 s
// at most: the divisor of degraded mode.
func (l *Limiter) countReplicas(ctx context.Context) {
	now := time.Now()
	l.mu.Lock()
	due := now.Sub(l.seen) >= 2*time.Second
	if due {
		l.seen = now
	}
	l.mu.Unlock()
	if !due {
		return
	}
	ms := now.UnixMilli()
	pipe := l.rc.Pipeline()
	pipe.ZAdd(ctx, presenceKey, redis.Z{Score: float64(ms), Member: l.replica})
	pipe.ZRemRangeByScore(ctx, presenceKey, "-inf", fmt.Sprint(ms-10_000))
	card := pipe.ZCard(ctx, presenceKey)
	pipe.PExpire(ctx, presenceKey, time.Minute)
	if _, err := pipe.Exec(ctx); err == nil {
		l.mu.Lock()
		l.replicas = max(1, int(card.Val()))
		l.mu.Unlock()
	}
}

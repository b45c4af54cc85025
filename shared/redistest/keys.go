package redistest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// prefixKeys lists the keys starting with prefix.
// On a cluster it asks every master.
func prefixKeys(t testing.TB, c redis.UniversalClient, prefix string) []string {
	t.Helper()
	var mu sync.Mutex
	var keys []string
	scan := func(ctx context.Context, n redis.UniversalClient) error {
		iter := n.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			mu.Lock()
			keys = append(keys, iter.Val())
			mu.Unlock()
		}
		return iter.Err()
	}
	var err error
	if cc, ok := c.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(t.Context(), func(ctx context.Context, n *redis.Client) error { return scan(ctx, n) })
	} else {
		err = scan(t.Context(), c)
	}
	if err != nil {
		t.Fatalf("redistest: scan %s*: %v", prefix, err)
	}
	return keys
}

// DeletePrefix deletes every key starting with prefix: for the store under
// that prefix, the server restarted empty.
func DeletePrefix(t testing.TB, c redis.UniversalClient, prefix string) {
	t.Helper()
	for _, k := range prefixKeys(t, c, prefix) {
		if err := c.Del(t.Context(), k).Err(); err != nil {
			t.Fatalf("redistest: del %s: %v", k, err)
		}
	}
}

// Checkpoint saves every key starting with prefix (DUMP and PTTL); the
// function it returns deletes them all and restores the saved ones, as a
// failover to a replica that had not received the writes since.
func Checkpoint(t testing.TB, c redis.UniversalClient, prefix string) func(t *testing.T) {
	t.Helper()
	type saved struct {
		dump string
		ttl  time.Duration
	}
	keys := map[string]saved{}
	for _, k := range prefixKeys(t, c, prefix) {
		d, err := c.Dump(t.Context(), k).Result()
		if err != nil {
			t.Fatalf("redistest: dump %s: %v", k, err)
		}
		ttl, err := c.PTTL(t.Context(), k).Result()
		if err != nil {
			t.Fatalf("redistest: pttl %s: %v", k, err)
		}
		keys[k] = saved{d, max(ttl, 0)}
	}
	return func(t *testing.T) {
		t.Helper()
		DeletePrefix(t, c, prefix)
		for k, s := range keys {
			if err := c.Restore(t.Context(), k, s.ttl, s.dump).Err(); err != nil {
				t.Fatalf("redistest: restore %s: %v", k, err)
			}
		}
	}
}

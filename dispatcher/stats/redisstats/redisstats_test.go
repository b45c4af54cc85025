package redisstats_test

import (
	"context"
	"crypto/rand"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/dispatcher/stats/redisstats"
	"github.com/mlsched/mlsched/dispatcher/stats/statstest"
	"github.com/mlsched/mlsched/shared/redistest"
)

// prefix isolates a store on a shared server.
func prefix() string { return "t" + rand.Text()[:12] + ":" }

func TestConformance(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	client := srv.Client(t)
	statstest.Run(t, func(t *testing.T, now func() time.Time) stats.Store {
		return redisstats.New(client, statstest.Window, redisstats.WithPrefix(prefix()), redisstats.WithClock(now))
	})
}

func TestKeyLayoutAndExpiry(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	srv := redistest.Start(t)
	c := srv.Client(t)
	clock := statstest.NewClock(statstest.Epoch)
	w := stats.Window{Size: time.Minute, Bucket: 10 * time.Second}
	s := redisstats.New(c, w, redisstats.WithPrefix("p:"), redisstats.WithClock(clock.Now))
	at := statstest.Epoch.Add(3 * time.Second)
	if err := s.Record(ctx, []stats.Event{
		{Model: "m", Node: "n", Kind: stats.KindDispatched, At: at},
		{Model: "m", Node: "n", Kind: stats.KindSuccess, Latency: time.Millisecond, At: at},
		{Model: "m", Node: "n", Kind: stats.KindDispatched, At: at},
	}); err != nil {
		t.Fatal(err)
	}
	idx := w.Index(at)
	bucket := "p:{stats}:b:" + itoa(idx)
	fields, err := c.HGetAll(ctx, bucket).Result()
	if err != nil {
		t.Fatal(err)
	}
	hb := "h" + itoa(int64(stats.BucketOf(time.Millisecond)))
	want := map[string]string{"m  d": "2", "m  s": "1", "m  " + hb: "1", "m n d": "2", "m n s": "1", "m n " + hb: "1"}
	if len(fields) != len(want) {
		t.Fatalf("bucket fields = %v, want %v", fields, want)
	}
	for f, v := range want {
		if fields[f] != v {
			t.Errorf("field %q = %q, want %q", f, fields[f], v)
		}
	}
	// the bucket ends at Epoch+10s and lives a window and a bucket more:
	// 67s after a write at Epoch+3s (the clock is still at Epoch: 80s)
	ttl, err := c.PTTL(ctx, bucket).Result()
	if err != nil || ttl <= 70*time.Second || ttl > 80*time.Second {
		t.Errorf("bucket TTL = %v, %v; want in (70s, 80s]", ttl, err)
	}
	gauges, err := c.HGetAll(ctx, "p:{stats}:g").Result()
	if err != nil {
		t.Fatal(err)
	}
	if gauges["m  if"] != "1" || gauges["m n if"] != "1" || gauges["m n lo"] == "" {
		t.Errorf("gauges = %v", gauges)
	}
	if ttl, _ := c.PTTL(ctx, "p:{stats}:g").Result(); ttl != -1 {
		t.Errorf("gauge hash TTL = %v, want none", ttl)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func TestScriptCacheFlushed(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	srv := redistest.Start(t)
	c := srv.Client(t)
	s := redisstats.New(c, stats.Window{}, redisstats.WithPrefix(prefix()))
	ev := []stats.Event{{Model: "m", Node: "n", Kind: stats.KindSuccess}}
	if err := s.Record(ctx, ev); err != nil {
		t.Fatal(err)
	}
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	// EVALSHA now fails with NOSCRIPT: the store falls back to EVAL
	if err := s.Record(ctx, ev); err != nil {
		t.Fatalf("Record after SCRIPT FLUSH: %v", err)
	}
	if ok, err := s.SetBreaker(ctx, stats.BreakerKey{Model: "m"}, stats.Breaker{}, stats.Breaker{State: stats.BreakerOpen, Since: time.Now()}); !ok || err != nil {
		t.Fatalf("SetBreaker after SCRIPT FLUSH = %v, %v", ok, err)
	}
	snap, err := s.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := snap.Models["m"].Successes; got != 2 {
		t.Fatalf("successes = %d, want 2", got)
	}
}

func TestPrefixesAreIsolated(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	c := redistest.Start(t).Client(t)
	a := redisstats.New(c, stats.Window{}, redisstats.WithPrefix(prefix()))
	b := redisstats.New(c, stats.Window{}, redisstats.WithPrefix(prefix()))
	if err := a.Record(ctx, []stats.Event{{Model: "m", Node: "n", Kind: stats.KindSuccess}}); err != nil {
		t.Fatal(err)
	}
	snap, err := b.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Models) != 0 {
		t.Fatalf("store b sees %d models of store a", len(snap.Models))
	}
}

func TestForeignFieldsAreIgnored(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	c := redistest.Start(t).Client(t)
	clock := statstest.NewClock(statstest.Epoch)
	s := redisstats.New(c, statstest.Window, redisstats.WithPrefix("x:"), redisstats.WithClock(clock.Now))
	bucket := "x:{stats}:b:" + itoa(statstest.Window.Index(statstest.Epoch))
	if err := c.HSet(ctx, bucket, "garbage", "1", "m n s", "NaN", "m n h999", "4", "m  s", "3").Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.HSet(ctx, "x:{stats}:br", "m ", "open", "q ", "9:0").Err(); err != nil {
		t.Fatal(err)
	}
	snap, err := s.Snapshot(ctx)
	if err != nil {
		t.Fatalf("Snapshot over foreign fields: %v", err)
	}
	if len(snap.Models) != 1 || snap.Models["m"].Successes != 3 || len(snap.Models["m"].Nodes) != 0 {
		t.Fatalf("snapshot = %+v", snap.Models)
	}
}

func TestRedisDown(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	srv := redistest.Start(t)
	s := redisstats.New(srv.Client(t), stats.Window{}, redisstats.WithPrefix(prefix()))
	srv.Stop()
	if err := s.Record(ctx, []stats.Event{{Model: "m", Kind: stats.KindSuccess}}); err == nil {
		t.Error("Record succeeded with Redis down")
	}
	if _, err := s.Snapshot(ctx); err == nil {
		t.Error("Snapshot succeeded with Redis down")
	}
	if _, err := s.SetBreaker(ctx, stats.BreakerKey{Model: "m"}, stats.Breaker{}, stats.Breaker{State: stats.BreakerOpen}); err == nil {
		t.Error("SetBreaker succeeded with Redis down")
	}
}

func TestConformanceReset(t *testing.T) {
	t.Parallel()
	statstest.RunReset(t, sharedOn(redistest.Start(t).Client(t)))
}

// sharedOn is the reset cases' backend: a fresh prefix on client's server
// per case.
func sharedOn(client redis.UniversalClient) func(t *testing.T) statstest.Shared {
	return func(t *testing.T) statstest.Shared {
		p := prefix()
		return statstest.Shared{
			Replica: func(t *testing.T, now func() time.Time) stats.Store {
				return redisstats.New(client, statstest.Window, redisstats.WithPrefix(p), redisstats.WithClock(now))
			},
			Wipe:       func(t *testing.T) { redistest.DeletePrefix(t, client, p) },
			Checkpoint: func(t *testing.T) func(t *testing.T) { return redistest.Checkpoint(t, client, p) },
		}
	}
}

func ctxTimeout(t *testing.T, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(t.Context()), d)
}

// Names of models and nodes that stop reporting do not stay in Redis for
// ever: a series (a model, or a model on a node) that no Record wrote for
// the forget-after time loses its gauges and breaker at the next sweep
// (Snapshot runs it); an active one stays; one written by an older version
// (no write time) is given one and goes after the same time.
func TestIdleSeriesAreForgotten(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	srv := redistest.Start(t)
	c := srv.Client(t)
	clock := statstest.NewClock(statstest.Epoch)
	w := stats.Window{Size: time.Minute, Bucket: 10 * time.Second}
	const forget = 10 * time.Minute
	p := prefix()
	s := redisstats.New(c, w, redisstats.WithPrefix(p), redisstats.WithClock(clock.Now), redisstats.WithForgetAfter(forget))
	gauges, breakers := p+"{stats}:g", p+"{stats}:br"
	record := func(model, node string) {
		t.Helper()
		if err := s.Record(ctx, []stats.Event{
			{Model: model, Node: node, Kind: stats.KindDispatched},
			{Model: model, Node: node, Kind: stats.KindModelError, Latency: time.Millisecond},
		}); err != nil {
			t.Fatal(err)
		}
	}
	snapshot := func() *stats.Snapshot {
		t.Helper()
		snap, err := s.Snapshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return snap
	}
	// series of a model: "<model> <node> " and "<model>  "
	has := func(model string) (g, br bool) {
		t.Helper()
		for _, h := range []struct {
			key string
			in  *bool
		}{{gauges, &g}, {breakers, &br}} {
			fields, err := c.HKeys(ctx, h.key).Result()
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range fields {
				if strings.HasPrefix(f, model+" ") {
					*h.in = true
				}
			}
		}
		return g, br
	}
	record("gone", "n1")
	record("stay", "n2")
	open := stats.Breaker{State: stats.BreakerOpen, Since: clock.Now()}
	for _, m := range []string{"gone", "stay"} {
		if ok, err := s.SetBreaker(ctx, stats.BreakerKey{Model: m, Node: "n"}, stats.Breaker{}, open); !ok || err != nil {
			t.Fatalf("set breaker: %v %v", ok, err)
		}
	}
	snapshot()
	if g, br := has("gone"); !g || !br {
		t.Fatalf("gone's series vanished before its time: gauges %v, breaker %v", g, br)
	}
	// a field of an older version, without a write time
	if err := c.HSet(ctx, gauges, "old n3 cf", "4").Err(); err != nil {
		t.Fatal(err)
	}

	clock.Advance(forget / 2)
	record("stay", "n2")
	snapshot() // sweeps: nothing is that old yet; old gets a write time
	if g, _ := has("gone"); !g {
		t.Fatal("gone's series vanished before its time")
	}
	if v, _ := c.HGet(ctx, gauges, "old n3 tw").Result(); v == "" {
		t.Fatal("the unstamped series was not given a write time")
	}

	clock.Advance(forget/2 + time.Second)
	record("stay", "n2")
	snap := snapshot()
	if g, br := has("gone"); g || br {
		t.Fatalf("gone's series stayed after %s unwritten: gauges %v, breaker %v", forget, g, br)
	}
	if _, ok := snap.Models["gone"]; ok {
		t.Fatal("gone is still in the snapshot")
	}
	if g, _ := has("stay"); !g {
		t.Fatal("the active model's gauges were deleted")
	}
	if snap.Models["stay"] == nil || snap.Models["stay"].Nodes["n2"] == nil {
		t.Fatalf("the active model is missing from the snapshot: %+v", snap.Models)
	}
	// stay's breaker on node n was never written by a Record either: it
	// went with gone's, and stay's own series were kept
	if g, _ := has("old"); !g {
		t.Fatal("the formerly unstamped series went before its time")
	}
	clock.Advance(forget / 2)
	record("stay", "n2")
	if n, err := s.Sweep(ctx); err != nil || n != 1 {
		t.Fatalf("sweep = %d, %v; want the old series", n, err)
	}
	if g, _ := has("old"); g {
		t.Fatal("the formerly unstamped series stayed")
	}
	if g, _ := has("stay"); !g {
		t.Fatal("the active model's gauges were deleted")
	}
}

package redisstats_test

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/mlsched/mlsched/dispatcher/internal/policy"
	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/dispatcher/stats/redisstats"
	"github.com/mlsched/mlsched/dispatcher/stats/statstest"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/redistest"
)

// The cluster in miniature: four models failing 20%, 5%, 1% and
// 0.2% on three nodes, learned by two replicas; redis-server is killed with
// -9 and restarted empty. The replicas re-seed it, and the policies choose
// exactly as before, while a store nobody re-seeded would make them choose
// differently.
func TestKilledRedisRestartedEmptyKeepsChoices(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	client := srv.Client(t)
	clock := statstest.NewClock(statstest.Epoch)
	w := stats.Window{}
	newReplica := func() *redisstats.Store {
		return redisstats.New(client, w, redisstats.WithPrefix("r:"), redisstats.WithClock(clock.Now))
	}
	a, b := newReplica(), newReplica()

	models := []struct {
		name string
		fail float64
		lat  time.Duration
	}{{"m20", 0.20, 5 * time.Millisecond}, {"m5", 0.05, 10 * time.Millisecond}, {"m1", 0.01, 20 * time.Millisecond}, {"m02", 0.002, 40 * time.Millisecond}}
	nodes := []string{"n1", "n2", "n3"}
	var hbs []protocol.Heartbeat
	for _, n := range nodes {
		h := protocol.Heartbeat{Node: n, Capacity: 8, SentAt: statstest.Epoch}
		for _, m := range models {
			h.Models = append(h.Models, protocol.ModelInfo{Name: m.name, Types: []string{"t"}})
		}
		hbs = append(hbs, h)
	}
	// 2000 tasks of warm-up spread over two minutes
	rng := rand.New(rand.NewPCG(1, 2))
	for step := range 20 {
		at := statstest.Epoch.Add(time.Duration(step) * 6 * time.Second)
		clock.Set(at)
		var evs []stats.Event
		for i := range 100 {
			m := models[i%len(models)]
			n := nodes[(i/len(models))%len(nodes)]
			k := stats.KindSuccess
			if rng.Float64() < m.fail {
				k = stats.KindModelError
			}
			evs = append(evs, stats.Event{Model: m.name, Node: n, Kind: stats.KindDispatched, At: at},
				stats.Event{Model: m.name, Node: n, Kind: k, Latency: m.lat, At: at})
		}
		if err := a.Record(t.Context(), evs); err != nil {
			t.Fatal(err)
		}
	}
	// one breaker open, on the worst model's first node
	open := stats.Breaker{State: stats.BreakerOpen, Since: clock.Now()}
	if ok, err := a.SetBreaker(t.Context(), stats.BreakerKey{Model: "m20", Node: "n1"}, stats.Breaker{}, open); !ok || err != nil {
		t.Fatalf("SetBreaker = %v, %v", ok, err)
	}
	snapOf := func(s stats.Store) *stats.Snapshot {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			snap, err := s.Snapshot(t.Context())
			if err == nil {
				return snap
			}
			if time.Now().After(deadline) {
				t.Fatalf("Snapshot: %v", err)
			}
			time.Sleep(20 * time.Millisecond) // redis-server coming back: poll
		}
	}
	before := snapOf(a)
	snapOf(b)

	choices := func(snap *stats.Snapshot, pol string) []string {
		e, err := policy.NewEngine(policy.Config{Default: pol, Seed: 42})
		if err != nil {
			t.Fatal(err)
		}
		tab := policy.NewTable(snap, hbs, clock.Now())
		var out []string
		for range 500 {
			d, err := e.Decide(tab, &policy.Request{Type: "t"})
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, d.Model+"/"+d.Node)
		}
		return out
	}
	share := func(c []string) map[string]int {
		m := map[string]int{}
		for _, s := range c {
			m[s[:len(s)-3]]++
		}
		return m
	}
	pols := []string{policy.Reliability, policy.Thompson}
	want := map[string][]string{}
	for _, p := range pols {
		want[p] = choices(before, p)
		t.Logf("%s before the restart: %v", p, share(want[p]))
	}

	srv.Stop() // SIGKILL
	srv.Restart(t)

	// a replica that remembers nothing sees an empty store: that is what
	// the policies would decide on without re-seeding
	empty, err := newReplica().Snapshot(t.Context())
	for err != nil {
		time.Sleep(20 * time.Millisecond) // redis-server coming back: poll
		empty, err = newReplica().Snapshot(t.Context())
	}
	if len(empty.Models) != 0 {
		t.Fatalf("redis-server did not restart empty: %d models", len(empty.Models))
	}
	for _, p := range pols {
		if got := choices(empty, p); slices.Equal(got, want[p]) {
			t.Fatalf("%s: an empty store gives the same choices: the test cannot tell", p)
		}
	}

	// the replicas notice, re-seed, and every replica sees the past again.
	// In this order: a replica started before an old one has touched the
	// restarted store finds it empty, as it should (the order once came from
	// ranging over a map, and CI failed on it).
	for _, r := range []struct {
		name string
		s    stats.Store
	}{{"a", a}, {"b", b}, {"a new replica", newReplica()}} {
		name, after := r.name, snapOf(r.s)
		for _, p := range pols {
			if got := choices(after, p); !slices.Equal(got, want[p]) {
				t.Errorf("%s, %s after the restart: %v, want %v", name, p, share(got), share(want[p]))
			}
		}
	}
	if a.Resets()+b.Resets() == 0 {
		t.Error("no replica re-seeded")
	}
}

// With re-seeding off a replica adopts the reset store as it finds it.
func TestReseedOff(t *testing.T) {
	t.Parallel()
	c := redistest.Start(t).Client(t)
	var infos []redisstats.ResetInfo
	s := redisstats.New(c, stats.Window{}, redisstats.WithPrefix(prefix()), redisstats.WithReseed(false),
		redisstats.WithOnReset(func(r redisstats.ResetInfo) { infos = append(infos, r) }))
	ev := []stats.Event{{Model: "m", Node: "n", Kind: stats.KindSuccess}}
	if err := s.Record(t.Context(), ev); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Snapshot(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := c.FlushAll(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Record(t.Context(), ev); err != nil {
		t.Fatal(err)
	}
	snap, err := s.Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if got := snap.Models["m"].Successes; got != 1 {
		t.Fatalf("successes = %d, want 1 (the past forgotten)", got)
	}
	if len(infos) != 1 || !infos[0].Skipped || s.Resets() != 1 {
		t.Fatalf("resets %d, infos %+v", s.Resets(), infos)
	}
}

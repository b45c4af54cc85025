package autoscale

import (
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// cluster is a test fixture: one pool "worker" hosting model m (type
// classify), with the given load.
type cluster struct {
	at       time.Time
	current  int
	finished int64
	backlog  int64
	svc      time.Duration
	success  float64
	missing  string
}

func (c *cluster) obs() Observation {
	return Observation{At: c.at, Missing: c.missing,
		Pools:  []Pool{{Name: "worker", Current: c.current, Capacity: 8, Models: []Model{{Name: "m", Types: []string{"classify"}}}}},
		Types:  map[string]TypeLoad{"classify": {Finished: c.finished, Backlog: c.backlog}},
		Models: map[string]ModelStats{"m": {ServiceTime: c.svc, SuccessRate: c.success, Share: 1}}}
}

// step advances the fixture by dt with rate tasks/s finishing, decides,
// and applies the target as a backend would.
func (c *cluster) step(s Policy, dt time.Duration, rate float64) Decision {
	c.at = c.at.Add(dt)
	c.finished += int64(rate * dt.Seconds())
	d := s.Decide(c.obs())[0]
	c.current = d.Target
	return d
}

func TestLittlesLawPlusDrain(t *testing.T) {
	s := NewScaler(ScalerParams{Limits: func(string) Limits { return Limits{Max: 50, Utilisation: 0.5, DrainWithin: 10 * time.Second} }})
	c := &cluster{at: t0, current: 10, svc: 100 * time.Millisecond, success: 1}
	if d := s.Decide(c.obs())[0]; !d.Held || d.Target != 10 {
		t.Fatalf("first observation: want a hold at 10 (no rate yet), got %+v", d)
	}
	// 100 tasks/s of 100 ms at ρ 0.5: 20 slots; a backlog of 400 to drain
	// in 10 s: 4 more. 24 slots of 8: 3 replicas.
	c.at, c.finished, c.backlog = c.at.Add(10*time.Second), 1000, 400
	c.finished -= 400 // what arrived: 1000 finished or waiting
	d := s.Decide(c.obs())[0]
	if d.Needed != 3 {
		t.Fatalf("needed = %d, want 3 (slots %.2f, λ %.1f): %s", d.Needed, d.Slots, d.Arrival, d.Reason)
	}
	if d.Slots < 23.9 || d.Slots > 24.1 {
		t.Fatalf("slots = %.2f, want 24", d.Slots)
	}
	// What already runs is in Little's law: the drain term counts only
	// what waits (320 of the 400).
	o := c.obs()
	o.At = o.At.Add(time.Nanosecond)
	l := o.Types["classify"]
	l.Running = 80
	o.Types["classify"] = l
	s1 := NewScaler(ScalerParams{Limits: func(string) Limits { return Limits{Max: 50, Utilisation: 0.5, DrainWithin: 10 * time.Second} }})
	first := o
	first.At, first.Types = t0, map[string]TypeLoad{"classify": {Finished: 0}}
	s1.Decide(first)
	o.At = t0.Add(10 * time.Second)
	if d := s1.Decide(o)[0]; d.Slots < 23.1 || d.Slots > 23.3 || d.Backlog != 320 {
		t.Fatalf("with 80 of 400 running: slots %.2f, backlog %d; want 23.2 and 320", d.Slots, d.Backlog)
	}
	// A model failing half its attempts needs twice the slots.
	s2 := NewScaler(ScalerParams{Limits: func(string) Limits { return Limits{Max: 50, Utilisation: 0.5} }})
	c = &cluster{at: t0, current: 1, svc: 100 * time.Millisecond, success: 0.5}
	s2.Decide(c.obs())
	d = c.step(s2, 10*time.Second, 100)
	if d.Needed != 5 { // 40 slots / 8
		t.Fatalf("with 50%% success: needed = %d, want 5: %s", d.Needed, d.Reason)
	}
}

func TestScaleUpIsRateLimited(t *testing.T) {
	s := NewScaler(ScalerParams{Limits: func(string) Limits { return Limits{Max: 40, Utilisation: 1} }})
	c := &cluster{at: t0, current: 1, svc: time.Second, success: 1}
	s.Decide(c.obs())
	// 160 tasks/s of 1 s: 160 slots, 20 replicas; from 1: 5, then 10, then 20.
	var got []int
	for range 4 {
		got = append(got, c.step(s, 5*time.Second, 160).Target)
	}
	if want := []int{5, 10, 20, 20}; !equal(got, want) {
		t.Fatalf("targets %v, want %v", got, want)
	}
}

func TestCooldownScalesInOnceAndDoesNotFlap(t *testing.T) {
	cool := time.Minute
	s := NewScaler(ScalerParams{Limits: func(string) Limits { return Limits{Min: 1, Max: 20, Cooldown: cool, Utilisation: 1} }})
	c := &cluster{at: t0, current: 1, svc: time.Second, success: 1}
	s.Decide(c.obs())
	for range 4 { // 80 tasks/s: 10 replicas
		c.step(s, 5*time.Second, 80)
	}
	if c.current != 10 {
		t.Fatalf("current %d, want 10", c.current)
	}
	upAt := c.at
	// Idle, with a blip of load 30 s in: no scale-in until a whole
	// cooldown without need has passed since the blip.
	var changes []time.Time
	prev := c.current
	for i := range 60 {
		rate := 0.0
		if i == 6 {
			rate = 80
		}
		d := c.step(s, 5*time.Second, rate)
		if d.Target < prev {
			changes = append(changes, c.at)
			if c.at.Sub(upAt) < cool {
				t.Fatalf("scaled in %s after the scale-up, within the cooldown: %s", c.at.Sub(upAt), d.Reason)
			}
			if c.at.Sub(upAt.Add(35*time.Second)) < cool {
				t.Fatalf("scaled in %s after the blip, within the cooldown: %s", c.at.Sub(upAt.Add(35*time.Second)), d.Reason)
			}
		}
		if d.Target > prev && i != 6 && i != 7 {
			t.Fatalf("step %d scaled up %d→%d with no load: %s", i, prev, d.Target, d.Reason)
		}
		prev = d.Target
	}
	if c.current != 1 {
		t.Fatalf("after 5 idle minutes: %d replicas, want the minimum 1", c.current)
	}
	if len(changes) == 0 || changes[len(changes)-1].Sub(changes[0]) > 30*time.Second {
		t.Fatalf("scale-in steps at %v: want one descent, not spread over cooldowns", changes)
	}
}

func TestHoldsWithoutStatistics(t *testing.T) {
	s := NewScaler(ScalerParams{Limits: func(string) Limits { return Limits{Min: 0, Max: 20, Cooldown: time.Second} }})
	c := &cluster{at: t0, current: 7, svc: time.Second, success: 1}
	s.Decide(c.obs())
	c.step(s, 5*time.Second, 0)
	c.current = 7 // an operator scaled by hand
	c.missing = "nats: no servers available for connection"
	for range 100 {
		d := c.step(s, 5*time.Second, 0)
		if !d.Held || d.Target != 7 || !strings.Contains(d.Reason, "no servers") {
			t.Fatalf("NATS unreachable: want a hold at 7 saying why, got %+v", d)
		}
	}
}

func TestFreshScalerHoldsScaleInForACooldown(t *testing.T) {
	cool := time.Minute
	s := NewScaler(ScalerParams{Limits: func(string) Limits { return Limits{Min: 1, Max: 20, Cooldown: cool} }})
	c := &cluster{at: t0, current: 6, svc: 10 * time.Millisecond, success: 1}
	s.Decide(c.obs())
	for c.at.Sub(t0) < cool-5*time.Second {
		if d := c.step(s, 5*time.Second, 0); d.Target != 6 {
			t.Fatalf("a restarted scaler scaled in at %s: %s", c.at.Sub(t0), d.Reason)
		}
	}
	for range 3 {
		c.step(s, 5*time.Second, 0)
	}
	if c.current >= 6 {
		t.Fatalf("no scale-in after a whole idle cooldown: %d", c.current)
	}
}

func TestKeepsTheLastWorkerOfAModelWithWork(t *testing.T) {
	s := NewScaler(ScalerParams{Limits: func(string) Limits { return Limits{Min: 0, Max: 4, Cooldown: time.Nanosecond} }})
	obs := func(at time.Time, cur int, backlog int64) Observation {
		return Observation{At: at,
			Pools: []Pool{
				{Name: "a", Current: cur, Models: []Model{{Name: "m", Types: []string{"rare"}}}},
				{Name: "b", Current: cur, Models: []Model{{Name: "n", Types: []string{"shared"}}}},
				{Name: "c", Current: cur, Models: []Model{{Name: "n2", Types: []string{"shared"}}}}},
			Types:  map[string]TypeLoad{"rare": {Backlog: backlog}, "shared": {}},
			Models: map[string]ModelStats{"n": {ServiceTime: time.Millisecond}, "n2": {ServiceTime: time.Millisecond}}}
	}
	s.Decide(obs(t0, 1, 1))
	ds := s.Decide(obs(t0.Add(time.Second), 1, 1))
	if ds[0].Target != 1 || !strings.Contains(ds[0].Reason, "rare") {
		t.Fatalf("pool a, the only host of a type with work, went to %d: %s", ds[0].Target, ds[0].Reason)
	}
	if ds[1].Target != 0 || ds[2].Target != 0 {
		t.Fatalf("pools b and c, no work: want both to go to 0 (min 0), got %d, %d: %s", ds[1].Target, ds[2].Target, ds[1].Reason)
	}
	ds = s.Decide(obs(t0.Add(2*time.Second), 1, 0))
	if ds[0].Target != 0 {
		t.Fatalf("pool a with no work and min 0: want 0, got %d: %s", ds[0].Target, ds[0].Reason)
	}
}

func TestRateSurvivesACounterReset(t *testing.T) {
	r := newRateEstimator(10 * time.Second)
	o := func(at time.Duration, fin int64) Observation {
		return Observation{At: t0.Add(at), Types: map[string]TypeLoad{"x": {Finished: fin}}}
	}
	r.update(o(0, 0))
	got, _ := r.update(o(10*time.Second, 500))
	if got["x"] != 50 {
		t.Fatalf("rate %v, want 50", got["x"])
	}
	got, why := r.update(o(20*time.Second, 100)) // a dispatcher replica restarted
	if why != "" || got["x"] <= 0 || got["x"] > 50 {
		t.Fatalf("after a counter reset: rate %v (%q), want the last estimate kept", got["x"], why)
	}
	got, _ = r.update(o(30*time.Second, 600))
	if got["x"] != 50 {
		t.Fatalf("after the reset: rate %v, want 50", got["x"])
	}
}

func TestLimitsValidate(t *testing.T) {
	for _, l := range []Limits{{Min: 5, Max: 2}, {Max: 3, Utilisation: 1.5}, {Max: 3, DownFraction: 2}, {Max: -1}} {
		if err := l.WithDefaults().Validate(); err == nil {
			t.Errorf("%+v: want an error", l)
		}
	}
	if err := (Limits{}).WithDefaults().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
}

func TestKEDAFormula(t *testing.T) {
	k := NewKEDA(KEDAParams{TimeScale: 10, Limits: func(string) Limits { return Limits{Min: 0, Max: 20} }})
	o := func(at time.Duration, cur int, lag int64) Observation {
		return Observation{At: t0.Add(at), Pools: []Pool{{Name: "w", Current: cur, Models: []Model{{Name: "m", Types: []string{"x"}}}}},
			Types: map[string]TypeLoad{"x": {Lag: lag}}}
	}
	if d := k.Decide(o(0, 1, 95))[0]; d.Target != 5 { // ceil(95/10)=10, at most 1+4
		t.Fatalf("lag 95 from 1: target %d, want 5 (HPA's +4): %s", d.Target, d.Reason)
	}
	if d := k.Decide(o(time.Second, 5, 500))[0]; d.Target != 5 {
		t.Fatalf("between polls (3s scaled): want no change, got %d", d.Target)
	}
	if d := k.Decide(o(3*time.Second, 5, 95))[0]; d.Target != 10 {
		t.Fatalf("next poll: target %d, want 10: %s", d.Target, d.Reason)
	}
	if d := k.Decide(o(6*time.Second, 10, 105))[0]; d.Target != 10 {
		t.Fatalf("lag within 10%% tolerance: want 10, got %d", d.Target)
	}
	// Lag gone: held by the 30 s (scaled) stabilisation window, then 1
	// (the HPA's floor), then 0 after KEDA's cooldown.
	d := k.Decide(o(9*time.Second, 10, 0))[0]
	if d.Target != 10 {
		t.Fatalf("lag 0 within the stabilisation window: want 10, got %d: %s", d.Target, d.Reason)
	}
	cur := 10
	for at := 12 * time.Second; at < 60*time.Second; at += 3 * time.Second {
		cur = k.Decide(o(at, cur, 0))[0].Target
	}
	if cur != 0 {
		t.Fatalf("after KEDA's cooldown: %d replicas, want 0", cur)
	}
	if d := k.Decide(o(63*time.Second, 0, 1))[0]; d.Target != 1 {
		t.Fatalf("activation: want 0→1, got %d", d.Target)
	}
}

func equal(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

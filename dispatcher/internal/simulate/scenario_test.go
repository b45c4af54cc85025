package simulate

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

const minimal = `{
  "arrival": {"rate": 10, "types": {"t": 1}},
  "models": [{"name": "m", "types": ["t"], "profile": [{"at": "0s", "failure_prob": 0.1, "latency": {"dist": "fixed", "value": "10ms"}}]}],
  "nodes": [{"name": "n", "models": ["m"]}]
}`

func TestParseScenarioDefaults(t *testing.T) {
	t.Parallel()
	sc, err := ParseScenario([]byte(minimal))
	if err != nil {
		t.Fatal(err)
	}
	if sc.Tasks != 20000 || sc.MaxAttempts != 3 || sc.Timeout.D() != 5*time.Second || sc.Refresh.D() != 250*time.Millisecond || sc.DeadlineSlack.D() != 10*time.Second || sc.LostGrace.D() != time.Second ||
		sc.NodeTTL.D() != 10*time.Second || sc.Window.Size.D() != 5*time.Minute || sc.Window.Bucket.D() != 10*time.Second || sc.Window.Recent.D() != 20*time.Second || sc.Nodes[0].Capacity != 16 || sc.Prefetch != 32 {
		t.Fatalf("defaults not filled: %+v", sc)
	}
}

// Each broken scenario must be refused with an error naming the field.
func TestParseScenarioErrorsAreSpecific(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, from, to, field, reason string
	}{
		{"syntax", `"rate": 10`, `"rate": 10,,`, "", "syntax error"},
		{"unknown field", `"rate": 10`, `"rate": 10, "burst": 3`, "", `unknown field "burst"`},
		{"wrong type", `"rate": 10`, `"rate": "fast"`, "arrival.rate", "wrong type"},
		{"bad duration", `"value": "10ms"`, `"value": "10 parsecs"`, "", "duration"},
		{"zero rate", `"rate": 10`, `"rate": 0`, "arrival.rate", "> 0"},
		{"unserved type", `{"t": 1}`, `{"t": 1, "u": 1}`, "arrival.types.u", "no model serves"},
		{"probability", `"failure_prob": 0.1`, `"failure_prob": 1.5`, "models[0].profile[0].failure_prob", "outside 0..1"},
		{"unknown dist", `"dist": "fixed"`, `"dist": "pareto"`, "models[0].profile[0].latency.dist", `unknown distribution "pareto"`},
		{"missing dist field", `"value": "10ms"`, `"median": "10ms"`, "models[0].profile[0].latency.value", "required"},
		{"first step not at 0", `"at": "0s"`, `"at": "1s"`, "models[0].profile[0].at", "first step"},
		{"unknown hosted model", `"models": ["m"]`, `"models": ["m", "x"]`, "nodes[0].models[1]", `unknown model "x"`},
		{"bad name", `"name": "n"`, `"name": "n.1"`, "nodes[0].name", "subject tokens"},
		{"event kind", `"nodes": [`, `"events": [{"at": "1s", "kind": "meteor"}], "nodes": [`, "events[0].kind", `unknown kind "meteor"`},
		{"event node", `"nodes": [`, `"events": [{"at": "1s", "kind": "node_crash", "node": "zz"}], "nodes": [`, "events[0].node", `unknown node "zz"`},
		{"burst until", `"nodes": [`, `"events": [{"at": "5s", "until": "2s", "kind": "failure_burst", "failure_prob": 0.5}], "nodes": [`, "events[0].until", "not after"},
		{"window", `"nodes": [`, `"window": {"size": "10s", "bucket": "20s"}, "nodes": [`, "window.bucket", "larger than window.size"},
		{"recent", `"nodes": [`, `"window": {"size": "1m", "recent": "2m"}, "nodes": [`, "window.recent", "larger than window.size"},
		{"max attempts", `"nodes": [`, `"max_attempts": 11, "nodes": [`, "max_attempts", "outside 1..10"},
		{"flow share", `"types": {"t": 1}`, `"types": {"t": 1}, "flows": [{"share": 0}]`, "arrival.flows[0].share", "> 0"},
		{"flow priority", `"types": {"t": 1}`, `"types": {"t": 1}, "flows": [{"share": 1, "priority": 11}]`, "arrival.flows[0].priority", "outside -10..10"},
		{"flow tenant", `"types": {"t": 1}`, `"types": {"t": 1}, "flows": [{"share": 1, "tenant": "a.b"}]`, "arrival.flows[0].tenant", `"a.b"`},
		{"tenant weight", `"nodes": [`, `"tenant_weights": {"a": 0}, "nodes": [`, "tenant_weights.a", "outside (0, 1000]"},
		{"park above", `"nodes": [`, `"park_above": -2, "nodes": [`, "park_above", "outside 1..1000000 (-1: off)"},
		{"prefetch", `"nodes": [`, `"prefetch": -2, "nodes": [`, "prefetch", "outside 1..1000000 (-1: arrival order)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src := strings.Replace(minimal, c.from, c.to, 1)
			if src == minimal {
				t.Fatalf("replacement %q not found", c.from)
			}
			_, err := ParseScenario([]byte(src))
			var se *ScenarioError
			if !errors.As(err, &se) || !errors.Is(err, ErrInvalidScenario) {
				t.Fatalf("got %v, want a *ScenarioError", err)
			}
			if se.Field != c.field || !strings.Contains(se.Reason, c.reason) {
				t.Fatalf("got field %q reason %q, want field %q reason containing %q", se.Field, se.Reason, c.field, c.reason)
			}
		})
	}
}

func TestProfileStepsInherit(t *testing.T) {
	t.Parallel()
	src := strings.Replace(minimal, `"value": "10ms"}}]`, `"value": "10ms"}}, {"at": "30s", "failure_prob": 0.5}, {"at": "60s", "latency": {"dist": "uniform", "min": "1ms", "max": "3ms"}}]`, 1)
	sc, err := ParseScenario([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	m := &sc.Models[0]
	for _, c := range []struct {
		at   time.Duration
		p    float64
		mean time.Duration
	}{{0, 0.1, 10 * time.Millisecond}, {29 * time.Second, 0.1, 10 * time.Millisecond}, {30 * time.Second, 0.5, 10 * time.Millisecond}, {time.Hour, 0.5, 2 * time.Millisecond}} {
		st := m.step(c.at)
		if *st.FailureProb != c.p || st.Latency.mean() != c.mean {
			t.Errorf("at %v: p %v mean %v, want %v %v", c.at, *st.FailureProb, st.Latency.mean(), c.p, c.mean)
		}
	}
}

// Sampling through the quantile function must agree with the analytic
// exceedance the oracle uses.
func TestDistExceedMatchesSampling(t *testing.T) {
	t.Parallel()
	dists := []Dist{
		{Dist: DistFixed, Value: Duration(time.Second)},
		{Dist: DistUniform, Min: Duration(100 * time.Millisecond), Max: Duration(900 * time.Millisecond)},
		{Dist: DistNormal, Mean: Duration(400 * time.Millisecond), Stddev: Duration(150 * time.Millisecond)},
		{Dist: DistLognormal, Median: Duration(200 * time.Millisecond), Sigma: 1.2},
	}
	r := rand.New(rand.NewPCG(1, 2))
	const n = 200_000
	for _, d := range dists {
		for _, lim := range []time.Duration{300 * time.Millisecond, 600 * time.Millisecond, 2 * time.Second} {
			over := 0
			for range n {
				if d.quantile(r.Float64()) > lim {
					over++
				}
			}
			got, want := float64(over)/n, d.exceed(lim)
			if math.Abs(got-want) > 0.005 {
				t.Errorf("%s: P(> %v) sampled %.4f, analytic %.4f", d.Dist, lim, got, want)
			}
		}
	}
	ln := Dist{Dist: DistLognormal, Median: Duration(200 * time.Millisecond), Sigma: 0.5}
	if got := ln.quantile(0.5); got < 199*time.Millisecond || got > 201*time.Millisecond {
		t.Errorf("lognormal median %v, want 200ms", got)
	}
}

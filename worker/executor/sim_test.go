package executor

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mlsched/mlsched/worker/digits"
	"github.com/mlsched/mlsched/worker/model"
)

func ms(v float64) model.Duration { return model.Duration(v * float64(time.Millisecond)) }

func draws(s *Sim, n int) []Draw {
	out := make([]Draw, n)
	for i := range out {
		out[i] = s.Draw()
	}
	return out
}

func TestSimSeedIsReproducible(t *testing.T) {
	t.Parallel()
	spec := model.SimSpec{Latency: model.Latency{Dist: model.DistLognormal, Median: ms(5), Sigma: 0.4}, FailureRate: 0.3}
	a := draws(NewSim("m", spec, 42, nil), 200)
	b := draws(NewSim("m", spec, 42, nil), 200)
	c := draws(NewSim("other", spec, 42, nil), 200)
	if !slices.Equal(a, b) {
		t.Fatal("same seed and model drew different sequences")
	}
	if slices.Equal(a, c) {
		t.Fatal("different models drew the same sequence")
	}
}

func quantile(v []float64, q float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[int(q*float64(len(s)-1))]
}

func TestSimDistributions(t *testing.T) {
	t.Parallel()
	const n = 20000
	cases := []struct {
		name  string
		lat   model.Latency
		check func(t *testing.T, v []float64) // milliseconds
	}{
		{"fixed", model.Latency{Dist: model.DistFixed, Value: ms(7)}, func(t *testing.T, v []float64) {
			if slices.Min(v) != 7 || slices.Max(v) != 7 {
				t.Errorf("range %v..%v, want 7", slices.Min(v), slices.Max(v))
			}
		}},
		{"uniform", model.Latency{Dist: model.DistUniform, Min: ms(10), Max: ms(20)}, func(t *testing.T, v []float64) {
			if slices.Min(v) < 10 || slices.Max(v) > 20 {
				t.Errorf("range %v..%v outside 10..20", slices.Min(v), slices.Max(v))
			}
			if m := mean(v); math.Abs(m-15) > 0.2 {
				t.Errorf("mean %.2f, want 15", m)
			}
		}},
		{"normal", model.Latency{Dist: model.DistNormal, Mean: ms(50), StdDev: ms(5)}, func(t *testing.T, v []float64) {
			m := mean(v)
			sd := math.Sqrt(mean(mapf(v, func(x float64) float64 { return (x - m) * (x - m) })))
			if math.Abs(m-50) > 0.3 || math.Abs(sd-5) > 0.3 {
				t.Errorf("mean %.2f sd %.2f, want 50 and 5", m, sd)
			}
		}},
		{"normal clamped", model.Latency{Dist: model.DistNormal, Mean: ms(1), StdDev: ms(5)}, func(t *testing.T, v []float64) {
			if slices.Min(v) < 0 {
				t.Errorf("negative latency %v", slices.Min(v))
			}
		}},
		{"lognormal", model.Latency{Dist: model.DistLognormal, Median: ms(5), Sigma: 0.4}, func(t *testing.T, v []float64) {
			med, p95 := quantile(v, 0.5), quantile(v, 0.95)
			want95 := 5 * math.Exp(0.4*1.6449)
			if math.Abs(med-5)/5 > 0.03 || math.Abs(p95-want95)/want95 > 0.05 {
				t.Errorf("median %.2f p95 %.2f, want 5 and %.2f", med, p95, want95)
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := NewSim("m", model.SimSpec{Latency: c.lat}, 1, nil)
			v := make([]float64, n)
			for i := range v {
				v[i] = float64(s.Draw().Latency) / float64(time.Millisecond)
			}
			c.check(t, v)
		})
	}
}

func mean(v []float64) float64 {
	s := 0.0
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

func mapf(v []float64, f func(float64) float64) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = f(x)
	}
	return out
}

func kinds(d []Draw) map[Kind]float64 {
	out := map[Kind]float64{}
	for _, x := range d {
		out[x.Kind] += 1 / float64(len(d))
	}
	return out
}

func TestSimRatesAndSchedule(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	now := time.Unix(1000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	zero, half := 0.0, 0.5
	spec := model.SimSpec{FailureRate: 0.3, TimeoutRate: 0.1, TaskErrorRate: 0.05,
		Schedule: []model.SimStep{{After: model.Duration(time.Minute), FailureRate: &zero, TimeoutRate: &zero},
			{After: model.Duration(2 * time.Minute), FailureRate: &half}}}
	s := NewSim("m", spec, 7, clock)
	k := kinds(draws(s, 20000))
	for kind, want := range map[Kind]float64{KindModelError: 0.3, KindHang: 0.1, KindTaskError: 0.05, KindSuccess: 0.55} {
		if math.Abs(k[kind]-want) > 0.015 {
			t.Errorf("before the schedule: kind %d rate %.3f, want %.2f", kind, k[kind], want)
		}
	}
	mu.Lock()
	now = now.Add(time.Minute)
	mu.Unlock()
	k = kinds(draws(s, 20000))
	if k[KindModelError] != 0 || k[KindHang] != 0 || math.Abs(k[KindTaskError]-0.05) > 0.015 {
		t.Errorf("after 1m: %v, want only 5%% task errors", k)
	}
	mu.Lock()
	now = now.Add(time.Minute)
	mu.Unlock()
	k = kinds(draws(s, 20000))
	if math.Abs(k[KindModelError]-0.5) > 0.015 || k[KindHang] != 0 {
		t.Errorf("after 2m: %v, want 50%% model errors and no hangs", k)
	}
}

func TestSimRun(t *testing.T) {
	t.Parallel()
	ok := NewSim("ok", model.SimSpec{Latency: model.Latency{Dist: model.DistFixed, Value: ms(2)}}, 1, nil)
	start := time.Now()
	out, err := ok.Run(context.Background(), Task{ID: "x", Payload: json.RawMessage(`{"a":1}`)})
	if err != nil || time.Since(start) < 2*time.Millisecond {
		t.Fatalf("Run: %v after %v", err, time.Since(start))
	}
	var o struct {
		Model string
		Echo  map[string]int
	}
	if json.Unmarshal(out, &o) != nil || o.Model != "ok" || o.Echo["a"] != 1 {
		t.Errorf("output %s", out)
	}
	fail := NewSim("f", model.SimSpec{FailureRate: 1}, 1, nil)
	if _, err := fail.Run(context.Background(), Task{}); !errors.Is(err, ErrSimFailure) {
		t.Errorf("failure: %v", err)
	}
	bad := NewSim("b", model.SimSpec{TaskErrorRate: 1}, 1, nil)
	if _, err := bad.Run(context.Background(), Task{}); !IsTaskError(err) {
		t.Errorf("task error: %v", err)
	}
	hang := NewSim("h", model.SimSpec{TimeoutRate: 1}, 1, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := hang.Run(ctx, Task{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("hang: %v", err)
	}
}

func TestEncodeOutput(t *testing.T) {
	t.Parallel()
	cases := []struct {
		in   any
		want string
	}{
		{nil, `null`}, {json.RawMessage(`{"a":1}`), `{"a":1}`}, {[]byte("not json"), `"not json"`},
		{json.RawMessage(""), `""`}, {map[string]int{"n": 1}, `{"n":1}`}, {"s", `"s"`}, {[]byte{0xff}, `"\ufffd"`},
	}
	for _, c := range cases {
		got, err := EncodeOutput(c.in)
		if err != nil || string(got) != c.want {
			t.Errorf("EncodeOutput(%#v) = %s, %v; want %s", c.in, got, err, c.want)
		}
	}
	if _, err := EncodeOutput(make(chan int)); err == nil {
		t.Error("a channel encoded")
	}
}

func BenchmarkSimDraw(b *testing.B) {
	s := NewSim("m", model.SimSpec{Latency: model.Latency{Dist: model.DistLognormal, Median: ms(5), Sigma: 0.4}, FailureRate: 0.1}, 1, nil)
	b.ReportAllocs()
	for b.Loop() {
		s.Draw()
	}
}

// The built-in digits model classifies held-out images and refuses bad
// input as a task error.
func TestDigitsHandler(t *testing.T) {
	t.Parallel()
	all, err := digits.Dataset()
	if err != nil {
		t.Fatal(err)
	}
	_, holdout := digits.Split(all)
	ok := 0
	for i, s := range holdout[:100] {
		payload, _ := json.Marshal(map[string]any{"pixels": s.Pixels})
		if i%2 == 1 {
			payload, _ = json.Marshal(s.Pixels)
		}
		out, err := DigitsHandler(context.Background(), Task{Payload: payload})
		if err != nil {
			t.Fatal(err)
		}
		if out.(map[string]any)["label"] == s.Label {
			ok++
		}
	}
	if ok < 90 {
		t.Fatalf("%d of 100 held-out images classified right, want > 90", ok)
	}
	for _, bad := range []string{`{"pixels":[1,2]}`, `"x"`, `{"pixels":[` + strings.Repeat("1,", 63) + `17]}`, `{}`} {
		if _, err := DigitsHandler(context.Background(), Task{Payload: json.RawMessage(bad)}); !IsTaskError(err) {
			t.Errorf("payload %s: %v, want a task error", bad, err)
		}
	}
}

// A sim model's latency grows with the task's size: the drawn latency plus
// latency_per_unit for each unit, reported in the output.
func TestSimLatencyPerUnit(t *testing.T) {
	t.Parallel()
	s := NewSim("sized", model.SimSpec{Latency: model.Latency{Dist: model.DistFixed, Value: ms(1)},
		LatencyPerUnit: model.Duration(10 * time.Microsecond)}, 1, nil)
	for _, tc := range []struct {
		size float64
		want float64 // ms
	}{{0, 1}, {300, 4}} {
		out, err := s.Run(context.Background(), Task{ID: "x", Size: tc.size})
		if err != nil {
			t.Fatal(err)
		}
		var o struct {
			LatencyMs float64 `json:"sim_latency_ms"`
		}
		if json.Unmarshal(out, &o) != nil || o.LatencyMs != tc.want {
			t.Errorf("size %g: output %s, want sim_latency_ms %g", tc.size, out, tc.want)
		}
	}
}

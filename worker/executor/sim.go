package executor

import (
	"context"
	"encoding/json"
	"errors"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/mlsched/mlsched/worker/model"
)

// Kind is what a sim draw decided.
type Kind int

const (
	KindSuccess Kind = iota
	KindModelError
	KindTaskError
	KindHang
)

// Draw is one simulated attempt: how long it takes and how it ends.
type Draw struct {
	Latency time.Duration
	Kind    Kind
}

// ErrSimFailure is the model error a sim model returns.
var ErrSimFailure = errors.New("simulated model failure")

// Sim is a simulated model with a latency distribution, failure and hang
// probabilities that may change over time. With the same seed and the same
// sequence of calls it draws the same outcomes.
type Sim struct {
	name  string
	spec  model.SimSpec
	now   func() time.Time
	start time.Time

	mu  sync.Mutex
	rng *rand.Rand
}

// NewSim returns a sim model; seed 0 picks a time-based seed. The model name
// is mixed into the seed so that models sharing a seed differ.
func NewSim(name string, spec model.SimSpec, seed int64, now func() time.Time) *Sim {
	if now == nil {
		now = time.Now
	}
	if seed == 0 {
		seed = time.Now().UnixNano()
	}
	h := fnv.New64a()
	h.Write([]byte(name))
	return &Sim{name: name, spec: spec, now: now, start: now(),
		rng: rand.New(rand.NewPCG(uint64(seed), h.Sum64()))}
}

// current applies the schedule steps whose time has come.
func (s *Sim) current() (lat model.Latency, fail, hang, taskErr float64) {
	lat, fail, hang, taskErr = s.spec.Latency, s.spec.FailureRate, s.spec.TimeoutRate, s.spec.TaskErrorRate
	el := s.now().Sub(s.start)
	for _, st := range s.spec.Schedule {
		if el < st.After.D() {
			break
		}
		if st.Latency != nil {
			lat = *st.Latency
		}
		if st.FailureRate != nil {
			fail = *st.FailureRate
		}
		if st.TimeoutRate != nil {
			hang = *st.TimeoutRate
		}
		if st.TaskErrorRate != nil {
			taskErr = *st.TaskErrorRate
		}
	}
	return
}

// Draw decides the next attempt without running it.
func (s *Sim) Draw() Draw {
	lat, fail, hang, taskErr := s.current()
	s.mu.Lock()
	defer s.mu.Unlock()
	d := Draw{Latency: sample(s.rng, lat)}
	switch u := s.rng.Float64(); {
	case u < hang:
		d.Kind = KindHang
	case u < hang+fail:
		d.Kind = KindModelError
	case u < hang+fail+taskErr:
		d.Kind = KindTaskError
	}
	return d
}

func sample(r *rand.Rand, l model.Latency) time.Duration {
	var v float64
	switch l.Dist {
	case model.DistUniform:
		v = float64(l.Min) + r.Float64()*float64(l.Max-l.Min)
	case model.DistNormal:
		v = float64(l.Mean) + r.NormFloat64()*float64(l.StdDev)
	case model.DistLognormal:
		v = float64(l.Median) * math.Exp(l.Sigma*r.NormFloat64())
	default:
		v = float64(l.Value)
	}
	if v < 0 || math.IsNaN(v) {
		return 0
	}
	if v > float64(math.MaxInt64/2) {
		return time.Duration(math.MaxInt64 / 2)
	}
	return time.Duration(v)
}

// Run waits the drawn latency (or until ctx ends) and returns the drawn
// outcome. A success echoes the payload.
func (s *Sim) Run(ctx context.Context, t Task) (json.RawMessage, error) {
	d := s.Draw()
	if per := s.spec.LatencyPerUnit.D(); per > 0 && t.Size > 0 {
		d.Latency += time.Duration(min(float64(per)*t.Size, float64(time.Hour)))
	}
	d.Latency += s.spec.LatencyPerItem.D()
	if d.Kind == KindHang {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if d.Latency > 0 {
		tm := time.NewTimer(d.Latency)
		select {
		case <-tm.C:
		case <-ctx.Done():
			tm.Stop()
			return nil, ctx.Err()
		}
	}
	switch d.Kind {
	case KindModelError:
		return nil, ErrSimFailure
	case KindTaskError:
		return nil, &TaskError{Msg: "simulated bad input"}
	}
	out := struct {
		Model     string          `json:"model"`
		LatencyMs float64         `json:"sim_latency_ms"`
		Echo      json.RawMessage `json:"echo,omitempty"`
	}{s.name, float64(d.Latency) / float64(time.Millisecond), t.Payload}
	return json.Marshal(out)
}

// RunBatch runs the tasks in one simulated call: it takes the first
// task's drawn latency (the call's fixed cost) plus latency_per_item for
// each task and latency_per_unit for each unit of their sizes; it hangs
// when any task draws a hang; every other draw (success, model error, bad
// input) is each task's own.
func (s *Sim) RunBatch(ctx context.Context, ts []Task) ([]Result, error) {
	draws := make([]Draw, len(ts))
	lat := time.Duration(0)
	hang := false
	var units float64
	for i, t := range ts {
		draws[i] = s.Draw()
		hang = hang || draws[i].Kind == KindHang
		units += max(t.Size, 0)
	}
	lat = draws[0].Latency + time.Duration(len(ts))*s.spec.LatencyPerItem.D()
	if per := s.spec.LatencyPerUnit.D(); per > 0 && units > 0 {
		lat += time.Duration(min(float64(per)*units, float64(time.Hour)))
	}
	if hang {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if lat > 0 {
		tm := time.NewTimer(lat)
		select {
		case <-tm.C:
		case <-ctx.Done():
			tm.Stop()
			return nil, ctx.Err()
		}
	}
	rs := make([]Result, len(ts))
	for i, t := range ts {
		switch draws[i].Kind {
		case KindModelError:
			rs[i].Err = ErrSimFailure
		case KindTaskError:
			rs[i].Err = &TaskError{Msg: "simulated bad input"}
		default:
			rs[i].Output, rs[i].Err = json.Marshal(struct {
				Model     string          `json:"model"`
				LatencyMs float64         `json:"sim_latency_ms"`
				Batch     int             `json:"batch"`
				Echo      json.RawMessage `json:"echo,omitempty"`
			}{s.name, float64(lat) / float64(time.Millisecond), len(ts), t.Payload})
		}
	}
	return rs, nil
}

// Close does nothing.
func (s *Sim) Close() error { return nil }

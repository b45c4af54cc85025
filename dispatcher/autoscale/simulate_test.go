package autoscale

import (
	"encoding/csv"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// This file replays a trace through a policy in virtual time against a
// model of one pool: replicas of c slots that serve only after a start-up
// delay, a FIFO queue in front of them, a scale-in that drains (the
// replica takes nothing new and counts until its running tasks end). It is
// not the judge (make autoscale-replay runs real processes); it says in
// milliseconds where a policy's worker-seconds go and guards the ratio
// against KEDA's formula from regressing.

type simArrival struct {
	at  time.Duration
	svc time.Duration
}

// loadCodeTrace reads the Azure code trace's first minutes, time divided
// by speed; service times as the replay's sim model: 100 ms + 50 µs a
// context token.
func loadCodeTrace(t testing.TB, minutes, speed float64) []simArrival {
	t.Helper()
	f, err := os.Open("../internal/simulate/traces/azure-llm-2023-code.csv")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	var out []simArrival
	var first time.Time
	for i, r := range rows[1:] {
		at, err := time.Parse("2006-01-02 15:04:05.9999999", strings.TrimSpace(r[0]))
		if err != nil {
			t.Fatalf("row %d: %v", i+2, err)
		}
		if i == 0 {
			first = at
		}
		off := at.Sub(first)
		if off > time.Duration(minutes*float64(time.Minute)) {
			break
		}
		tok, _ := strconv.Atoi(strings.TrimSpace(r[1]))
		out = append(out, simArrival{at: time.Duration(float64(off) / speed),
			svc: 100*time.Millisecond + time.Duration(tok)*50*time.Microsecond})
	}
	return out
}

type simReplica struct {
	started, ready time.Time
	stopping       bool
	stoppedAt      time.Time
	busyUntil      []time.Time // one per slot
}

type simResult struct {
	waitP50, waitP99 time.Duration
	workerSeconds    float64
	pastDeadline     int
	scalings         int
	peak             int
}

// simulate runs the policy over the arrivals: a decision every interval,
// replicas that serve startup after they are started, a window until tail
// after the last arrival.
func simulate(arr []simArrival, pol Policy, interval, startup, tick, deadline, tail time.Duration, conc, minReplicas int) simResult {
	start := t0
	var reps []*simReplica
	addReplica := func(now time.Time) {
		reps = append(reps, &simReplica{started: now, ready: now.Add(startup), busyUntil: make([]time.Time, conc)})
	}
	for range minReplicas {
		addReplica(start.Add(-time.Hour))
	}
	var queue []int // indices of waiting arrivals
	var finished int64
	running := map[int]time.Time{} // index → end
	waits := make([]time.Duration, 0, len(arr))
	var res simResult
	next := 0
	lastDecide := start
	end := start.Add(arr[len(arr)-1].at + tail)
	for now := start; !now.After(end); now = now.Add(tick) {
		for next < len(arr) && !start.Add(arr[next].at).After(now) {
			queue = append(queue, next)
			next++
		}
		for i, e := range running {
			if !e.After(now) {
				delete(running, i)
				finished++
			}
		}
		// Serve FIFO on free slots of ready, non-stopping replicas.
		for _, r := range reps {
			if r.stopping || r.ready.After(now) {
				continue
			}
			for s := range r.busyUntil {
				if len(queue) == 0 {
					break
				}
				if r.busyUntil[s].After(now) {
					continue
				}
				i := queue[0]
				queue = queue[1:]
				w := now.Sub(start.Add(arr[i].at))
				waits = append(waits, w)
				if w+arr[i].svc > deadline {
					res.pastDeadline++
				}
				r.busyUntil[s] = now.Add(arr[i].svc)
				running[i] = r.busyUntil[s]
			}
		}
		for _, r := range reps {
			if r.stopping && r.stoppedAt.IsZero() {
				last := now
				for _, b := range r.busyUntil {
					if b.After(last) {
						last = b
					}
				}
				r.stoppedAt = last
			}
		}
		if now.Sub(lastDecide) >= interval || now.Equal(start) {
			lastDecide = now
			cur := 0
			for _, r := range reps {
				if !r.stopping {
					cur++
				}
			}
			backlog := int64(len(queue) + len(running))
			obs := Observation{At: now,
				Pools:  []Pool{{Name: "pool", Current: cur, Capacity: conc, Models: []Model{{Name: "coder", Types: []string{"code"}}}}},
				Types:  map[string]TypeLoad{"code": {Finished: finished, Backlog: backlog, Running: int64(len(running)), Lag: backlog}},
				Models: map[string]ModelStats{"coder": {ServiceTime: 200 * time.Millisecond, SuccessRate: 1, Share: 1}}}
			d := pol.Decide(obs)[0]
			if d.Target != cur {
				res.scalings++
			}
			for ; cur < d.Target; cur++ {
				addReplica(now)
			}
			for i := len(reps) - 1; i >= 0 && cur > d.Target; i-- {
				if !reps[i].stopping {
					reps[i].stopping = true
					cur--
				}
			}
			res.peak = max(res.peak, cur)
		}
	}
	for _, r := range reps {
		from, to := r.started, end
		if from.Before(start) {
			from = start
		}
		if !r.stoppedAt.IsZero() && r.stoppedAt.Before(to) {
			to = r.stoppedAt
		}
		res.workerSeconds += math.Max(0, to.Sub(from).Seconds())
	}
	slices.Sort(waits)
	if n := len(waits); n > 0 {
		res.waitP50, res.waitP99 = waits[n/2], waits[min(n-1, n*99/100)]
	}
	return res
}

// TestSimulatedReplayAgainstKEDA replays the Azure code trace as make
// autoscale-replay does (20 minutes at 10×, 1..20 replicas of 4 slots,
// every period divided by the speed) through both policies in virtual
// time, with replicas that start in 0.5 s and in 1 s, and holds this
// scaler to the target there: at most half KEDA's p99 queue wait
// at no more worker-seconds. (Main before the calm rate and ρ = 1 under a
// queue: 1.09x and 1.12x the worker-seconds.)
func TestSimulatedReplayAgainstKEDA(t *testing.T) {
	const speed = 10.0
	arr := loadCodeTrace(t, 20, speed)
	scaled := func(d time.Duration) time.Duration { return time.Duration(float64(d) / speed) }
	deadline := scaled(20 * time.Second)
	limits := func(string) Limits {
		return Limits{Min: 1, Max: 20, Cooldown: scaled(2 * time.Minute), DrainWithin: deadline / 2}
	}
	for _, startup := range []time.Duration{500 * time.Millisecond, time.Second} {
		t.Run(fmt.Sprintf("start-up %s", startup), func(t *testing.T) {
			const tick = 5 * time.Millisecond
			ml := simulate(arr, NewScaler(ScalerParams{Limits: limits, RateHalfLife: scaled(10 * time.Second)}),
				scaled(5*time.Second), startup, tick, deadline, 20*time.Second, 4, 1)
			kd := simulate(arr, NewKEDA(KEDAParams{TimeScale: speed, Limits: limits}),
				scaled(5*time.Second), startup, tick, deadline, 20*time.Second, 4, 1)
			for _, r := range []struct {
				name string
				r    simResult
			}{{"mlsched", ml}, {"keda", kd}} {
				t.Logf("%-8s wait p50 %6.1f ms p99 %7.1f ms  past deadline %4d  worker-seconds %7.1f  scalings %3d  peak %2d",
					r.name, ms(r.r.waitP50), ms(r.r.waitP99), r.r.pastDeadline, r.r.workerSeconds, r.r.scalings, r.r.peak)
			}
			p99 := ms(ml.waitP99) / ms(kd.waitP99)
			wsec := ml.workerSeconds / kd.workerSeconds
			t.Logf("ratios: p99 %.2fx, worker-seconds %.2fx (%d tasks)", p99, wsec, len(arr))
			if p99 > 0.5 || wsec > 1 {
				t.Errorf("against KEDA's formula: p99 queue wait %.2fx (want <= 0.5x), worker-seconds %.2fx (want <= 1x)", p99, wsec)
			}
		})
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

package opshttp_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mlsched/mlsched/shared/opshttp"
)

// BenchmarkDispatcherMetricsPerTask is what the dispatcher's metrics cost a
// task that succeeds at its first attempt: tasks received, the decision
// histogram (with its two clock reads), the attempt outcome, the result and
// the submit-to-result histogram. Compare with the dispatcher's CPU per task
// in `make bench` (docs/operations.md, "Cost").
func BenchmarkDispatcherMetricsPerTask(b *testing.B) {
	reg := prometheus.NewRegistry()
	recv := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "r_total", Help: "h"}, []string{"type"})
	res := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "s_total", Help: "h"}, []string{"type", "status"})
	att := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "a_total", Help: "h"}, []string{"model", "node", "outcome"})
	dec := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "d_seconds", Help: "h", Buckets: prometheus.ExponentialBuckets(1e-6, 4, 10)})
	dur := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "t_seconds", Help: "h", Buckets: prometheus.ExponentialBuckets(0.005, 2.5, 12)}, []string{"type"})
	reg.MustRegister(recv, res, att, dec, dur)
	received, results, attempts, taskDur := opshttp.Counter1(recv), opshttp.Counter2(res), opshttp.Counter3(att), opshttp.Observer1(dur)
	models := []string{"m-a", "m-b", "m-c", "m-d"}
	nodes := []string{"node-1", "node-2", "node-3", "node-4"}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			i++
			received.Get("classify").Inc()
			start := time.Now()
			dec.Observe(time.Since(start).Seconds())
			attempts.Get(opshttp.L3{A: models[i&3], B: nodes[(i>>2)&3], C: "success"}).Inc()
			results.Get(opshttp.L2{A: "classify", B: "succeeded"}).Inc()
			taskDur.Get("classify").Observe(0.012)
		}
	})
}

// BenchmarkScrape is one /metrics gather of a dispatcher-sized registry
// (runtime and process collectors included), the cost a scrape adds.
func BenchmarkScrape(b *testing.B) {
	reg := opshttp.NewRegistry()
	att := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "a_total", Help: "h"}, []string{"model", "node", "outcome"})
	reg.MustRegister(att)
	for _, m := range []string{"m-a", "m-b", "m-c", "m-d"} {
		for _, n := range []string{"node-1", "node-2", "node-3", "node-4"} {
			for _, o := range []string{"success", "model_error", "timeout"} {
				att.WithLabelValues(m, n, o).Inc()
			}
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := reg.Gather(); err != nil {
			b.Fatal(err)
		}
	}
}

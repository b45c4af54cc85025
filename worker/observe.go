package worker

import (
	"context"
	"errors"
	"net"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mlsched/mlsched/shared/opshttp"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// metrics of a node. Per-task instruments are resolved once per label value
// (opshttp.Children): each execution costs two atomic adds and a histogram
// observation.
type metrics struct {
	reg      *prometheus.Registry
	execs    *opshttp.Children[opshttp.L2, prometheus.Counter] // model, outcome
	duration *opshttp.Children[string, prometheus.Observer]    // model
	// batches: a batching model's batch sizes and each task's wait for its batch.
	batchSizes  *opshttp.Children[string, prometheus.Observer] // model
	batchDelays *opshttp.Children[string, prometheus.Observer] // model
}

func newMetrics(w *Worker) *metrics {
	reg := opshttp.NewRegistry()
	execs := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mlsched_worker_executions_total",
		Help: "Dispatches this node handled, by model and outcome (success, model_error, timeout, task_error, expired)."},
		[]string{"model", "outcome"})
	duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "mlsched_worker_execution_duration_seconds",
		Help:    "Time a model took to answer (or to time out), by model.",
		Buckets: prometheus.ExponentialBuckets(0.005, 2.5, 12)}, []string{"model"})
	inflight := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "mlsched_worker_inflight",
		Help: "Tasks running on this node now."}, func() float64 { return float64(w.inFlight.Load()) })
	capacity := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "mlsched_worker_capacity",
		Help: "Tasks this node runs at once (MLSCHED_CONCURRENCY)."}, func() float64 { return float64(w.cfg.Concurrency) })
	sizes := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "mlsched_worker_batch_size",
		Help:    "Tasks run in one call of a batching model, by model.",
		Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024}}, []string{"model"})
	delays := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "mlsched_worker_batch_queue_delay_seconds",
		Help:    "Time a task of a batching model waited for its batch to fill (or to become due), by model.",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2.5, 12)}, []string{"model"})
	reg.MustRegister(execs, duration, inflight, capacity, sizes, delays)
	return &metrics{reg: reg, execs: opshttp.Counter2(execs), duration: opshttp.Observer1(duration),
		batchSizes: opshttp.Observer1(sizes), batchDelays: opshttp.Observer1(delays)}
}

// batchSize counts one call of a batching model and its size.
func (m *metrics) batchSize(model string, n int) { m.batchSizes.Get(model).Observe(float64(n)) }

// batchDelay records a task's wait for its batch.
func (m *metrics) batchDelay(model string, d time.Duration) {
	m.batchDelays.Get(model).Observe(d.Seconds())
}

// observe counts one handled dispatch.
func (m *metrics) observe(out *protocol.Outcome, ran bool) {
	m.execs.Get(opshttp.L2{A: out.Model, B: string(out.Status)}).Inc()
	if ran {
		m.duration.Get(out.Model).Observe(out.LatencyMs / 1000)
	}
}

// Metrics is the node's Prometheus registry (what /metrics serves).
func (w *Worker) Metrics() prometheus.Gatherer { return w.metrics.reg }

// HTTPAddr is the listener's bound address, nil when it is off or not
// started.
func (w *Worker) HTTPAddr() net.Addr {
	w.httpMu.Lock()
	defer w.httpMu.Unlock()
	if w.http == nil {
		return nil
	}
	return w.http.Addr()
}

// startHTTP binds MLSCHED_HTTP_ADDR before the node connects.
func (w *Worker) startHTTP() (stop func(), err error) {
	s, err := opshttp.Listen(w.cfg.HTTPAddr, opshttp.Options{Gatherer: w.metrics.reg, Ready: w.Ready})
	if err != nil || s == nil {
		return func() {}, err
	}
	w.httpMu.Lock()
	w.http = s
	w.httpMu.Unlock()
	w.log.Info().Str("addr", s.Addr().String()).Msg("http listening: /metrics /healthz /readyz")
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = s.Close(ctx)
		w.httpMu.Lock()
		w.http = nil
		w.httpMu.Unlock()
	}, nil
}

// Ready reports readiness: consuming (started, not draining), connected to
// NATS, and the dispatch and outcome streams present.
func (w *Worker) Ready(ctx context.Context) opshttp.Status {
	live := w.liveConn.Load()
	if live == nil || w.draining.Load() {
		return opshttp.Status{Checks: []opshttp.Check{{Name: "worker", Err: errors.New("starting or draining")}}}
	}
	st := opshttp.Status{Checks: opshttp.NATSChecks(ctx, live.nc, live.js, topology.StreamDispatch, topology.StreamOutcomes)}
	// A node whose every model is unready announces nothing: not ready. Some
	// models unready: ready, and the body says which (degraded).
	var modelsErr error
	if un := w.unready(); len(un) > 0 {
		list := make([]string, len(un))
		for i, u := range un {
			list[i] = u.Name + " (" + u.Reason + ")"
		}
		if len(un) == len(w.specs) {
			modelsErr = errors.New("no model is ready: " + strings.Join(list, "; "))
		} else {
			st.Degraded = "models not ready: " + strings.Join(list, "; ")
		}
	}
	st.Checks = append(st.Checks, opshttp.Check{Name: "models", Err: modelsErr})
	return st
}

// conns are the node's NATS connection and JetStream context while it
// consumes (nil otherwise), for readiness checks.
type conns struct {
	nc *nats.Conn
	js jetstream.JetStream
}

package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mlsched/mlsched/dispatcher/dashboard"
	"github.com/mlsched/mlsched/shared/opshttp"
	"github.com/mlsched/mlsched/shared/topology"
)

// HandleHTTP mounts h on the replica's HTTP listener (MLSCHED_HTTP_ADDR), next
// to /metrics, /healthz and /readyz: the dashboard and its API. Call it before
// or after Run; with the listener off it does nothing. Use ServeMux patterns
// that match exactly what they serve ("GET /{$}" for the root page), so that
// unknown paths stay 404.
func (d *Dispatcher) HandleHTTP(pattern string, h http.Handler) {
	d.httpMu.Lock()
	defer d.httpMu.Unlock()
	if d.http != nil {
		d.http.Handle(pattern, h)
		return
	}
	d.httpHandlers = append(d.httpHandlers, httpHandler{pattern, h})
}

type httpHandler struct {
	pattern string
	h       http.Handler
}

// HTTPAddr is the listener's bound address, nil when it is off or not
// started yet.
func (d *Dispatcher) HTTPAddr() net.Addr {
	d.httpMu.Lock()
	defer d.httpMu.Unlock()
	if d.http == nil {
		return nil
	}
	return d.http.Addr()
}

// Metrics is the replica's Prometheus registry (what /metrics serves).
func (d *Dispatcher) Metrics() prometheus.Gatherer { return d.metrics.reg }

// startHTTP binds MLSCHED_HTTP_ADDR before anything else starts, so that a
// bad address fails fast and /healthz answers while the replica connects.
func (d *Dispatcher) startHTTP() (stop func(), err error) {
	s, err := opshttp.Listen(d.cfg.HTTPAddr, opshttp.Options{Gatherer: d.metrics.reg, Ready: d.Ready})
	if err != nil || s == nil {
		return func() {}, err
	}
	d.httpMu.Lock()
	d.http = s
	for _, h := range d.httpHandlers {
		s.Handle(h.pattern, h.h)
	}
	d.httpHandlers = nil
	d.httpMu.Unlock()
	if d.cfg.DashboardRefresh > 0 {
		d.log.Info().Str("addr", s.Addr().String()).Str("dashboard", dashboardURL(s.Addr())).
			Msg("http listening: the dashboard at /, /metrics /healthz /readyz")
	} else {
		d.log.Info().Str("addr", s.Addr().String()).Msg("http listening: /metrics /healthz /readyz (no dashboard: MLSCHED_DASHBOARD_REFRESH=0)")
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = s.Close(ctx)
	}, nil
}

// Ready reports readiness: connected to NATS, every stream present, the
// statistics store reachable. In degraded mode (Redis unreachable, deciding
// on the last snapshot) the replica still dispatches but is not ready, and
// the reason says so.
func (d *Dispatcher) Ready(ctx context.Context) opshttp.Status {
	var st opshttp.Status
	if !d.live.Load() {
		return opshttp.Status{Checks: []opshttp.Check{{Name: "dispatcher", Err: errors.New("starting or draining")}}}
	}
	st.Checks = opshttp.NATSChecks(ctx, d.nc, d.js, topology.StreamTasks, topology.StreamDispatch,
		topology.StreamOutcomes, topology.StreamResults, topology.StreamDLQ)
	if d.kind == "redis" {
		var redisErr error
		if reason := d.snaps.degraded.Load(); reason != nil {
			redisErr = errors.New(*reason)
		}
		st.Checks = append(st.Checks, opshttp.Check{Name: "redis", Err: redisErr})
	}
	if reason := d.degradedReason(); reason != "" {
		st.Degraded = reason + " (deciding on the last statistics snapshot)"
	}
	return st
}

// degradedReason is why the replica is in degraded mode, empty when it is not.
func (d *Dispatcher) degradedReason() string {
	if reason := d.snaps.degraded.Load(); reason != nil {
		return *reason
	}
	if d.wired.Load() {
		if bs := d.batch.Stats(); bs.Degraded {
			return "statistics updates are buffered: " + bs.LastError
		}
	}
	return ""
}

// backlogInterval is how often the backlog per type is sampled.
const backlogInterval = 2 * time.Second

// backlogLoop samples the tasks waiting in MLSCHED_TASKS per type, off the
// dispatch path: one stream-info request with per-subject counts every
// backlogInterval. A message being dispatched counts until its dispatch is
// acknowledged.
func (d *Dispatcher) backlogLoop(ctx context.Context) {
	sample := func(ctx context.Context) {
		rctx, cancel := context.WithTimeout(ctx, backlogInterval)
		defer cancel()
		b, err := d.sampleBacklog(rctx)
		if err != nil {
			d.log.Debug().Err(err).Msg("backlog sample failed")
			return
		}
		d.backlog.Store(&b)
	}
	sample(ctx)
	every(ctx, backlogInterval, sample)
}

func (d *Dispatcher) sampleBacklog(ctx context.Context) (map[string]int64, error) {
	st, err := d.js.Stream(ctx, topology.StreamTasks)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", topology.StreamTasks, err)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(topology.SubjectTasksAll))
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", topology.StreamTasks, err)
	}
	b := make(map[string]int64, len(info.State.Subjects))
	for subj, n := range info.State.Subjects {
		b[strings.TrimPrefix(subj, topology.TaskSubject(""))] += int64(n)
	}
	if d.reg != nil { // the types live nodes serve are reported at 0 too
		for _, n := range d.reg.Live() {
			for _, m := range n.Models {
				for _, t := range m.Types {
					if _, ok := b[t]; !ok {
						b[t] = 0
					}
				}
			}
		}
	}
	return b, nil
}

// Backlog is the last sample of tasks waiting per type (nil before the
// first); the map must not be modified.
func (d *Dispatcher) Backlog() map[string]int64 {
	if b := d.backlog.Load(); b != nil {
		return *b
	}
	return nil
}

// runDashboard mounts the web dashboard at / on the HTTP listener and
// gathers its view until ctx ends (see package dashboard): only when the
// listener is on.
func (d *Dispatcher) runDashboard(ctx context.Context) {
	if d.HTTPAddr() == nil || d.cfg.DashboardRefresh <= 0 {
		return
	}
	dash := dashboard.New(d.nc, d.js, dashboard.Config{Interval: d.cfg.DashboardRefresh, TokenFile: d.cfg.HTTPTokenFile}, d.log)
	for _, p := range dashboard.Patterns {
		d.HandleHTTP(p, dash)
	}
	dash.Run(ctx)
}

// dashboardURL is where a browser on this host finds the dashboard.
func dashboardURL(a net.Addr) string {
	host, port, err := net.SplitHostPort(a.String())
	if err != nil {
		return "http://" + a.String() + "/"
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = "localhost"
	}
	return "http://" + net.JoinHostPort(host, port) + "/"
}

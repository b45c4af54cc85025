package dispatcher

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/shared/opshttp"
	"github.com/mlsched/mlsched/shared/topology"
)

// httpListener is the replica's HTTP listener (MLSCHED_HTTP_ADDR):
// /metrics, /healthz, /readyz and whatever is mounted on it (the
// dashboard). Handlers mounted before it starts are mounted when it does.
type httpListener struct {
	addr string
	log  zerolog.Logger
	// dashboard says whether the dashboard is served at / (for the start log).
	dashboard bool

	mu       sync.Mutex
	srv      *opshttp.Server
	handlers []httpHandler // mounted once the listener starts
}

// handle mounts h (see Dispatcher.HandleHTTP).
func (l *httpListener) handle(pattern string, h http.Handler) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.srv != nil {
		l.srv.Handle(pattern, h)
		return
	}
	l.handlers = append(l.handlers, httpHandler{pattern, h})
}

type httpHandler struct {
	pattern string
	h       http.Handler
}

// bound is the listener's bound address, nil when it is off or not
// started yet.
func (l *httpListener) bound() net.Addr {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.srv == nil {
		return nil
	}
	return l.srv.Addr()
}

// start binds the address before anything else starts, so that a bad
// address fails fast and /healthz answers while the replica connects.
func (l *httpListener) start(g prometheus.Gatherer, ready func(context.Context) opshttp.Status) (stop func(), err error) {
	s, err := opshttp.Listen(l.addr, opshttp.Options{Gatherer: g, Ready: ready})
	if err != nil || s == nil {
		return func() {}, err
	}
	l.mu.Lock()
	l.srv = s
	for _, h := range l.handlers {
		s.Handle(h.pattern, h.h)
	}
	l.handlers = nil
	l.mu.Unlock()
	if l.dashboard {
		l.log.Info().Str("addr", s.Addr().String()).Str("dashboard", dashboardURL(s.Addr())).
			Msg("http listening: the dashboard at /, /metrics /healthz /readyz")
	} else {
		l.log.Info().Str("addr", s.Addr().String()).Msg("http listening: /metrics /healthz /readyz (no dashboard: MLSCHED_DASHBOARD_REFRESH=0)")
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = s.Close(ctx)
	}, nil
}

// ready reports readiness: connected to NATS, every stream present, the
// statistics store reachable. In degraded mode (Redis unreachable, deciding
// on the last snapshot) the replica still dispatches but is not ready, and
// the reason says so.
func (p *parts) ready(ctx context.Context) opshttp.Status {
	var st opshttp.Status
	st.Checks = opshttp.NATSChecks(ctx, p.nc, p.js, topology.StreamTasks, topology.StreamDispatch,
		topology.StreamOutcomes, topology.StreamResults, topology.StreamDLQ)
	if p.kind == "redis" {
		var redisErr error
		if reason := p.snaps.degraded.Load(); reason != nil {
			redisErr = errors.New(*reason)
		}
		st.Checks = append(st.Checks, opshttp.Check{Name: "redis", Err: redisErr})
	}
	if reason := p.degradedReason(); reason != "" {
		st.Degraded = reason + " (deciding on the last statistics snapshot)"
	}
	// An outage of the nodes leaves the replica ready (tasks are taken and
	// wait for nodes), and says so.
	if why, _ := p.adm.Outage(time.Now()); why != "" {
		if st.Degraded != "" {
			st.Degraded += "; "
		}
		st.Degraded += "node outage: " + why
	}
	return st
}

// degradedReason is why the replica is in degraded mode, empty when it is not.
func (p *parts) degradedReason() string {
	if reason := p.snaps.degraded.Load(); reason != nil {
		return *reason
	}
	if bs := p.batch.Stats(); bs.Degraded {
		return "statistics updates are buffered: " + bs.LastError
	}
	return ""
}

// notLive is the readiness of a replica starting or draining.
var notLive = opshttp.Status{Checks: []opshttp.Check{{Name: "dispatcher", Err: errors.New("starting or draining")}}}

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

// Package opshttp is the operations HTTP listener every mlsched process runs
// (MLSCHED_HTTP_ADDR): /healthz, /readyz and /metrics, plus whatever a
// process mounts next to them (the dispatcher's dashboard).
//
// Nothing served here touches the dispatch path: /metrics gathers from a
// Prometheus registry whose hot-path instruments are lock-free counters,
// /readyz answers from a cached check, and every request runs on its own
// goroutine with bounded headers and a bounded number of concurrent scrapes.
package opshttp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// EnvAddr is the variable that sets the listen address.
const EnvAddr = "MLSCHED_HTTP_ADDR"

// Off is the address value that disables the listener.
const Off = "off"

// Disabled reports whether addr turns the listener off: "off" (any case) or
// empty.
func Disabled(addr string) bool {
	a := strings.TrimSpace(addr)
	return a == "" || strings.EqualFold(a, Off)
}

// ValidateAddr checks a listen address without binding it: host:port with a
// numeric port in 0..65535 (0 picks a free port), or "off". The error names
// MLSCHED_HTTP_ADDR.
func ValidateAddr(addr string) error {
	if Disabled(addr) {
		return nil
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("invalid %s=%q: %v (want host:port, :port or off)", EnvAddr, addr, unwrapAddrErr(err))
	}
	if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
		return fmt.Errorf("invalid %s=%q: port %q is not a number in 0..65535", EnvAddr, addr, port)
	}
	return nil
}

func unwrapAddrErr(err error) string {
	var ae *net.AddrError
	if errors.As(err, &ae) {
		return ae.Err
	}
	return err.Error()
}

// Check is one readiness condition and its outcome.
type Check struct {
	// Name of the condition: "nats", "streams", "redis".
	Name string
	// Err is nil when the condition holds.
	Err error
}

// Status is a process's readiness.
type Status struct {
	// Checks in the order they are reported. The process is ready when
	// every check passed.
	Checks []Check
	// Degraded, when not empty, says the process runs in a degraded mode and
	// why (the dispatcher deciding on its last statistics snapshot). It is
	// reported on its own line of /readyz, so that an operator reading the
	// body sees the mode and not only a failed check.
	Degraded string
}

// Ready reports whether every check passed.
func (s Status) Ready() bool {
	for _, c := range s.Checks {
		if c.Err != nil {
			return false
		}
	}
	return true
}

// ReadyFunc computes readiness; it must honour ctx.
type ReadyFunc func(ctx context.Context) Status

// Options configure a Server.
type Options struct {
	// Gatherer serves /metrics (default: none, /metrics is a 404).
	Gatherer prometheus.Gatherer
	// Ready computes /readyz (default: always ready).
	Ready ReadyFunc
	// ReadyCache is how long a readiness result is reused, so that a flood
	// of probes does not turn into a flood of NATS and Redis requests
	// (default 1s).
	ReadyCache time.Duration
	// ReadyTimeout bounds one readiness computation (default 3s).
	ReadyTimeout time.Duration
	// MaxScrapes bounds concurrent /metrics requests; more get a 503
	// (default 8).
	MaxScrapes int
}

// Server is a started listener. Handle mounts more handlers on it at any
// time; Close stops it.
type Server struct {
	mux  *http.ServeMux
	srv  *http.Server
	ln   net.Listener
	done chan struct{}

	opts    Options
	readyMu sync.Mutex
	readyAt time.Time
	readyV  Status
}

// Listen binds addr and starts serving. It returns (nil, nil) when addr is
// "off" or empty. A bad or unavailable address is an error naming
// MLSCHED_HTTP_ADDR.
func Listen(addr string, opts Options) (*Server, error) {
	if Disabled(addr) {
		return nil, nil
	}
	if err := ValidateAddr(addr); err != nil {
		return nil, err
	}
	if opts.ReadyCache <= 0 {
		opts.ReadyCache = time.Second
	}
	if opts.ReadyTimeout <= 0 {
		opts.ReadyTimeout = 3 * time.Second
	}
	if opts.MaxScrapes <= 0 {
		opts.MaxScrapes = 8
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s=%q: cannot listen: %w", EnvAddr, addr, err)
	}
	s := &Server{mux: http.NewServeMux(), ln: ln, done: make(chan struct{}), opts: opts}
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	s.mux.HandleFunc("GET /readyz", s.serveReady)
	if opts.Gatherer != nil {
		s.mux.Handle("GET /metrics", promhttp.HandlerFor(opts.Gatherer, promhttp.HandlerOpts{
			MaxRequestsInFlight: opts.MaxScrapes,
			Timeout:             10 * time.Second,
			ErrorHandling:       promhttp.ContinueOnError,
		}))
	}
	s.srv = &http.Server{
		Handler:           s.mux,
		ReadHeaderTimeout: 5 * time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    64 << 10,
		// No WriteTimeout: the dashboard's event streams stay open.
	}
	go func() {
		defer close(s.done)
		_ = s.srv.Serve(ln)
	}()
	return s, nil
}

// Addr is the bound address (useful with port 0).
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// URL is http://<bound address>, with 127.0.0.1 for an unspecified host.
func (s *Server) URL() string { return "http://" + DialAddr(s.ln.Addr().String()) }

// Handle mounts h on pattern (net/http ServeMux patterns, e.g. "GET /{$}"
// for the root alone: a plain "/" would catch every unknown path, which
// must stay a 404). It panics on a conflicting pattern, as ServeMux does.
func (s *Server) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// Close stops accepting, gives open requests until ctx is done, then closes
// them (long-lived event streams never finish on their own).
func (s *Server) Close(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	if err != nil {
		_ = s.srv.Close()
	}
	<-s.done
	return err
}

func (s *Server) status(ctx context.Context) Status {
	if s.opts.Ready == nil {
		return Status{}
	}
	s.readyMu.Lock()
	defer s.readyMu.Unlock()
	if !s.readyAt.IsZero() && time.Since(s.readyAt) < s.opts.ReadyCache {
		return s.readyV
	}
	ctx, cancel := context.WithTimeout(ctx, s.opts.ReadyTimeout)
	defer cancel()
	s.readyV, s.readyAt = s.opts.Ready(ctx), time.Now()
	return s.readyV
}

// serveReady answers 200 "ready" or 503 "not ready", then one line per
// check ("nats: ok", "redis: error: ...") and a "degraded: ..." line in
// degraded mode.
func (s *Server) serveReady(w http.ResponseWriter, r *http.Request) {
	st := s.status(r.Context())
	var b strings.Builder
	code := http.StatusOK
	if st.Ready() {
		b.WriteString("ready\n")
	} else {
		code = http.StatusServiceUnavailable
		b.WriteString("not ready\n")
	}
	if st.Degraded != "" {
		fmt.Fprintf(&b, "degraded: %s\n", oneLine(st.Degraded))
	}
	for _, c := range st.Checks {
		if c.Err == nil {
			fmt.Fprintf(&b, "%s: ok\n", c.Name)
		} else {
			fmt.Fprintf(&b, "%s: error: %s\n", c.Name, oneLine(c.Err.Error()))
		}
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write([]byte(b.String()))
}

func oneLine(s string) string { return strings.ReplaceAll(s, "\n", " ") }

// DialAddr turns a listen address into one to dial: an empty or
// unspecified host becomes 127.0.0.1.
func DialAddr(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}

// Probe GETs path on the listener at addr (a MLSCHED_HTTP_ADDR value) and
// returns nil on a 2xx answer: the container health check of images that
// have no shell or curl (`dispatcher healthcheck`).
func Probe(ctx context.Context, addr, path string) error {
	if Disabled(addr) {
		return fmt.Errorf("%s is off: nothing to probe", EnvAddr)
	}
	if err := ValidateAddr(addr); err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+DialAddr(addr)+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var body [512]byte
	n, _ := resp.Body.Read(body[:])
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s: %s: %s", path, resp.Status, strings.TrimSpace(string(body[:n])))
	}
	return nil
}

// NewRegistry returns a registry with the Go runtime and process collectors,
// which every mlsched process exposes next to its own metrics.
func NewRegistry() *prometheus.Registry {
	r := prometheus.NewRegistry()
	r.MustRegister(prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	return r
}

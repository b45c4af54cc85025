package opshttp_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mlsched/mlsched/shared/opshttp"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func listen(t *testing.T, opts opshttp.Options) *opshttp.Server {
	t.Helper()
	s, err := opshttp.Listen("127.0.0.1:0", opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Close(ctx)
	})
	return s
}

func TestEndpoints(t *testing.T) {
	reg := opshttp.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "mlsched_test_total", Help: "test"})
	reg.MustRegister(c)
	c.Add(3)
	var st atomic.Pointer[opshttp.Status]
	st.Store(&opshttp.Status{Checks: []opshttp.Check{{Name: "nats"}, {Name: "streams"}}})
	s := listen(t, opshttp.Options{Gatherer: reg, ReadyCache: time.Nanosecond,
		Ready: func(context.Context) opshttp.Status { return *st.Load() }})
	s.Handle("GET /{$}", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("root")) }))

	if code, body := get(t, s.URL()+"/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("/healthz = %d %q", code, body)
	}
	if code, body := get(t, s.URL()+"/readyz"); code != 200 || body != "ready\nnats: ok\nstreams: ok\n" {
		t.Errorf("/readyz = %d %q", code, body)
	}
	if code, body := get(t, s.URL()+"/metrics"); code != 200 || !strings.Contains(body, "mlsched_test_total 3") ||
		!strings.Contains(body, "go_goroutines") || !strings.Contains(body, "process_cpu_seconds_total") {
		t.Errorf("/metrics = %d %q", code, body)
	}
	if code, body := get(t, s.URL()+"/"); code != 200 || body != "root" {
		t.Errorf("/ = %d %q", code, body)
	}
	for _, p := range []string{"/nope", "/metrics/x", "/healthz/", "/%2e%2e/etc/passwd", "/readyz?x=1/../.."} {
		code, _ := get(t, s.URL()+p)
		if p == "/readyz?x=1/../.." {
			if code != 200 {
				t.Errorf("%s = %d, want the query ignored", p, code)
			}
			continue
		}
		if code != 404 {
			t.Errorf("%s = %d, want 404", p, code)
		}
	}

	st.Store(&opshttp.Status{Degraded: "statistics store unreachable: dial tcp: refused",
		Checks: []opshttp.Check{{Name: "nats"}, {Name: "redis", Err: errors.New("dial tcp: refused\nsecond line")}}})
	code, body := get(t, s.URL()+"/readyz")
	want := "not ready\ndegraded: statistics store unreachable: dial tcp: refused\nnats: ok\nredis: error: dial tcp: refused second line\n"
	if code != 503 || body != want {
		t.Errorf("/readyz = %d %q, want 503 %q", code, body, want)
	}
	if err := opshttp.Probe(context.Background(), s.Addr().String(), "/readyz"); err == nil || !strings.Contains(err.Error(), "503") {
		t.Errorf("Probe of a non-ready process = %v", err)
	}
	if err := opshttp.Probe(context.Background(), s.Addr().String(), "/healthz"); err != nil {
		t.Errorf("Probe /healthz: %v", err)
	}
}

// A burst of probes computes readiness once per cache period.
func TestReadyCached(t *testing.T) {
	var calls atomic.Int64
	s := listen(t, opshttp.Options{ReadyCache: time.Hour, Ready: func(context.Context) opshttp.Status {
		calls.Add(1)
		return opshttp.Status{}
	}})
	for range 20 {
		if code, _ := get(t, s.URL()+"/readyz"); code != 200 {
			t.Fatalf("/readyz = %d", code)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("readiness computed %d times, want 1", n)
	}
	if code, _ := get(t, s.URL()+"/metrics"); code != 404 {
		t.Errorf("/metrics without a gatherer = %d, want 404", code)
	}
}

func TestBadAddress(t *testing.T) {
	for _, addr := range []string{"localhost", "127.0.0.1:99999", ":http", "1.2.3.4:-1", "::1:80", "a b:1"} {
		_, err := opshttp.Listen(addr, opshttp.Options{})
		if err == nil || !strings.Contains(err.Error(), "MLSCHED_HTTP_ADDR") {
			t.Errorf("Listen(%q) = %v, want an error naming MLSCHED_HTTP_ADDR", addr, err)
		}
		if err := opshttp.ValidateAddr(addr); err == nil && addr != "a b:1" { // a host name is resolved only by Listen
			t.Errorf("ValidateAddr(%q) accepted it", addr)
		}
	}
	// In use.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, err = opshttp.Listen(ln.Addr().String(), opshttp.Options{})
	if err == nil || !strings.Contains(err.Error(), "MLSCHED_HTTP_ADDR") {
		t.Errorf("Listen on a used port = %v, want an error naming MLSCHED_HTTP_ADDR", err)
	}
	// A host that does not resolve to a local address.
	_, err = opshttp.Listen("192.0.2.1:0", opshttp.Options{})
	if err == nil || !strings.Contains(err.Error(), "MLSCHED_HTTP_ADDR") {
		t.Errorf("Listen on a foreign address = %v, want an error naming MLSCHED_HTTP_ADDR", err)
	}
	for _, off := range []string{"off", "OFF", "", " off "} {
		s, err := opshttp.Listen(off, opshttp.Options{})
		if s != nil || err != nil {
			t.Errorf("Listen(%q) = %v, %v; want disabled", off, s, err)
		}
	}
	if err := opshttp.Probe(context.Background(), "off", "/healthz"); err == nil {
		t.Error("Probe of a disabled listener succeeded")
	}
}

// Close ends requests that never finish on their own, such as event streams.
func TestCloseEndsStreams(t *testing.T) {
	s := listen(t, opshttp.Options{})
	started := make(chan struct{})
	s.Handle("GET /events", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		close(started)
		<-r.Context().Done()
	}))
	resp, err := http.Get(s.URL() + "/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.Close(ctx) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return with a stream open")
	}
}

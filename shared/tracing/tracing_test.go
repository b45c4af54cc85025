package tracing_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/mlsched/mlsched/shared/tracing"
)

const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

func TestValid(t *testing.T) {
	for s, want := range map[string]bool{
		tp: true,
		"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra": true,
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra": false,
		"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01":       false,
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01":       false,
		"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01":       false,
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01":       false,
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7":          false,
		"":                      false,
		"\xff\xfe garbage here": false,
	} {
		if got := tracing.Valid(s); got != want {
			t.Errorf("Valid(%q) = %v, want %v", s, got, want)
		}
	}
	if got := tracing.TraceID(tp); got != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Errorf("TraceID = %q", got)
	}
}

// Off: the parent is handed on unchanged, an invalid one is dropped.
func TestOff(t *testing.T) {
	tr, err := tracing.New(tracing.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var nilTracer *tracing.Tracer
	for _, x := range []*tracing.Tracer{tr, nilTracer} {
		s := x.Start(tp, "mlsched.decision")
		if s.Traceparent() != tp {
			t.Errorf("off: Traceparent = %q", s.Traceparent())
		}
		s.End(nil)
		if got := x.Start("bogus", "x").Traceparent(); got != "" {
			t.Errorf("off: invalid parent handed on as %q", got)
		}
	}
	if _, err := tracing.New(tracing.Config{Endpoint: "collector:4318"}); err == nil {
		t.Error("an endpoint without a scheme was accepted")
	}
}

// collector is an OTLP/HTTP receiver that keeps the spans it is sent.
type collector struct {
	mu    sync.Mutex
	spans map[string][]string // name -> trace ids (hex)
	// ids: name -> "trace span parent" of each span (hex)
	ids map[string][]string
}

func newCollector(t *testing.T) (*collector, string) {
	c := &collector{spans: map[string][]string{}, ids: map[string][]string{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var req coltrace.ExportTraceServiceRequest
		if r.URL.Path != "/v1/traces" || proto.Unmarshal(b, &req) != nil {
			http.Error(w, "bad request", 400)
			return
		}
		c.mu.Lock()
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					c.spans[s.Name] = append(c.spans[s.Name], hexID(s.TraceId))
					c.ids[s.Name] = append(c.ids[s.Name], hexID(s.TraceId)+" "+hexID(s.SpanId)+" "+hexID(s.ParentSpanId))
				}
			}
		}
		c.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
		_, _ = w.Write(out)
	}))
	t.Cleanup(srv.Close)
	return c, srv.URL
}

func hexID(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, x := range b {
		out = append(out, digits[x>>4], digits[x&15])
	}
	return string(out)
}

// On: spans are children of the parent, exported over OTLP/HTTP.
func TestExportsSpans(t *testing.T) {
	c, url := newCollector(t)
	tr, err := tracing.New(tracing.Config{Endpoint: url, Service: "test"})
	if err != nil {
		t.Fatal(err)
	}
	s := tr.Start(tp, "mlsched.dispatch")
	child := s.Traceparent()
	if tracing.TraceID(child) != tracing.TraceID(tp) || child == tp {
		t.Errorf("child traceparent %q of %q", child, tp)
	}
	s.End(nil)
	root := tr.Start("", "mlsched.decision")
	if !tracing.Valid(root.Traceparent()) {
		t.Errorf("a new trace has traceparent %q", root.Traceparent())
	}
	root.End(nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tr.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if ids := c.spans["mlsched.dispatch"]; len(ids) != 1 || ids[0] != tracing.TraceID(tp) {
		t.Errorf("exported dispatch spans: %v", c.spans)
	}
	if len(c.spans["mlsched.decision"]) != 1 {
		t.Errorf("exported spans: %v", c.spans)
	}
}

// Reserve, then Record: the span recorded later has the reserved ids and
// the given parent, and what started from the reserved traceparent
// meanwhile is its child; a reserved root starts a trace of its own.
func TestReserveThenRecord(t *testing.T) {
	c, url := newCollector(t)
	tr, err := tracing.New(tracing.Config{Endpoint: url, Service: "test"})
	if err != nil {
		t.Fatal(err)
	}
	step := tr.Reserve(tp)
	if tracing.TraceID(step) != tracing.TraceID(tp) || step == tp || !tracing.Valid(step) {
		t.Fatalf("reserved %q under %q", step, tp)
	}
	inner := tr.Start(step, "mlsched.dispatch")
	inner.End(nil)
	tr.Record(step, tp, "mlsched.step a", time.Now().Add(-time.Second), nil)
	root := tr.Reserve("")
	if !tracing.Valid(root) || tracing.TraceID(root) == tracing.TraceID(tp) {
		t.Fatalf("reserved root %q", root)
	}
	tr.Record(root, "", "mlsched.pipeline", time.Now(), nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tr.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	span := func(tp string) string { return tp[36:52] }
	want := tracing.TraceID(tp) + " " + span(step) + " " + span(tp)
	if got := c.ids["mlsched.step a"]; len(got) != 1 || got[0] != want {
		t.Errorf("recorded step span %v, want %q", got, want)
	}
	if got := c.ids["mlsched.dispatch"]; len(got) != 1 || !strings.HasSuffix(got[0], " "+span(step)) {
		t.Errorf("the span started from the reserved traceparent %v is not its child (%s)", got, span(step))
	}
	if got := c.ids["mlsched.pipeline"]; len(got) != 1 || got[0] != tracing.TraceID(root)+" "+span(root)+" " {
		t.Errorf("recorded root span %v, want the reserved %q", got, root)
	}
	off, _ := tracing.New(tracing.Config{})
	if got := off.Reserve(tp); got != tp {
		t.Errorf("off: Reserve = %q, want the parent", got)
	}
	off.Record(tp, "", "x", time.Now(), nil) // a no-op
}

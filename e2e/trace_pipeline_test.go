package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/mlsched/mlsched/dispatcher"
	"github.com/mlsched/mlsched/shared/client"
	"github.com/mlsched/mlsched/shared/natsconn"
	"github.com/mlsched/mlsched/shared/natstest"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/tracing"
	"github.com/mlsched/mlsched/worker"
	"github.com/mlsched/mlsched/worker/model"
)

// spanCollector is a real OTLP/HTTP receiver keeping every span it is
// sent, whole.
type spanCollector struct {
	mu    sync.Mutex
	spans []*tracepb.Span
}

func startSpanCollector(t *testing.T) (*spanCollector, string) {
	c := &spanCollector{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var req coltrace.ExportTraceServiceRequest
		if err := proto.Unmarshal(b, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		c.mu.Lock()
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				c.spans = append(c.spans, ss.Spans...)
			}
		}
		c.mu.Unlock()
		out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(srv.Close)
	return c, srv.URL
}

// trace returns the spans of one trace, by span id.
func (c *spanCollector) trace(traceID string) map[string]*tracepb.Span {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]*tracepb.Span{}
	for _, s := range c.spans {
		if hexString(s.TraceId) == traceID {
			out[hexString(s.SpanId)] = s
		}
	}
	return out
}

func spanAttr(s *tracepb.Span, key string) string {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			if _, ok := kv.Value.GetValue().(*commonpb.AnyValue_IntValue); ok {
				return fmt.Sprint(kv.Value.GetIntValue())
			}
			return kv.Value.GetStringValue()
		}
	}
	return ""
}

// A pipeline's trace shows its steps (issue 45, requirement 3): under the
// producer's trace, one mlsched.pipeline span, and under it one span per
// step named after the step ("mlsched.step <name>", ensemble members
// included) with the step's model, node and attempts; every decision and
// dispatch of a step's attempts nests under that step's span. The step
// "a" fails its first attempt (a model error), so its span says 2
// attempts and holds two dispatches. Real nats-server, dispatcher and
// worker in process, a real OTLP/HTTP collector.
func TestPipelineStepsAreSpans(t *testing.T) {
	t.Parallel()
	collector, endpoint := startSpanCollector(t)
	ns := natstest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	cfg := dispatcher.DefaultConfig()
	cfg.NATS.URL, cfg.Name, cfg.HTTPAddr, cfg.OTelEndpoint = ns.URL, "trace-pipeline", "off", endpoint
	cfg.SnapshotInterval = 50 * time.Millisecond
	d, err := dispatcher.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var aCalls atomic.Int64
	echo := func(_ context.Context, t worker.Task) (any, error) { return json.RawMessage(t.Payload), nil }
	flaky := func(_ context.Context, t worker.Task) (any, error) {
		if aCalls.Add(1) == 1 {
			return nil, errors.New("first call fails")
		}
		return json.RawMessage(t.Payload), nil
	}
	spec := func(name, typ, handler string) worker.ModelSpec {
		return worker.ModelSpec{Name: name, Types: []string{typ}, Executor: model.ExecutorGo, Go: &model.GoSpec{Handler: handler}}
	}
	w, err := worker.New(worker.Config{NATS: natsconn.Config{URL: ns.URL}, NodeID: "tn", Concurrency: 2,
		HeartbeatInterval: 100 * time.Millisecond, OTelEndpoint: endpoint},
		worker.WithHandler("echo", echo), worker.WithHandler("flaky", flaky),
		worker.WithModels([]worker.ModelSpec{spec("ex-m", "ex", "echo"), spec("ja-m", "ja", "flaky"), spec("jb-m", "jb", "echo")}),
		worker.WithLogger(zerolog.Nop()))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() { _ = d.Run(ctx) })
	wg.Go(func() { _ = w.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()

	c := client.New(ns.JS)
	const producer = "00-7af7651916cd43dd8448eb211c80319c-c7ad6b7169203331-01"
	pl := &protocol.Pipeline{Steps: []protocol.PipelineStep{
		{Name: "ex", Type: "ex"},
		{Name: "vote", Ensemble: []protocol.PipelineStep{{Name: "a", Type: "ja", MaxAttempts: 3}, {Name: "b", Type: "jb"}}},
	}}
	if _, err := c.Submit(ctx, protocol.Task{ID: "traced-pipeline", Type: "ex", Payload: json.RawMessage(`{"x":1}`), Pipeline: pl},
		client.WithTraceparent(producer)); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	res, err := c.Wait(wctx, "traced-pipeline")
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != protocol.StatusSucceeded || len(res.Steps) != 3 || res.Steps[1].Attempts != 2 {
		t.Fatalf("result %+v", res)
	}
	cancel()
	wg.Wait() // both processes flushed their spans

	spans := collector.trace(tracing.TraceID(producer))
	byName := map[string][]*tracepb.Span{}
	for _, s := range spans {
		byName[s.Name] = append(byName[s.Name], s)
	}
	one := func(name string) *tracepb.Span {
		if len(byName[name]) != 1 {
			t.Fatalf("%d spans named %q in the trace, want 1; spans: %v", len(byName[name]), name, names(spans))
		}
		return byName[name][0]
	}
	pipe := one("mlsched.pipeline")
	if got, want := hexString(pipe.ParentSpanId), producer[36:52]; got != want {
		t.Errorf("the pipeline span's parent is %s, want the producer's span %s", got, want)
	}
	if spanAttr(pipe, "mlsched.steps") != "3" || spanAttr(pipe, "mlsched.status") != "succeeded" {
		t.Errorf("pipeline span attributes %v", pipe.Attributes)
	}
	want := map[string]struct{ model, attempts, ensemble string }{
		"ex": {"ex-m", "1", ""}, "a": {"ja-m", "2", "vote"}, "b": {"jb-m", "1", "vote"}}
	stepOf := map[string]string{} // step span id -> step name
	for name, w := range want {
		s := one("mlsched.step " + name)
		stepOf[hexString(s.SpanId)] = name
		if !bytesEqual(s.ParentSpanId, pipe.SpanId) {
			t.Errorf("step %s's span is not a child of the pipeline's", name)
		}
		if spanAttr(s, "mlsched.model") != w.model || spanAttr(s, "mlsched.node") != "tn" ||
			spanAttr(s, "mlsched.attempts") != w.attempts || spanAttr(s, "mlsched.ensemble") != w.ensemble ||
			spanAttr(s, "mlsched.step") != name {
			t.Errorf("step %s's span attributes %v, want model %s node tn attempts %s ensemble %q", name, s.Attributes, w.model, w.attempts, w.ensemble)
		}
		if s.EndTimeUnixNano <= s.StartTimeUnixNano || s.StartTimeUnixNano < pipe.StartTimeUnixNano {
			t.Errorf("step %s's span runs %d..%d, the pipeline's from %d", name, s.StartTimeUnixNano, s.EndTimeUnixNano, pipe.StartTimeUnixNano)
		}
	}
	// Every decision and dispatch nests under its step's span.
	dispatches := map[string]int{}
	for _, s := range spans {
		if s.Name != "mlsched.dispatch" && s.Name != "mlsched.decision" {
			continue
		}
		step := ""
		for p := s; p != nil && step == ""; p = spans[hexString(p.ParentSpanId)] {
			step = stepOf[hexString(p.ParentSpanId)]
		}
		if step == "" {
			t.Errorf("%s span (attempt %s) is under no step's span", s.Name, spanAttr(s, "mlsched.attempt"))
			continue
		}
		if s.Name == "mlsched.dispatch" {
			dispatches[step]++
		}
	}
	if dispatches["ex"] != 1 || dispatches["a"] != 2 || dispatches["b"] != 1 {
		t.Errorf("dispatch spans per step %v, want ex 1, a 2, b 1", dispatches)
	}
}

func names(spans map[string]*tracepb.Span) string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name)
	}
	return strings.Join(out, ", ")
}

func bytesEqual(a, b []byte) bool { return string(a) == string(b) }

// Package tracing carries a task's W3C trace context (the traceparent a
// producer sets) through mlsched, and, when MLSCHED_OTEL_ENDPOINT is set,
// records spans with the OpenTelemetry SDK and exports them over OTLP/HTTP.
//
// mlsched keeps no per-task state, so spans are not held across messages:
// each step starts a span from the traceparent the message carries and
// hands its own traceparent on (dispatch headers, outcome headers, the
// result's headers, the HTTP request to a model server). With tracing off
// the producer's traceparent is passed on unchanged, at no cost beyond a
// header, so a model server still sees the producer's trace id.
package tracing

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/url"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/mlsched/mlsched/shared/protocol"
)

// EnvEndpoint is the variable that turns span export on.
const EnvEndpoint = "MLSCHED_OTEL_ENDPOINT"

// Header is the W3C trace-context header, in the canonical form NATS and
// net/http headers use.
const Header = protocol.HdrTraceparent

// Valid reports whether tp is a well-formed W3C traceparent. Anything else
// is dropped, never an error: a bad trace context must not fail a task.
func Valid(tp string) bool { return protocol.ValidTraceparent(tp) }

// TraceID is the trace id of a valid traceparent, "" otherwise.
func TraceID(tp string) string {
	if !Valid(tp) {
		return ""
	}
	return tp[3:35]
}

// Tracer starts spans for one process. The zero value and nil are off:
// spans are no-ops and Start hands the parent traceparent on unchanged.
type Tracer struct {
	provider *sdktrace.TracerProvider
	tracer   trace.Tracer
}

// Config configures a Tracer.
type Config struct {
	// Endpoint of the OTLP/HTTP collector, e.g. http://otel-collector:4318
	// (MLSCHED_OTEL_ENDPOINT); empty: tracing off.
	Endpoint string
	// Service is the service.name resource attribute ("mlsched-dispatcher").
	Service string
	// Instance is service.instance.id (the replica or node name).
	Instance string
}

// New builds a Tracer exporting to cfg.Endpoint, or an off Tracer when it is
// empty. An endpoint that is not an http(s) URL is an error naming
// MLSCHED_OTEL_ENDPOINT.
func New(cfg Config) (*Tracer, error) {
	if strings.TrimSpace(cfg.Endpoint) == "" {
		return &Tracer{}, nil
	}
	u, err := url.Parse(cfg.Endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("invalid %s=%q: want an OTLP/HTTP collector URL such as http://collector:4318", EnvEndpoint, cfg.Endpoint)
	}
	opts := []otlptracehttp.Option{otlptracehttp.WithEndpointURL(endpointURL(u))}
	exp, err := otlptracehttp.New(context.Background(), opts...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", EnvEndpoint, err)
	}
	attrs := []attribute.KeyValue{attribute.String("service.name", cfg.Service)}
	if cfg.Instance != "" {
		attrs = append(attrs, attribute.String("service.instance.id", cfg.Instance))
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp, sdktrace.WithBatchTimeout(2*time.Second)),
		sdktrace.WithResource(resource.NewSchemaless(attrs...)),
		// The producer decides: a sampled traceparent is recorded, an
		// unsampled one is not, a task without one starts a sampled trace.
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())),
		sdktrace.WithIDGenerator(idGenerator{}),
	)
	return &Tracer{provider: tp, tracer: tp.Tracer("github.com/mlsched/mlsched")}, nil
}

// endpointURL adds the OTLP traces path when the URL has none.
func endpointURL(u *url.URL) string {
	if u.Path == "" || u.Path == "/" {
		c := *u
		c.Path = "/v1/traces"
		return c.String()
	}
	return u.String()
}

// On reports whether spans are recorded.
func (t *Tracer) On() bool { return t != nil && t.tracer != nil }

// Shutdown flushes the spans not exported yet.
func (t *Tracer) Shutdown(ctx context.Context) error {
	if !t.On() {
		return nil
	}
	return t.provider.Shutdown(ctx)
}

// Span is one step of a task's trace.
type Span struct {
	span   trace.Span
	parent string
}

var propagator = propagation.TraceContext{}

// Start begins a span named name as a child of the traceparent parent (a
// new trace when parent is empty or invalid). With tracing off it returns
// a no-op Span whose Traceparent is parent itself (when valid).
func (t *Tracer) Start(parent, name string, attrs ...attribute.KeyValue) Span {
	if !Valid(parent) {
		parent = ""
	}
	if !t.On() {
		return Span{parent: parent}
	}
	ctx := context.Background()
	if parent != "" {
		ctx = propagator.Extract(ctx, propagation.MapCarrier{"traceparent": parent})
	}
	_, s := t.tracer.Start(ctx, name, trace.WithAttributes(attrs...))
	return Span{span: s, parent: parent}
}

// Traceparent is what the next step is a child of: this span's context, or
// the parent's with tracing off.
func (s Span) Traceparent() string {
	if s.span == nil {
		return s.parent
	}
	c := propagation.MapCarrier{}
	propagator.Inject(trace.ContextWithSpan(context.Background(), s.span), c)
	if tp := c["traceparent"]; tp != "" {
		return tp
	}
	return s.parent
}

// SetAttributes adds attributes to a recording span.
func (s Span) SetAttributes(attrs ...attribute.KeyValue) {
	if s.span != nil {
		s.span.SetAttributes(attrs...)
	}
}

// End ends the span, marking it failed when err is not nil.
func (s Span) End(err error) {
	if s.span == nil {
		return
	}
	if err != nil {
		s.span.SetStatus(codes.Error, err.Error())
	}
	s.span.End()
}

// Reserve returns the traceparent of a span that Record will record later,
// perhaps in another process: a child of parent (in its trace, a new one
// when parent is empty or invalid) with a fresh span id. What runs under
// that span meanwhile (a pipeline's step: its decisions and dispatches) is
// started from the reserved traceparent, so that it nests under the span
// recorded at its end: mlsched keeps no span open across messages. With
// tracing off it returns parent (when valid), as Start does.
func (t *Tracer) Reserve(parent string) string {
	if !Valid(parent) {
		parent = ""
	}
	if !t.On() {
		return parent
	}
	var tid trace.TraceID
	flags := "01"
	if parent != "" {
		sc := spanContextOf(parent)
		tid = sc.TraceID()
		if !sc.IsSampled() {
			flags = "00"
		}
	} else {
		tid = newTraceID()
	}
	sid := newSpanID()
	return "00-" + tid.String() + "-" + sid.String() + "-" + flags
}

// Record records the span reserved (Reserve) under parent, named name,
// from start until now, failed when err is not nil. Nothing with tracing
// off or a reserved traceparent that is not valid; recording one twice
// (a redelivery) exports it twice with the same ids.
func (t *Tracer) Record(reserved, parent, name string, start time.Time, err error, attrs ...attribute.KeyValue) {
	if !t.On() || !Valid(reserved) {
		return
	}
	ctx := context.Background()
	if Valid(parent) {
		ctx = propagator.Extract(ctx, propagation.MapCarrier{"traceparent": parent})
	}
	ctx = context.WithValue(ctx, reservedKey{}, spanContextOf(reserved))
	_, s := t.tracer.Start(ctx, name, trace.WithAttributes(attrs...), trace.WithTimestamp(start))
	if err != nil {
		s.SetStatus(codes.Error, err.Error())
	}
	s.End()
}

// spanContextOf is the span context of a valid traceparent.
func spanContextOf(tp string) trace.SpanContext {
	ctx := propagator.Extract(context.Background(), propagation.MapCarrier{"traceparent": tp})
	return trace.SpanContextFromContext(ctx)
}

// reservedKey carries a reserved span context to idGenerator through the
// context of Record's Start.
type reservedKey struct{}

// idGenerator gives a span Record starts its reserved ids, and any other
// span random ones.
type idGenerator struct{}

func (idGenerator) NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID) {
	if sc, ok := ctx.Value(reservedKey{}).(trace.SpanContext); ok {
		return sc.TraceID(), sc.SpanID()
	}
	return newTraceID(), newSpanID()
}

func (idGenerator) NewSpanID(ctx context.Context, tid trace.TraceID) trace.SpanID {
	if sc, ok := ctx.Value(reservedKey{}).(trace.SpanContext); ok && sc.TraceID() == tid {
		return sc.SpanID()
	}
	return newSpanID()
}

// newTraceID and newSpanID draw non-zero ids from math/rand/v2's
// generator (ChaCha8, seeded from the operating system, safe for
// concurrent use).
func newTraceID() (id trace.TraceID) {
	for !id.IsValid() {
		binary.BigEndian.PutUint64(id[:8], rand.Uint64())
		binary.BigEndian.PutUint64(id[8:], rand.Uint64())
	}
	return id
}

func newSpanID() (id trace.SpanID) {
	for !id.IsValid() {
		binary.BigEndian.PutUint64(id[:], rand.Uint64())
	}
	return id
}

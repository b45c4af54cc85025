package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/mlsched/mlsched/dispatcher"
	"github.com/mlsched/mlsched/shared/client"
	"github.com/mlsched/mlsched/shared/natsconn"
	"github.com/mlsched/mlsched/shared/natstest"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
	"github.com/mlsched/mlsched/shared/tracing"
	"github.com/mlsched/mlsched/worker"
	"github.com/mlsched/mlsched/worker/model"
)

// otlpCollector is a real OTLP/HTTP receiver: it decodes the protobuf export
// requests the SDK sends and keeps span names per trace id.
type otlpCollector struct {
	mu    sync.Mutex
	spans map[string][]string // trace id (hex) -> span names
}

func startCollector(t *testing.T) (*otlpCollector, string) {
	c := &otlpCollector{spans: map[string][]string{}}
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
				for _, s := range ss.Spans {
					id := hexString(s.TraceId)
					c.spans[id] = append(c.spans[id], s.Name)
				}
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

func (c *otlpCollector) names(traceID string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.spans[traceID])
}

func hexString(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, x := range b {
		out = append(out, digits[x>>4], digits[x&15])
	}
	return string(out)
}

// One trace id goes from the producer (client.WithTraceparent) through the
// dispatcher and the worker to a real HTTP model server, and back into the
// result's headers. With tracing off the model server sees the producer's
// traceparent itself; with MLSCHED_OTEL_ENDPOINT set it sees the worker's
// execution span, and the decision, dispatch, execution and result spans
// of that trace reach the OTLP collector.
func TestTraceparentProducerToModelServerToResult(t *testing.T) {
	for _, otel := range []bool{false, true} {
		name := "tracing off"
		if otel {
			name = "tracing on"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var collector *otlpCollector
			endpoint := ""
			if otel {
				collector, endpoint = startCollector(t)
			}
			var seen sync.Map // task id -> traceparent the model server received
			modelSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if id := r.Header.Get("Mlsched-Task-Id"); id != "" {
					seen.Store(id, r.Header.Get("traceparent"))
				}
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write([]byte(`{"ok":true}`))
			}))
			defer modelSrv.Close()

			ns := natstest.New(t)
			ctx, cancel := context.WithCancel(context.Background())
			cfg := dispatcher.DefaultConfig()
			cfg.NATS.URL, cfg.Name, cfg.HTTPAddr, cfg.OTelEndpoint = ns.URL, "trace", "off", endpoint
			cfg.SnapshotInterval = 50 * time.Millisecond
			d, err := dispatcher.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			w, err := worker.New(worker.Config{NATS: natsconn.Config{URL: ns.URL}, NodeID: "tn", Concurrency: 2,
				HeartbeatInterval: 100 * time.Millisecond, OTelEndpoint: endpoint},
				worker.WithModels([]worker.ModelSpec{{Name: "web", Types: []string{"echo"}, Executor: model.ExecutorHTTP,
					HTTP: &model.HTTPSpec{URL: modelSrv.URL}}}), worker.WithLogger(zerolog.Nop()))
			if err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			wg.Add(2)
			go func() { defer wg.Done(); _ = d.Run(ctx) }()
			go func() { defer wg.Done(); _ = w.Run(ctx) }()
			defer func() { cancel(); wg.Wait() }() // Run flushes the spans on its way out

			c := client.New(ns.JS)
			const producer = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
			if _, err := c.Submit(ctx, protocol.Task{ID: "traced", Type: "echo", Payload: json.RawMessage(`{}`)},
				client.WithTraceparent(producer)); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Submit(ctx, protocol.Task{ID: "untraced", Type: "echo"}); err != nil {
				t.Fatal(err)
			}
			wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
			defer wcancel()
			for _, id := range []string{"traced", "untraced"} {
				res, err := c.Wait(wctx, id)
				if err != nil {
					t.Fatal(err)
				}
				if res.Status != protocol.StatusSucceeded {
					t.Fatalf("%s: %+v", id, res)
				}
			}
			rs, err := ns.JS.Stream(ctx, topology.StreamResults)
			if err != nil {
				t.Fatal(err)
			}
			msg, err := rs.GetLastMsgForSubject(ctx, topology.ResultSubject("traced"))
			if err != nil {
				t.Fatal(err)
			}
			resultTP := msg.Header.Get(protocol.HdrTraceparent)
			v, _ := seen.Load("traced")
			serverTP, _ := v.(string)
			want := tracing.TraceID(producer)
			if tracing.TraceID(serverTP) != want || tracing.TraceID(resultTP) != want {
				t.Fatalf("trace id: producer %s, model server got %q, result header %q", want, serverTP, resultTP)
			}
			if !otel && (serverTP != producer || resultTP != producer) {
				t.Errorf("tracing off: the producer's traceparent is not passed on unchanged: server %q result %q", serverTP, resultTP)
			}
			if otel && serverTP == producer {
				t.Errorf("tracing on: the model server's request is not a child span: %q", serverTP)
			}
			// A task without one: nothing with tracing off; a trace of its own
			// started by the dispatcher with tracing on.
			v, _ = seen.Load("untraced")
			if tp, _ := v.(string); (!otel && tp != "") || (otel && (!tracing.Valid(tp) || tracing.TraceID(tp) == want)) {
				t.Errorf("a task without a traceparent reached the model server with %q", tp)
			}
			if !otel {
				return
			}
			cancel()
			wg.Wait() // both processes flushed their spans
			got := collector.names(want)
			for _, span := range []string{"mlsched.decision", "mlsched.dispatch", "mlsched.execute", "mlsched.result"} {
				if !slices.Contains(got, span) {
					t.Errorf("span %s of trace %s not exported; got %v", span, want, got)
				}
			}
		})
	}
}

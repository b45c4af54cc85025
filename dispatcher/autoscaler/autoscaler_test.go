package autoscaler_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/dispatcher"
	"github.com/mlsched/mlsched/dispatcher/autoscale"
	"github.com/mlsched/mlsched/dispatcher/autoscaler"
	"github.com/mlsched/mlsched/shared/natstest"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// recorder is a backend whose one pool runs replicas, recording every
// scaling asked of it.
type recorder struct {
	mu       sync.Mutex
	replicas int
	scales   []int
}

func (r *recorder) Name() string { return "recorder" }
func (r *recorder) Pools(context.Context) ([]autoscaler.BackendPool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return []autoscaler.BackendPool{{Name: "pool", Replicas: r.replicas, Match: func(hb protocol.Heartbeat) bool { return true }}}, nil
}
func (r *recorder) Scale(_ context.Context, _ string, n int) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.scales = append(r.scales, n)
	r.replicas = n
	return nil
}

// With NATS gone, the autoscaler holds every pool where it is: no scaling
// to zero, none to the maximum, the held gauge at 1, and it says why.
func TestHoldsWhenNATSIsUnreachable(t *testing.T) {
	srv := natstest.New(t)
	ctx, stopDispatcher := runDispatcher(t, srv)
	kv, err := topology.EnsureNodesBucket(ctx, srv.JS, topology.Config{})
	if err != nil {
		t.Fatal(err)
	}
	hb, _ := json.Marshal(protocol.Heartbeat{Node: "w1", Capacity: 8, SentAt: time.Now(), StartedAt: time.Now(),
		Models: []protocol.ModelInfo{{Name: "m", Types: []string{"classify"}}}})
	if _, err := kv.Put(ctx, "w1", hb); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(srv.URL, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	be := &recorder{replicas: 3}
	reg := prometheus.NewRegistry()
	as, err := autoscaler.New(autoscaler.Params{NC: nc, JS: js, Backend: be, Log: zerolog.Nop(), Registerer: reg, Wait: 300 * time.Millisecond,
		Policy: autoscale.NewScaler(autoscale.ScalerParams{Limits: func(string) autoscale.Limits {
			return autoscale.Limits{Min: 0, Max: 10, Cooldown: time.Millisecond}
		}})})
	if err != nil {
		t.Fatal(err)
	}
	// Up: the pool is seen through the heartbeat, decided on (not held),
	// and published.
	deadline := time.Now().Add(20 * time.Second)
	for {
		ds, err := as.Step(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) == 1 && !ds[0].Held {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no decision on live statistics: %s", autoscaler.Summary(ds))
		}
		time.Sleep(20 * time.Millisecond) // poll interval
	}
	be.mu.Lock()
	be.replicas, be.scales = 3, nil // whatever it did, 3 again
	be.mu.Unlock()
	stopDispatcher()
	srv.Shutdown()
	srv.WaitForShutdown()
	for range 5 {
		ds, err := as.Step(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) != 1 || !ds[0].Held || ds[0].Target != 3 || !strings.Contains(ds[0].Reason, "hold: no statistics") {
			t.Fatalf("NATS down: want a hold at 3 saying why, got %s", autoscaler.Summary(ds))
		}
	}
	if len(be.scales) != 0 {
		t.Fatalf("scaled to %v while NATS was unreachable", be.scales)
	}
	if got := testutil.ToFloat64(mustVec(t, reg, "mlsched_autoscale_held")); got != 1 {
		t.Fatalf("mlsched_autoscale_held = %v, want 1", got)
	}
}

// mustVec finds the one series of a metric in reg.
func mustVec(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			v := mf.GetMetric()[0].GetGauge().GetValue()
			g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name})
			g.Set(v)
			return g
		}
	}
	t.Fatalf("no single series of %s", name)
	return nil
}

// The backlog a decision drains is read at every step from the task
// consumers, not from the dispatchers' 2 s sample: tasks published just
// before a step are in that step's decision.
func TestBacklogIsReadEachStep(t *testing.T) {
	srv := natstest.New(t)
	ctx, _ := runDispatcher(t, srv)
	// A node that announces the model and never runs anything: what is
	// published stays unfinished.
	kv, err := topology.EnsureNodesBucket(ctx, srv.JS, topology.Config{})
	if err != nil {
		t.Fatal(err)
	}
	hb, _ := json.Marshal(protocol.Heartbeat{Node: "w1", Capacity: 4, SentAt: time.Now(), StartedAt: time.Now(),
		Models: []protocol.ModelInfo{{Name: "m", Types: []string{"classify"}}}})
	if _, err := kv.Put(ctx, "w1", hb); err != nil {
		t.Fatal(err)
	}
	be := &recorder{replicas: 1}
	as, err := autoscaler.New(autoscaler.Params{NC: srv.NC, JS: srv.JS, Backend: be, Log: zerolog.Nop(), Wait: 300 * time.Millisecond,
		Policy: autoscale.NewScaler(autoscale.ScalerParams{}), DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	// The type is in the dispatchers' report (its backlog sample lists
	// the types live nodes serve) before the tasks come.
	deadline := time.Now().Add(20 * time.Second)
	for {
		ds, err := as.Step(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) == 1 && !ds[0].Held && strings.Contains(ds[0].Reason, "needs") {
			if ds[0].Backlog != 0 {
				t.Fatalf("backlog %d before any task", ds[0].Backlog)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no decision: %s", autoscaler.Summary(ds))
		}
		time.Sleep(20 * time.Millisecond) // poll interval
	}
	const n = 40
	for i := range n {
		task, _ := json.Marshal(protocol.Task{ID: "b-" + strconv.Itoa(i), Type: "classify", Payload: json.RawMessage(`{}`)})
		if _, err := srv.JS.Publish(ctx, topology.TaskSubject("classify"), task); err != nil {
			t.Fatal(err)
		}
	}
	ds, err := as.Step(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != 1 || ds[0].Backlog != n {
		t.Fatalf("the step right after %d tasks: %s; want backlog %d", n, autoscaler.Summary(ds), n)
	}
}

// runDispatcher runs a dispatcher on srv until stop or the test's end and
// waits until it is ready; the context returned ends with the test (at
// most 60 s).
func runDispatcher(t *testing.T, srv *natstest.Server) (ctx context.Context, stop func()) {
	t.Helper()
	cfg := dispatcher.DefaultConfig()
	cfg.NATS.URL, cfg.Name, cfg.HTTPAddr = srv.URL, "d1", "off"
	d, err := dispatcher.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	done := make(chan error, 1)
	dctx, stopD := context.WithCancel(ctx)
	go func() { done <- d.Run(dctx) }()
	stop = sync.OnceFunc(func() { stopD(); <-done })
	t.Cleanup(func() { stop(); cancel() })
	deadline := time.Now().Add(20 * time.Second)
	for !d.Ready(ctx).Ready() {
		if time.Now().After(deadline) {
			t.Fatal("dispatcher not ready")
		}
		time.Sleep(10 * time.Millisecond) // poll interval
	}
	return ctx, stop
}

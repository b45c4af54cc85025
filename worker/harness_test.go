package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/shared/natsconn"
	"github.com/mlsched/mlsched/shared/natstest"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
	"github.com/mlsched/mlsched/worker/model"
)

// harness plays the dispatcher against a real embedded NATS server: it
// publishes dispatches to a node and reads the node's outcomes.
type harness struct {
	t    testing.TB
	srv  *natstest.Server
	node string
	outc jetstream.Consumer
}

func newHarness(t testing.TB, node string) *harness {
	t.Helper()
	srv := natstest.New(t)
	ctx := context.Background()
	if err := topology.Ensure(ctx, srv.JS, topology.Config{}); err != nil {
		t.Fatal(err)
	}
	oc, err := srv.JS.CreateOrUpdateConsumer(ctx, topology.StreamOutcomes, jetstream.ConsumerConfig{
		Durable: "test-dispatcher", FilterSubject: topology.OutcomeSubject(node), AckPolicy: jetstream.AckExplicitPolicy,
	})
	if err != nil {
		t.Fatal(err)
	}
	return &harness{t: t, srv: srv, node: node, outc: oc}
}

// testConfig is a fast configuration for tests.
func (h *harness) config() Config {
	return Config{NATS: natsconn.Config{URL: h.srv.URL}, NodeID: h.node, Concurrency: 4, AckWait: 5 * time.Second,
		HeartbeatInterval: 100 * time.Millisecond, Shared: topology.Shared{NodeTTL: 3 * time.Second}, ShutdownGrace: 5 * time.Second,
		DefaultTimeout: 5 * time.Second}
}

// goModel is a spec for a registered Go handler.
func goModel(name, handler string) ModelSpec {
	return ModelSpec{Name: name, Types: []string{"t"}, Executor: model.ExecutorGo, Go: &model.GoSpec{Handler: handler}}
}

// running is a worker started by start.
type running struct {
	w    *Worker
	stop context.CancelFunc
	done chan error
}

// start runs a worker until Stop or the end of the test.
func (h *harness) start(cfg Config, opts ...Option) *running {
	h.t.Helper()
	opts = append([]Option{WithLogger(zerolog.Nop())}, opts...)
	w, err := New(cfg, opts...)
	if err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{w: w, stop: cancel, done: make(chan error, 1)}
	go func() { r.done <- w.Run(ctx) }()
	h.t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(30 * time.Second):
			h.t.Error("worker did not stop")
		}
	})
	// Ready once the node's consumer exists.
	waitFor(h.t, 10*time.Second, "worker consumer", func() bool {
		_, err := h.srv.JS.Consumer(context.Background(), topology.StreamDispatch, topology.NodeConsumer(h.node))
		return err == nil
	})
	return r
}

// Stop cancels the worker and returns Run's error.
func (r *running) Stop(t testing.TB) error {
	t.Helper()
	r.stop()
	select {
	case err := <-r.done:
		r.done <- err // for the cleanup
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("worker did not stop in 30s")
		return nil
	}
}

type dispatchOpts struct {
	attempt  int
	deadline time.Time
	timeout  time.Duration
	payload  string
	headers  map[string]string // overrides
	compact  bool              // the compact encoding (protocol.HdrDispatch)
	body     string            // the task's JSON (default: taskBody)
}

// body is the task JSON of a dispatch.
func taskBody(id, payload string) []byte {
	if payload == "" {
		payload = "null"
	}
	return []byte(`{"id":"` + id + `","type":"t","payload":` + payload + `}`)
}

// dispatch publishes a dispatch of task id to model.
func (h *harness) dispatch(id, modelName string, o dispatchOpts) *nats.Msg {
	h.t.Helper()
	if o.attempt == 0 {
		o.attempt = 1
	}
	if o.deadline.IsZero() {
		o.deadline = time.Now().Add(time.Minute)
	}
	m := nats.NewMsg(topology.DispatchSubject(h.node))
	m.Data = taskBody(id, o.payload)
	if o.body != "" {
		m.Data = []byte(o.body)
	}
	pd := protocol.Dispatch{TaskID: id, Type: "t", Model: modelName, Node: h.node, Attempt: o.attempt, MaxAttempts: 3,
		Deadline: o.deadline, Timeout: o.timeout, Submitted: time.Now(),
		History: []protocol.Attempt{{Attempt: 0, Model: "x", Node: "n0", Status: protocol.OutcomeTimeout, LatencyMs: 1}}}
	m.Header = pd.Header()
	if o.compact {
		m.Header = pd.CompactHeader()
	}
	m.Header.Set(protocol.HdrMsgID, pd.MsgID("d"))
	for k, v := range o.headers {
		if v == "" {
			m.Header.Del(k)
		} else {
			m.Header.Set(k, v)
		}
	}
	if _, err := h.srv.JS.PublishMsg(context.Background(), m); err != nil {
		h.t.Fatal(err)
	}
	return m
}

type gotOutcome struct {
	protocol.Outcome
	Header nats.Header
}

// next returns the next outcome, failing the test after wait.
func (h *harness) next(wait time.Duration) gotOutcome {
	h.t.Helper()
	msgs, err := h.outc.Fetch(1, jetstream.FetchMaxWait(wait))
	if err != nil {
		h.t.Fatal(err)
	}
	for m := range msgs.Messages() {
		var o protocol.Outcome
		if err := json.Unmarshal(m.Data(), &o); err != nil {
			h.t.Fatalf("outcome is not JSON: %v: %s", err, m.Data())
		}
		_ = m.Ack()
		return gotOutcome{o, m.Headers()}
	}
	h.t.Fatalf("no outcome within %v (fetch error: %v)", wait, msgs.Error())
	return gotOutcome{}
}

// collect returns n outcomes by task id.
func (h *harness) collect(n int, wait time.Duration) map[string]gotOutcome {
	h.t.Helper()
	out := map[string]gotOutcome{}
	deadline := time.Now().Add(wait)
	for len(out) < n {
		left := time.Until(deadline)
		if left <= 0 {
			h.t.Fatalf("got %d of %d outcomes within %v", len(out), n, wait)
		}
		o := h.next(left)
		if _, dup := out[o.TaskID]; dup {
			h.t.Fatalf("duplicate outcome for %s", o.TaskID)
		}
		out[o.TaskID] = o
	}
	return out
}

// noOutcome asserts that no outcome is pending right now.
func (h *harness) pendingOutcomes() uint64 {
	h.t.Helper()
	info, err := h.srv.JS.Stream(context.Background(), topology.StreamOutcomes)
	if err != nil {
		h.t.Fatal(err)
	}
	return info.CachedInfo().State.Msgs
}

// waitFor polls cond until it holds or the timeout fails the test.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond) // polling interval, not synchronisation
	}
}

// heartbeat returns the node's heartbeat (zero when none).
func (h *harness) heartbeat() protocol.Heartbeat {
	var hb protocol.Heartbeat
	kv, err := h.srv.JS.KeyValue(context.Background(), topology.BucketNodes)
	if err != nil {
		return hb
	}
	e, err := kv.Get(context.Background(), h.node)
	if err != nil {
		return hb
	}
	_ = json.Unmarshal(e.Value(), &hb)
	return hb
}

// announced returns the models in the node's heartbeat (nil when none).
func (h *harness) announced() []string {
	hb := h.heartbeat()
	var names []string
	for _, m := range hb.Models {
		names = append(names, m.Name)
	}
	return names
}

// waitAnnounced waits until the node's heartbeat does (or does not) list
// the model.
func (h *harness) waitAnnounced(model string, want bool, timeout time.Duration) {
	h.t.Helper()
	waitFor(h.t, timeout, fmt.Sprintf("model %s announced=%v", model, want), func() bool {
		return slices.Contains(h.announced(), model) == want
	})
}

package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/shared/logtest"
	"github.com/mlsched/mlsched/shared/natsconn"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

func TestOutcomeClassification(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "n1")
	hang := make(chan struct{})
	t.Cleanup(func() { close(hang) })
	handlers := map[string]Handler{
		"ok": func(_ context.Context, t Task) (any, error) {
			return map[string]any{"id": t.ID, "attempt": t.Attempt}, nil
		},
		"text": func(context.Context, Task) (any, error) { return []byte("plain text"), nil },
		"badin": func(context.Context, Task) (any, error) {
			return nil, fmt.Errorf("%w: field x is missing", ErrTaskError)
		},
		"typed":  func(context.Context, Task) (any, error) { return nil, &TaskError{Msg: "bad image"} },
		"broken": func(context.Context, Task) (any, error) { return nil, errors.New("CUDA out of memory") },
		"panics": func(context.Context, Task) (any, error) { panic("boom") },
		"slow":   func(ctx context.Context, _ Task) (any, error) { <-ctx.Done(); return nil, ctx.Err() },
		"deaf":   func(context.Context, Task) (any, error) { <-hang; return nil, nil }, // ignores ctx
		"unenc":  func(context.Context, Task) (any, error) { return func() {}, nil },
		"wrapctx": func(ctx context.Context, _ Task) (any, error) {
			<-ctx.Done()
			return nil, fmt.Errorf("rpc: %w", ctx.Err())
		},
	}
	var opts []Option
	var specs []ModelSpec
	for name, hd := range handlers {
		opts = append(opts, WithHandler(name, hd))
		specs = append(specs, goModel("m-"+name, name))
	}
	opts = append(opts, WithModels(specs))
	h.start(h.config(), opts...)

	cases := []struct {
		model   string
		timeout time.Duration
		status  protocol.OutcomeStatus
		output  string // exact JSON on success
		errHas  string
	}{
		{"m-ok", 0, protocol.OutcomeSuccess, `{"attempt":1,"id":"c-m-ok"}`, ""},
		{"m-text", 0, protocol.OutcomeSuccess, `"plain text"`, ""},
		{"m-badin", 0, protocol.OutcomeTaskError, "", "field x is missing"},
		{"m-typed", 0, protocol.OutcomeTaskError, "", "bad image"},
		{"m-broken", 0, protocol.OutcomeModelError, "", "CUDA out of memory"},
		{"m-panics", 0, protocol.OutcomeModelError, "", "panicked: boom"},
		{"m-slow", 50 * time.Millisecond, protocol.OutcomeTimeout, "", "no answer within 50ms"},
		{"m-deaf", 50 * time.Millisecond, protocol.OutcomeTimeout, "", "no answer"},
		{"m-wrapctx", 50 * time.Millisecond, protocol.OutcomeTimeout, "", "no answer"},
		{"m-unenc", 0, protocol.OutcomeModelError, "", "not JSON-encodable"},
		{"m-absent", 0, protocol.OutcomeModelError, "", "not hosted"},
	}
	sent, sentHdr := map[string]string{}, map[string]nats.Header{}
	for _, c := range cases {
		id := "c-" + c.model
		m := h.dispatch(id, c.model, dispatchOpts{timeout: c.timeout, payload: `{"x":1}`})
		sent[id] = string(m.Data)
		sentHdr[id] = m.Header
	}
	got := h.collect(len(cases), 20*time.Second)
	for _, c := range cases {
		id := "c-" + c.model
		o := got[id]
		if o.Status != c.status {
			t.Errorf("%s: status %q (error %q), want %q", c.model, o.Status, o.Error, c.status)
			continue
		}
		if o.Node != "n1" || o.Model != c.model || o.Attempt != 1 || o.Type != "t" || o.TaskID != id {
			t.Errorf("%s: outcome identity %+v", c.model, o.Outcome)
		}
		if c.status == protocol.OutcomeSuccess {
			if string(o.Output) != c.output {
				t.Errorf("%s: output %s, want %s", c.model, o.Output, c.output)
			}
			if o.Task != nil {
				t.Errorf("%s: success carries the task bytes", c.model)
			}
		} else {
			if !strings.Contains(o.Error, c.errHas) {
				t.Errorf("%s: error %q does not contain %q", c.model, o.Error, c.errHas)
			}
			if string(o.Task) != sent[id] {
				t.Errorf("%s: outcome task %s, want the dispatch body %s", c.model, o.Task, sent[id])
			}
		}
		if c.status == protocol.OutcomeTimeout && o.LatencyMs < 50 {
			t.Errorf("%s: latency %.1fms is below the 50ms timeout", c.model, o.LatencyMs)
		}
		// Every dispatch header is echoed; the message id is the outcome's.
		want, _ := protocol.ParseDispatch(sentHdr[id])
		if echoed, err := protocol.ParseDispatch(o.Header); err != nil || !reflect.DeepEqual(echoed, want) {
			t.Errorf("%s: outcome headers %+v (%v), want the dispatch's %+v", c.model, echoed, err, want)
		}
		if got, want := o.Header.Get(protocol.HdrMsgID), "o:"+id+":1"; got != want {
			t.Errorf("%s: Nats-Msg-Id %q, want %q", c.model, got, want)
		}
	}
}

func TestMalformedDispatchIsReported(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "n-bad")
	var calls atomic.Int32
	h.start(h.config(), WithHandler("count", func(context.Context, Task) (any, error) { calls.Add(1); return nil, nil }),
		WithModels([]ModelSpec{goModel("m", "count")}))
	cases := map[string]map[string]string{
		"bad-attempt":  {protocol.HdrAttempt: "one"},
		"bad-deadline": {protocol.HdrDeadline: "tomorrow"},
		"no-deadline":  {protocol.HdrDeadline: ""},
		"bad-timeout":  {protocol.HdrTimeout: "-5"},
		"no-model":     {protocol.HdrModel: ""},
		"id-mismatch":  {protocol.HdrTaskID: "other"},
	}
	for id, hdr := range cases {
		h.dispatch(id, "m", dispatchOpts{headers: hdr})
	}
	// A body that is not even JSON is reported too, its bytes kept as a string.
	raw := h.dispatch("raw", "m", dispatchOpts{attempt: 2})
	raw.Data = []byte("\xffnot json")
	raw.Header.Set(protocol.HdrMsgID, "raw-body-2")
	raw.Header.Set(protocol.HdrTaskID, "raw2")
	if _, err := h.srv.JS.PublishMsg(context.Background(), raw); err != nil {
		t.Fatal(err)
	}
	got := h.collect(len(cases)+2, 10*time.Second)
	if o := got["raw"]; o.Status != protocol.OutcomeSuccess {
		t.Errorf("raw: the well-formed dispatch: %q %q", o.Status, o.Error)
	}
	if o := got["raw2"]; o.Status != protocol.OutcomeModelError || !strings.Contains(o.Error, "body is not a task") ||
		string(o.Task) != `"\ufffdnot json"` || o.Attempt != 2 || o.Header.Get(protocol.HdrMsgID) != "o:raw2:2" {
		t.Errorf("raw2: %+v %v", o.Outcome, o.Header)
	}
	for id := range cases {
		key := id
		if id == "id-mismatch" {
			key = "other"
		}
		o, ok := got[key]
		if !ok {
			t.Errorf("%s: no outcome (got %v)", id, got)
			continue
		}
		if o.Status != protocol.OutcomeModelError || !strings.Contains(o.Error, "malformed dispatch") {
			t.Errorf("%s: %q %q, want a malformed dispatch model error", id, o.Status, o.Error)
		}
	}
	if n := calls.Load(); n != 1 { // the well-formed "raw" only
		t.Errorf("the handler ran %d times, want once (malformed dispatches never run)", n)
	}
}

// A restarted node must not work off a stale backlog.
func TestStaleBacklogExpires(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "n-stale")
	for i := range 5 {
		h.dispatch(fmt.Sprintf("old-%d", i), "m", dispatchOpts{deadline: time.Now().Add(-time.Second)})
	}
	h.dispatch("fresh", "m", dispatchOpts{})
	var ran sync.Map
	h.start(h.config(), WithHandler("rec", func(_ context.Context, t Task) (any, error) { ran.Store(t.ID, true); return "done", nil }),
		WithModels([]ModelSpec{goModel("m", "rec")}))
	got := h.collect(6, 10*time.Second)
	for i := range 5 {
		id := fmt.Sprintf("old-%d", i)
		if got[id].Status != protocol.OutcomeExpired {
			t.Errorf("%s: status %q, want expired", id, got[id].Status)
		}
		if _, ok := ran.Load(id); ok {
			t.Errorf("%s: the handler ran a dispatch past its deadline", id)
		}
		if len(got[id].Task) == 0 {
			t.Errorf("%s: expired outcome lacks the task bytes", id)
		}
	}
	if got["fresh"].Status != protocol.OutcomeSuccess {
		t.Errorf("fresh: %q, want success", got["fresh"].Status)
	}
}

// A dispatch whose deadline leaves less than the model's mean run on the
// node is not started: it would more likely be cut at the deadline (a
// timeout charged to the model for time spent queued) than finish. It is
// reported expired, which costs the model nothing; with time enough the
// same model runs.
func TestDispatchTooCloseToItsDeadlineIsNotStarted(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "n-close")
	var ran sync.Map
	h.start(h.config(), WithHandler("slow", func(ctx context.Context, t Task) (any, error) {
		ran.Store(t.ID, true)
		select { // the model's work: 200 ms
		case <-time.After(200 * time.Millisecond):
			return "done", nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}), WithModels([]ModelSpec{goModel("m", "slow")}))
	h.dispatch("first", "m", dispatchOpts{})
	if o := h.next(10 * time.Second); o.Status != protocol.OutcomeSuccess {
		t.Fatalf("first: %q, want success", o.Status)
	}
	h.dispatch("close", "m", dispatchOpts{deadline: time.Now().Add(100 * time.Millisecond)})
	o := h.next(10 * time.Second)
	if o.TaskID != "close" || o.Status != protocol.OutcomeExpired || !strings.Contains(o.Error, "less than the model's mean run") {
		t.Fatalf("close: %+v, want expired, not started", o.Outcome)
	}
	if _, ok := ran.Load("close"); ok {
		t.Fatal("the handler ran a dispatch that could not finish before its deadline")
	}
	h.dispatch("roomy", "m", dispatchOpts{deadline: time.Now().Add(time.Minute)})
	if o := h.next(10 * time.Second); o.TaskID != "roomy" || o.Status != protocol.OutcomeSuccess {
		t.Fatalf("roomy: %+v, want success", o.Outcome)
	}
}

func TestHeartbeatAndDraining(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "n-hb")
	kv, err := h.srv.JS.KeyValue(context.Background(), topology.BucketNodes)
	if err != nil {
		t.Fatal(err)
	}
	watch, err := kv.Watch(context.Background(), "n-hb")
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Stop()
	cfg := h.config()
	cfg.Concurrency = 3
	sim := ModelSpec{Name: "sim-a", Types: []string{"t", "u"}, Executor: "sim"}
	sim.Timeout = 2_000_000_000
	// A task held in flight through the shutdown keeps the node draining
	// (not yet deleted) until the watch has seen it: the bucket keeps one
	// value per key, so a draining entry deleted at once could be replaced
	// before a watcher is delivered it (1 run in 20 under load).
	gate := make(chan struct{})
	var running atomic.Int32
	cfg.ShutdownGrace = time.Minute // the gate, not the grace, ends the task
	r := h.start(cfg, WithHandler("gated", func(ctx context.Context, _ Task) (any, error) {
		running.Add(1)
		select {
		case <-gate:
			return "finished", nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}), WithModels([]ModelSpec{goModel("echo-m", "gated"), sim}))
	var release sync.Once
	open := func() { release.Do(func() { close(gate) }) }
	t.Cleanup(open) // before the worker's cleanup, should the test fail early

	var first protocol.Heartbeat
	waitFor(t, 20*time.Second, "a heartbeat", func() bool {
		e, err := kv.Get(context.Background(), "n-hb")
		return err == nil && json.Unmarshal(e.Value(), &first) == nil
	})
	if first.Node != "n-hb" || first.Capacity != 3 || first.Draining || len(first.Models) != 2 {
		t.Fatalf("heartbeat %+v", first)
	}
	if m := first.Models[1]; m.Name != "sim-a" || strings.Join(m.Types, ",") != "t,u" || m.TimeoutMs != 2000 {
		t.Errorf("model info %+v", m)
	}
	if first.StartedAt.IsZero() || first.SentAt.Before(first.StartedAt) {
		t.Errorf("times: started %v sent %v", first.StartedAt, first.SentAt)
	}
	// Its host name next to its id (issue 40: a container's, for an
	// operator to tell 56-character keys apart).
	if host, _ := os.Hostname(); first.Host != host || first.HostName() != host || host == "" {
		t.Errorf("heartbeat host %q (shown as %q), want this machine's %q", first.Host, first.HostName(), host)
	}
	// Heartbeats keep coming.
	waitFor(t, 20*time.Second, "a later heartbeat", func() bool {
		e, err := kv.Get(context.Background(), "n-hb")
		var hb protocol.Heartbeat
		return err == nil && json.Unmarshal(e.Value(), &hb) == nil && hb.SentAt.After(first.SentAt)
	})
	h.dispatch("in-flight", "echo-m", dispatchOpts{})
	waitFor(t, 20*time.Second, "the task running", func() bool { return running.Load() == 1 })
	r.stop()
	// The watch sees draining announced, then, once the task finished, the
	// key deleted.
	sawDraining, deleted := false, false
	timeout := time.After(30 * time.Second)
	for !deleted {
		select {
		case e := <-watch.Updates():
			if e == nil {
				continue
			}
			if e.Operation() != jetstream.KeyValuePut {
				if !sawDraining {
					t.Fatal("key deleted before draining was announced")
				}
				deleted = true
				continue
			}
			var hb protocol.Heartbeat
			if err := json.Unmarshal(e.Value(), &hb); err != nil {
				t.Fatal(err)
			}
			if hb.Draining && !sawDraining {
				sawDraining = true
				select {
				case err := <-r.done:
					t.Fatalf("Run returned (%v) with a task in flight", err)
				default:
				}
				open()
			}
		case <-timeout:
			t.Fatalf("draining=%v deleted=%v after shutdown", sawDraining, deleted)
		}
	}
	if err := r.Stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if o := h.next(20 * time.Second); o.TaskID != "in-flight" || o.Status != protocol.OutcomeSuccess {
		t.Fatalf("the task in flight at shutdown: %+v", o.Outcome)
	}
}

func TestBoundedConcurrency(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "n-conc")
	const n, total = 3, 12
	var cur, peak atomic.Int32
	gate := make(chan struct{})
	cfg := h.config()
	cfg.Concurrency, cfg.Prefetch = n, 4
	h.start(cfg, WithHandler("gated", func(ctx context.Context, _ Task) (any, error) {
		c := cur.Add(1)
		defer cur.Add(-1)
		for {
			p := peak.Load()
			if c <= p || peak.CompareAndSwap(p, c) {
				break
			}
		}
		select {
		case <-gate:
			return "ok", nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}), WithModels([]ModelSpec{goModel("m", "gated")}))
	for i := range total {
		h.dispatch(fmt.Sprintf("c%d", i), "m", dispatchOpts{})
	}
	// n run, Prefetch wait in the worker for a slot, the rest wait on the
	// server.
	cons, err := h.srv.JS.Consumer(context.Background(), topology.StreamDispatch, topology.NodeConsumer("n-conc"))
	if err != nil {
		t.Fatal(err)
	}
	if c := cons.CachedInfo().Config; c.MaxAckPending != n+cfg.Prefetch || c.AckWait != cfg.AckWait || c.MaxDeliver != -1 ||
		c.FilterSubject != topology.DispatchSubject("n-conc") || c.AckPolicy != jetstream.AckExplicitPolicy {
		t.Errorf("consumer config %+v", c)
	}
	waitFor(t, 10*time.Second, "n running, Prefetch waiting and the rest pending", func() bool {
		info, err := cons.Info(context.Background())
		return err == nil && cur.Load() == n && info.NumAckPending == n+cfg.Prefetch && info.NumPending == uint64(total-n-cfg.Prefetch) &&
			h.heartbeat().Queued == total-n && h.heartbeat().Prefetch == cfg.Prefetch
	})
	close(gate)
	got := h.collect(total, 20*time.Second)
	for id, o := range got {
		if o.Status != protocol.OutcomeSuccess {
			t.Errorf("%s: %q", id, o.Status)
		}
	}
	if p := peak.Load(); p != n {
		t.Errorf("peak concurrency %d, want %d", p, n)
	}
}

func TestGracefulShutdownFinishesInFlight(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "n-grace")
	var cur atomic.Int32
	gate := make(chan struct{})
	r := h.start(h.config(), WithHandler("gated", func(ctx context.Context, _ Task) (any, error) {
		cur.Add(1)
		<-gate
		return "finished", nil
	}), WithModels([]ModelSpec{goModel("m", "gated")}))
	h.dispatch("g1", "m", dispatchOpts{})
	h.dispatch("g2", "m", dispatchOpts{})
	waitFor(t, 10*time.Second, "two running", func() bool { return cur.Load() == 2 })
	stopped := make(chan error, 1)
	go func() { stopped <- r.Stop(t) }()
	waitFor(t, 20*time.Second, "draining", func() bool { return r.w.draining.Load() })
	select {
	case err := <-stopped:
		t.Fatalf("Run returned (%v) with tasks in flight", err)
	default:
	}
	close(gate)
	if err := <-stopped; err != nil {
		t.Fatalf("Run: %v", err)
	}
	got := h.collect(2, 5*time.Second)
	for _, id := range []string{"g1", "g2"} {
		if got[id].Status != protocol.OutcomeSuccess || string(got[id].Output) != `"finished"` {
			t.Errorf("%s: %+v", id, got[id].Outcome)
		}
	}
	// The acks are sent before Run returns; the server removes the acked
	// dispatches from the work-queue stream when it processes them.
	waitFor(t, 5*time.Second, "no dispatch left un-acked after a graceful shutdown", func() bool {
		s, err := h.srv.JS.Stream(context.Background(), topology.StreamDispatch)
		if err != nil {
			t.Fatal(err)
		}
		return s.CachedInfo().State.Msgs == 0
	})
}

func TestShutdownGraceNaksUnfinished(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "n-nak")
	hang := make(chan struct{})
	t.Cleanup(func() { close(hang) })
	var cur atomic.Int32
	cfg := h.config()
	cfg.ShutdownGrace = 100 * time.Millisecond
	r := h.start(cfg, WithHandler("stuck", func(context.Context, Task) (any, error) { cur.Add(1); <-hang; return nil, nil }),
		WithModels([]ModelSpec{goModel("m", "stuck")}))
	h.dispatch("s1", "m", dispatchOpts{})
	waitFor(t, 10*time.Second, "running", func() bool { return cur.Load() == 1 })
	if err := r.Stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n := h.pendingOutcomes(); n != 0 {
		t.Fatalf("%d outcomes reported for an unfinished task", n)
	}
	// The dispatch was nak'ed, not lost: a restarted node runs it.
	h.start(h.config(), WithModels([]ModelSpec{goModel("m", "echo")}))
	o := h.next(10 * time.Second)
	if o.TaskID != "s1" || o.Status != protocol.OutcomeSuccess {
		t.Fatalf("after restart: %+v", o.Outcome)
	}
}

// The node's consumer is deleted under it (as InactiveThreshold or an
// operator would); the worker recreates it and keeps processing.
func TestConsumerDeletedIsRecreated(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "n-del")
	h.start(h.config(), WithModels([]ModelSpec{goModel("m", "echo")}))
	h.dispatch("before", "m", dispatchOpts{payload: `1`})
	if o := h.next(10 * time.Second); o.TaskID != "before" || o.Status != protocol.OutcomeSuccess {
		t.Fatalf("before: %+v", o.Outcome)
	}
	if err := h.srv.JS.DeleteConsumer(context.Background(), topology.StreamDispatch, topology.NodeConsumer("n-del")); err != nil {
		t.Fatal(err)
	}
	h.dispatch("after", "m", dispatchOpts{payload: `2`})
	o := h.next(30 * time.Second)
	if o.TaskID != "after" || o.Status != protocol.OutcomeSuccess || string(o.Output) != "2" {
		t.Fatalf("after: %+v", o.Outcome)
	}
}

func TestIncompatibleStreamStopsTheWorker(t *testing.T) {
	t.Parallel()
	srv := newHarness(t, "n-inc").srv
	ctx := context.Background()
	if err := srv.JS.DeleteStream(ctx, topology.StreamOutcomes); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.JS.CreateStream(ctx, jetstream.StreamConfig{Name: topology.StreamOutcomes, Subjects: []string{"mlsched.outcomes.>"}}); err != nil {
		t.Fatal(err) // limits retention: not what mlsched needs
	}
	w, err := New(Config{NATS: natsconn.Config{URL: srv.URL}, NodeID: "n-inc"}, WithLogger(zerolog.Nop()), WithModels([]ModelSpec{goModel("m", "noop")}))
	if err != nil {
		t.Fatal(err)
	}
	err = w.Run(ctx)
	if !errors.Is(err, topology.ErrIncompatible) || !strings.Contains(err.Error(), topology.StreamOutcomes) {
		t.Fatalf("Run: %v, want ErrIncompatible naming %s", err, topology.StreamOutcomes)
	}
}

// Outcomes are never lost: when the outcome stream is gone the dispatch is
// nak'ed, and once the stream is back the outcome arrives. The task runs
// once: its redelivered dispatch is reported again from the kept outcome,
// not run again (issue 39: a task may not run more than its attempts).
func TestOutcomePublishFailureRedelivers(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "n-pub")
	var runs atomic.Int32
	cfg := h.config()
	cfg.PublishTimeout = 500 * time.Millisecond
	r := h.start(cfg, WithHandler("count", func(context.Context, Task) (any, error) { runs.Add(1); return "ok", nil }),
		WithModels([]ModelSpec{goModel("m", "count")}))
	ctx := context.Background()
	if err := h.srv.JS.DeleteStream(ctx, topology.StreamOutcomes); err != nil {
		t.Fatal(err)
	}
	h.dispatch("p1", "m", dispatchOpts{})
	waitFor(t, 15*time.Second, "two redeliveries reported again", func() bool { return r.w.unstored.again.Load() >= 2 })
	if n := runs.Load(); n != 1 {
		t.Fatalf("the task ran %d times, want once: a redelivered dispatch whose outcome is kept is not run again", n)
	}
	if err := topology.Ensure(ctx, h.srv.JS, topology.Config{}); err != nil {
		t.Fatal(err)
	}
	oc, err := h.srv.JS.CreateOrUpdateConsumer(ctx, topology.StreamOutcomes, jetstream.ConsumerConfig{
		Durable: "test-dispatcher", FilterSubject: topology.OutcomeSubject("n-pub"), AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	h.outc = oc
	if o := h.next(15 * time.Second); o.TaskID != "p1" || o.Status != protocol.OutcomeSuccess {
		t.Fatalf("%+v", o.Outcome)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the task ran %d times, want once", n)
	}
}

// Every log line about a task names the task, the model and the node.
func TestTaskLogLinesCarryIDs(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "n-log")
	var buf logtest.Buffer
	// Also covers a worker on a caller-owned connection.
	h.start(h.config(), WithConn(h.srv.NC), WithLogger(zerolog.New(&buf)), WithModels([]ModelSpec{goModel("m", "echo")}))
	h.dispatch("l1", "m", dispatchOpts{})
	h.next(10 * time.Second)
	found := false
	for _, line := range buf.Lines() {
		var e map[string]any
		if json.Unmarshal(line, &e) != nil || e["task_id"] == nil {
			continue
		}
		found = true
		if e["task_id"] != "l1" || e["model"] != "m" || e["node"] != "n-log" {
			t.Errorf("task log line lacks ids: %s", line)
		}
	}
	if !found {
		t.Fatal("no task log line")
	}
}

// A task longer than the ack wait is kept by in-progress signals, not
// redelivered.
func TestLongTaskIsNotRedelivered(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "n-long")
	var calls atomic.Int32
	cfg := h.config()
	// Progress is signalled every AckWait/3: this leaves a signal 1s to be
	// late on a busy machine (load 30, -race) before the server redelivers;
	// 400ms was tight. The dispatch's own timeout is far beyond the work.
	cfg.AckWait = 1500 * time.Millisecond
	h.start(cfg, WithHandler("long", func(ctx context.Context, _ Task) (any, error) {
		calls.Add(1)
		select { // the work itself: three ack waits long
		case <-time.After(4500 * time.Millisecond):
			return "done", nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}), WithModels([]ModelSpec{goModel("m", "long")}))
	h.dispatch("long-1", "m", dispatchOpts{timeout: 30 * time.Second})
	if o := h.next(30 * time.Second); o.Status != protocol.OutcomeSuccess {
		t.Fatalf("%+v", o.Outcome)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("the task ran %d times", n)
	}
	cons, err := h.srv.JS.Consumer(context.Background(), topology.StreamDispatch, topology.NodeConsumer("n-long"))
	if err != nil {
		t.Fatal(err)
	}
	if info := cons.CachedInfo(); info.NumRedelivered != 0 {
		t.Fatalf("%d redeliveries", info.NumRedelivered)
	}
}

func TestNewRejectsBadConfiguration(t *testing.T) {
	t.Parallel()
	ok := []ModelSpec{goModel("m", "echo")}
	cases := []struct {
		name string
		cfg  Config
		opts []Option
		want string
	}{
		{"node id", Config{NodeID: "a b"}, []Option{WithModels(ok)}, "MLSCHED_NODE_ID"},
		{"heartbeat vs ttl", Config{NodeID: "n", HeartbeatInterval: 20 * time.Second}, []Option{WithModels(ok)}, "MLSCHED_HEARTBEAT_INTERVAL"},
		{"no models", Config{NodeID: "n"}, []Option{WithModels(nil)}, "no models"},
		{"unknown handler", Config{NodeID: "n"}, []Option{WithModels([]ModelSpec{goModel("m", "gone")})}, `"gone" is not registered`},
		{"models file", Config{NodeID: "n", ModelsFile: "/nonexistent.yaml"}, nil, "/nonexistent.yaml"},
		{"prefetch", Config{NodeID: "n", Prefetch: -1}, []Option{WithModels(ok)}, "MLSCHED_PREFETCH"},
	}
	for _, c := range cases {
		_, err := New(c.cfg, append(c.opts, WithLogger(zerolog.Nop()))...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error containing %q", c.name, err, c.want)
		}
	}
	w, err := New(Config{}, WithLogger(zerolog.Nop()), WithModels(ok))
	if err != nil {
		t.Fatal(err)
	}
	if w.Node() == "" || protocol.ValidToken(w.Node(), 64) != nil {
		t.Errorf("default node id %q", w.Node())
	}
	if w.cfg.Prefetch != 32 {
		t.Errorf("a code-built Config's prefetch %d, want the default 32", w.cfg.Prefetch)
	}
}

// A variable set to 0 means 0, not the default: MLSCHED_PREFETCH=0 is
// arrival order, and MLSCHED_SHUTDOWN_GRACE=0 no grace.
func TestLoadConfigKeepsZeros(t *testing.T) {
	t.Setenv("MLSCHED_PREFETCH", "0")
	t.Setenv("MLSCHED_SHUTDOWN_GRACE", "0s")
	t.Setenv("MLSCHED_NODE_ID", "n")
	cfg, err := LoadConfig()
	if err != nil {
		t.Fatal(err)
	}
	w, err := New(cfg, WithLogger(zerolog.Nop()), WithModels([]ModelSpec{goModel("m", "echo")}))
	if err != nil {
		t.Fatal(err)
	}
	if w.cfg.Prefetch != 0 || w.cfg.ShutdownGrace != 0 || w.cfg.Concurrency != 8 {
		t.Errorf("loaded prefetch %d, grace %v, concurrency %d; want 0, 0 and the default 8",
			w.cfg.Prefetch, w.cfg.ShutdownGrace, w.cfg.Concurrency)
	}
}

// A node whose load moves announces it without waiting for its interval
// (here an hour): its in-flight count as a task starts and as it ends, so
// the dispatchers' load model does not see a drained node as busy for a
// whole interval.
func TestHeartbeatFollowsLoad(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "n-load")
	kv, err := h.srv.JS.KeyValue(context.Background(), topology.BucketNodes)
	if err != nil {
		t.Fatal(err)
	}
	cfg := h.config()
	cfg.HeartbeatInterval, cfg.NodeTTL = time.Hour, 2*time.Hour
	gate := make(chan struct{})
	var release sync.Once
	open := func() { release.Do(func() { close(gate) }) }
	t.Cleanup(open)
	h.start(cfg, WithHandler("gated", func(ctx context.Context, _ Task) (any, error) {
		select {
		case <-gate:
			return "finished", nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}), WithModels([]ModelSpec{goModel("echo-m", "gated")}))
	inFlight := func(want int) func() bool {
		return func() bool {
			e, err := kv.Get(context.Background(), "n-load")
			var hb protocol.Heartbeat
			return err == nil && json.Unmarshal(e.Value(), &hb) == nil && hb.InFlight == want
		}
	}
	waitFor(t, 20*time.Second, "the first heartbeat", inFlight(0))
	h.dispatch("load-1", "echo-m", dispatchOpts{})
	waitFor(t, 20*time.Second, "a heartbeat with the task in flight", inFlight(1))
	open()
	waitFor(t, 20*time.Second, "a heartbeat with the node idle again", inFlight(0))
}

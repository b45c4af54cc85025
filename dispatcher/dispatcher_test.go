package dispatcher_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/dispatcher"
	"github.com/mlsched/mlsched/shared/natstest"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// env is one isolated cluster: an embedded NATS server and a dispatcher with
// in-memory statistics. Nodes are scripted test nodes (see node below) so that
// each test controls exactly how attempts end.
type env struct {
	t   *testing.T
	ns  *natstest.Server
	d   *dispatcher.Dispatcher
	ctx context.Context

	// queued is the queue the next started node announces from its first
	// heartbeat on.
	queued int64
	// prefetch is what the nodes started next announce as their ordered
	// room beyond capacity (Heartbeat.Prefetch).
	prefetch int
	// compactNodes: the nodes started next read compact dispatches.
	compactNodes bool
	// costs are what the models of the nodes started next declare, per
	// task and per unit of size (by model name).
	costs map[string][2]float64

	mu        sync.Mutex
	published map[string]int // result messages seen per task id
	seenSeq   uint64         // the last results-stream sequence counted
}

func testConfig(url string) dispatcher.Config {
	c := dispatcher.DefaultConfig()
	c.NATS.URL = url
	c.Name = "test"
	c.SnapshotInterval = 50 * time.Millisecond
	c.NoNodeWait = 1500 * time.Millisecond
	c.TaskTimeout = 2 * time.Second
	c.DeadlineSlack = 500 * time.Millisecond
	c.SweepInterval = 100 * time.Millisecond
	c.RetryBackoff = 10 * time.Millisecond
	c.RetryBackoffMax = 50 * time.Millisecond
	c.MaxPayloadBytes = 64 << 10
	c.HTTPAddr = "127.0.0.1:0" // never the default port
	return c
}

func newEnv(t *testing.T, mutate ...func(*dispatcher.Config)) *env {
	t.Helper()
	return newEnvOn(t, natstest.New(t), mutate...)
}

// newEnvOn is newEnv on a server the test started.
func newEnvOn(t *testing.T, ns *natstest.Server, mutate ...func(*dispatcher.Config)) *env {
	t.Helper()
	cfg := testConfig(ns.URL)
	for _, m := range mutate {
		m(&cfg)
	}
	d, ctx := runDispatcher(t, cfg)
	e := &env{t: t, ns: ns, d: d, ctx: ctx, published: map[string]int{}}
	e.waitFor("streams", func() bool {
		_, err := ns.JS.Stream(ctx, topology.StreamResults)
		return err == nil
	})
	// Count results as JetStream stores them. (A core subscriber would also
	// see a duplicate that the stream refuses; consumers read the stream.)
	oc, err := ns.JS.OrderedConsumer(ctx, topology.StreamResults, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := oc.Consume(func(m jetstream.Msg) {
		e.mu.Lock()
		e.published[strings.TrimPrefix(m.Subject(), "mlsched.results.")]++
		if md, err := m.Metadata(); err == nil {
			e.seenSeq = md.Sequence.Stream
		}
		e.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cc.Stop)
	return e
}

// runDispatcher runs a dispatcher until the test ends, and checks that it
// stops cleanly; ctx ends when it is told to stop.
func runDispatcher(t *testing.T, cfg dispatcher.Config, opts ...dispatcher.Option) (*dispatcher.Dispatcher, context.Context) {
	t.Helper()
	d, err := dispatcher.New(cfg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("dispatcher Run: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Errorf("dispatcher did not stop")
		}
	})
	return d, ctx
}

func (e *env) waitFor(what string, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// publish puts raw bytes on a task subject with an optional Nats-Msg-Id.
func (e *env) publish(subject string, data []byte, msgID string) {
	e.t.Helper()
	m := &nats.Msg{Subject: subject, Data: data, Header: nats.Header{}}
	if msgID != "" {
		m.Header.Set(protocol.HdrMsgID, msgID)
	}
	if _, err := e.ns.JS.PublishMsg(e.ctx, m); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) submit(t protocol.Task) {
	e.t.Helper()
	data, _ := json.Marshal(t)
	e.publish(topology.TaskSubject(t.Type), data, t.ID)
}

// result waits for the task's final result.
func (e *env) result(id string) protocol.Result {
	e.t.Helper()
	s, err := e.ns.JS.Stream(e.ctx, topology.StreamResults)
	if err != nil {
		e.t.Fatal(err)
	}
	var res protocol.Result
	e.waitFor("result of "+id, func() bool {
		m, err := s.GetLastMsgForSubject(e.ctx, topology.ResultSubject(id))
		if err != nil {
			return false
		}
		if err := json.Unmarshal(m.Data, &res); err != nil {
			e.t.Fatal(err)
		}
		return true
	})
	return res
}

// streamState reads a stream's current state.
func (e *env) streamState(name string) jetstream.StreamState {
	e.t.Helper()
	s, err := e.ns.JS.Stream(e.ctx, name)
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := s.Info(e.ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	return info.State
}

// resultCount counts every result message published for id since the env
// started (the stream keeps only the last per subject, so count on the wire).
// The count is read only once the counting consumer has caught up with all
// the stream has stored by now: a result stored just before the call is
// counted, not still on its way to the consumer.
func (e *env) resultCount(id string) int {
	e.t.Helper()
	last := e.streamState(topology.StreamResults).LastSeq
	e.waitFor("the result counter to catch up", func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.seenSeq >= last
	})
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.published[id]
}

// deadLetters returns the DLQ entries.
func (e *env) deadLetters() []protocol.DeadLetter {
	s, err := e.ns.JS.Stream(e.ctx, topology.StreamDLQ)
	if err != nil {
		e.t.Fatal(err)
	}
	info, _ := s.Info(e.ctx)
	var out []protocol.DeadLetter
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(e.ctx, seq)
		if err != nil {
			continue
		}
		var dl protocol.DeadLetter
		if err := json.Unmarshal(m.Data, &dl); err != nil {
			e.t.Fatal(err)
		}
		out = append(out, dl)
	}
	return out
}

// behavior decides how a scripted node ends an attempt.
type behavior func(task protocol.Task, attempt int) (protocol.OutcomeStatus, string)

func succeed(protocol.Task, int) (protocol.OutcomeStatus, string) { return protocol.OutcomeSuccess, "" }
func fail(protocol.Task, int) (protocol.OutcomeStatus, string) {
	return protocol.OutcomeModelError, "model exploded"
}

// node is a scripted worker node: it heartbeats, consumes its dispatch
// subject, and reports what its behaviors say, like a real worker.
type node struct {
	id      string
	models  map[string]behavior
	silent  atomic.Bool  // consume but never answer (a hung node)
	gone    atomic.Bool  // heartbeats stopped (leave)
	leave   func()       // stop heartbeating and delete the node's entry
	restart func()       // announce a new process (a new StartedAt), as a worker killed and started again
	queued  atomic.Int64 // the queue its heartbeat announces
	beat    func()       // announce now
	mu      sync.Mutex
	seen    []string // "task/attempt/model"
	headers []nats.Header
	acks    []string // each dispatch's ack subject
	// output, when set, is a success's output (default {"by":model}).
	output func(task protocol.Task, model string) json.RawMessage
}

func (e *env) startNode(id string, types []string, models map[string]behavior) *node {
	e.t.Helper()
	n := &node{id: id, models: models}
	n.queued.Store(e.queued) // known with the node's first heartbeat
	kv, err := topology.EnsureNodesBucket(e.ctx, e.ns.JS, topology.Config{})
	if err != nil {
		e.t.Fatal(err)
	}
	hb := protocol.Heartbeat{Node: id, Capacity: 8, Prefetch: e.prefetch, StartedAt: time.Now(), CompactDispatch: e.compactNodes}
	for name := range models {
		c := e.costs[name]
		hb.Models = append(hb.Models, protocol.ModelInfo{Name: name, Types: types, TimeoutMs: 1000, CostPerTask: c[0], CostPerUnit: c[1]})
	}
	var beatMu sync.Mutex // the ticker and a test may beat at once
	beat := func() {
		beatMu.Lock()
		defer beatMu.Unlock()
		if n.gone.Load() {
			return
		}
		hb.SentAt = time.Now()
		hb.Queued = int(n.queued.Load())
		data, _ := json.Marshal(hb)
		_, _ = kv.Put(e.ctx, id, data)
	}
	beat()
	n.beat = beat
	n.restart = func() {
		beatMu.Lock()
		hb.StartedAt = time.Now()
		beatMu.Unlock()
		beat()
	}
	n.leave = func() {
		beatMu.Lock()
		defer beatMu.Unlock()
		n.gone.Store(true)
		if err := kv.Delete(e.ctx, id); err != nil {
			e.t.Errorf("node %s leaving: %v", id, err)
		}
	}
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-e.ctx.Done():
				return
			case <-t.C:
				beat()
			}
		}
	}()
	s, err := e.ns.JS.Stream(e.ctx, topology.StreamDispatch)
	if err != nil {
		e.t.Fatal(err)
	}
	c, err := topology.EnsureConsumer(e.ctx, s, jetstream.ConsumerConfig{Durable: topology.NodeConsumer(id),
		FilterSubject: topology.DispatchSubject(id), AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: -1})
	if err != nil {
		e.t.Fatal(err)
	}
	cc, err := c.Consume(func(m jetstream.Msg) {
		h := m.Headers()
		pd, err := protocol.ParseDispatch(h)
		if err != nil {
			e.t.Errorf("node %s got an invalid dispatch: %v", id, err)
		}
		attempt, model := pd.Attempt, pd.Model
		var task protocol.Task
		_ = json.Unmarshal(m.Data(), &task)
		n.mu.Lock()
		n.seen = append(n.seen, fmt.Sprintf("%s/%d/%s", task.ID, attempt, model))
		n.headers = append(n.headers, h)
		n.acks = append(n.acks, m.Reply())
		n.mu.Unlock()
		if n.silent.Load() {
			return
		}
		status, errText := n.models[model](task, attempt)
		o := protocol.Outcome{TaskID: task.ID, Type: task.Type, Attempt: attempt, Model: model, Node: id,
			Status: status, Error: errText, LatencyMs: 1, BatchWaitMs: 0.5, DeadlineLeftMs: 2}
		if status == protocol.OutcomeSuccess {
			o.Output = json.RawMessage(`{"by":"` + model + `"}`)
			n.mu.Lock()
			out := n.output
			n.mu.Unlock()
			if out != nil {
				o.Output = out(task, model)
			}
		} else {
			o.Task = m.Data()
		}
		data, _ := json.Marshal(o)
		out := &nats.Msg{Subject: topology.OutcomeSubject(id), Data: data, Header: protocol.OutcomeHeader(h, id)}
		if _, err := e.ns.JS.PublishMsg(e.ctx, out, jetstream.WithMsgID(pd.MsgID("o"))); err == nil {
			_ = m.Ack()
		}
	})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(cc.Stop)
	return n
}

func (n *node) attempts() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.seen...)
}

func TestDispatchRunsTaskAndPublishesOneResult(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	n := e.startNode("n1", []string{"echo"}, map[string]behavior{"m1": succeed})
	e.submit(protocol.Task{ID: "t1", Type: "echo", Payload: json.RawMessage(`{"x":1}`)})
	res := e.result("t1")
	if res.Status != protocol.StatusSucceeded || res.Model != "m1" || res.Node != "n1" || res.Attempts != 1 {
		t.Fatalf("result = %+v", res)
	}
	if string(res.Output) != `{"by":"m1"}` || len(res.History) != 1 || res.History[0].Status != protocol.OutcomeSuccess {
		t.Fatalf("result output/history = %s %+v", res.Output, res.History)
	}
	// where the attempt's time went on the node, as its outcome said
	if a := res.History[0]; a.LatencyMs != 1 || a.BatchWaitMs != 0.5 || a.DeadlineLeftMs != 2 {
		t.Errorf("history entry %+v, want the outcome's latency 1, batch wait 0.5 and deadline left 2 ms", a)
	}
	// the dispatch carries the task bytes unchanged and the headers of protocol v1
	n.mu.Lock()
	h := n.headers[0]
	n.mu.Unlock()
	pd, err := protocol.ParseDispatch(h)
	if err != nil || pd.TaskID != "t1" || pd.Type != "echo" || pd.Model != "m1" || pd.Node != "n1" || pd.Attempt != 1 ||
		pd.MaxAttempts != 3 || pd.Timeout != time.Second || pd.Submitted.IsZero() || pd.Submission == "" ||
		time.Until(pd.Deadline) > time.Second+500*time.Millisecond {
		t.Errorf("dispatch %+v, %v", pd, err)
	}
	// a re-published task (same Nats-Msg-Id) is deduplicated: still one result, one attempt
	e.submit(protocol.Task{ID: "t1", Type: "echo", Payload: json.RawMessage(`{"x":1}`)})
	e.submit(protocol.Task{ID: "t2", Type: "echo"})
	e.result("t2")
	if c := e.resultCount("t1"); c != 1 {
		t.Fatalf("t1 has %d results", c)
	}
	if got := n.attempts(); len(got) != 2 {
		t.Fatalf("node saw %v, want t1 and t2 once each", got)
	}
}

func TestFailoverToAnotherModelAndHistory(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.startNode("n1", []string{"clf"}, map[string]behavior{"bad": fail})
	e.startNode("n2", []string{"clf"}, map[string]behavior{"good": succeed})
	// Allow-list order does not matter; the first choice may be either model.
	for i := 0; i < 10; i++ {
		e.submit(protocol.Task{ID: fmt.Sprintf("f%d", i), Type: "clf"})
	}
	for i := 0; i < 10; i++ {
		res := e.result(fmt.Sprintf("f%d", i))
		if res.Status != protocol.StatusSucceeded || res.Model != "good" {
			t.Fatalf("result = %+v", res)
		}
		if res.Attempts != len(res.History) {
			t.Fatalf("attempts %d but history %+v", res.Attempts, res.History)
		}
		if res.Attempts == 2 && (res.History[0].Model != "bad" || res.History[0].Status != protocol.OutcomeModelError) {
			t.Fatalf("history = %+v", res.History)
		}
	}
}

func TestTaskErrorIsNotRetried(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	n := e.startNode("n1", []string{"ocr"}, map[string]behavior{"m": func(protocol.Task, int) (protocol.OutcomeStatus, string) {
		return protocol.OutcomeTaskError, "image is not a PNG"
	}})
	e.submit(protocol.Task{ID: "te", Type: "ocr"})
	res := e.result("te")
	if res.Status != protocol.StatusFailed || res.ErrorCode != protocol.CodeTaskError || res.Attempts != 1 || res.Error != "image is not a PNG" {
		t.Fatalf("result = %+v", res)
	}
	if got := n.attempts(); len(got) != 1 {
		t.Fatalf("attempts = %v", got)
	}
}

func TestExhaustedAttemptsFailAndDeadLetter(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.startNode("n1", []string{"x"}, map[string]behavior{"a": fail, "b": fail})
	e.submit(protocol.Task{ID: "ex", Type: "x", MaxAttempts: 3})
	res := e.result("ex")
	if res.Status != protocol.StatusFailed || res.ErrorCode != protocol.CodeAttemptsExhausted || res.Attempts != 3 || len(res.History) != 3 {
		t.Fatalf("result = %+v", res)
	}
	e.waitFor("dead letter", func() bool {
		for _, dl := range e.deadLetters() {
			if dl.TaskID == "ex" && dl.Code == protocol.CodeAttemptsExhausted && len(dl.History) == 3 && len(dl.Original) > 0 {
				return true
			}
		}
		return false
	})
}

func TestLostAttemptIsDetectedAtDeadlineAndFailedOver(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	hung := e.startNode("hung", []string{"y"}, map[string]behavior{"h": succeed})
	hung.silent.Store(true)
	e.submit(protocol.Task{ID: "lost1", Type: "y", TimeoutMs: 200})
	e.waitFor("dispatch to the hung node", func() bool { return len(hung.attempts()) == 1 })
	e.startNode("ok", []string{"y"}, map[string]behavior{"g": succeed})
	res := e.result("lost1")
	if res.Status != protocol.StatusSucceeded || res.Model != "g" || res.Attempts != 2 {
		t.Fatalf("result = %+v", res)
	}
	if res.History[0].Status != protocol.OutcomeLost || res.History[0].Node != "hung" {
		t.Fatalf("history = %+v", res.History)
	}
	if n := e.d.Counters().Lost.Load(); n != 1 {
		t.Fatalf("lost counter = %d, want 1 (once per lost attempt, not per delivery of its outcome)", n)
	}
}

func TestBadInputIsRejectedOrDeadLettered(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.startNode("n1", []string{"echo"}, map[string]behavior{"m1": succeed})
	big := make([]byte, 70<<10)
	for i := range big {
		big[i] = 'a'
	}
	cases := []struct {
		name    string
		subject string
		data    string
		id      string // "" = unkeyable: expect a dead letter
		code    protocol.Code
	}{
		{"malformed json", "mlsched.tasks.echo", `{"id":`, "", protocol.CodeMalformedJSON},
		{"not an object", "mlsched.tasks.echo", `[1,2]`, "", protocol.CodeNotObject},
		{"missing id", "mlsched.tasks.echo", `{"type":"echo"}`, "", protocol.CodeMissingID},
		{"missing type", "mlsched.tasks.echo", `{"id":"b-notype"}`, "b-notype", protocol.CodeMissingType},
		{"type mismatch", "mlsched.tasks.echo", `{"id":"b-mismatch","type":"other"}`, "b-mismatch", protocol.CodeTypeMismatch},
		{"oversized", "mlsched.tasks.echo", `{"id":"b-big","type":"echo","payload":"` + string(big) + `"}`, "b-big", protocol.CodePayloadTooLarge},
		{"unknown type", "mlsched.tasks.nobody", `{"id":"b-unserved","type":"nobody"}`, "b-unserved", protocol.CodeNoModel},
		{"unknown allow-listed model", "mlsched.tasks.echo", `{"id":"b-unknown","type":"echo","models":["ghost"]}`, "b-unknown", protocol.CodeUnknownModel},
		{"negative timeout", "mlsched.tasks.echo", `{"id":"b-timeout","type":"echo","timeout_ms":-5}`, "b-timeout", protocol.CodeInvalidTimeout},
		{"wildcard id", "mlsched.tasks.echo", `{"id":"a*b","type":"echo"}`, "", protocol.CodeInvalidID},
		{"whitespace id", "mlsched.tasks.echo", `{"id":"a b","type":"echo"}`, "", protocol.CodeInvalidID},
		{"invalid utf-8", "mlsched.tasks.echo", "{\"id\":\"b-utf8\",\"type\":\"echo\",\"payload\":\"\xff\xfe\"}", "b-utf8", protocol.CodeInvalidUTF8},
		{"10k allow-list", "mlsched.tasks.echo", `{"id":"b-models","type":"echo","models":[` + strings.Repeat(`"m",`, 9999) + `"m"]}`, "b-models", protocol.CodeTooManyModels},
		{"binary", "mlsched.tasks.echo", "\x00\x01binary", "", protocol.CodeMalformedJSON},
		// issue 40: an id readable before the break gets a result (of the
		// type sent), which the producer can read; a numeric id cannot.
		{"truncated after the id", "mlsched.tasks.echo", `{"id":"b-truncated","type":"echo","payload":`, "b-truncated", protocol.CodeMalformedJSON},
		{"wrong field type", "mlsched.tasks.echo", `{"id":"b-field","type":"echo","timeout_ms":"5s"}`, "b-field", protocol.CodeInvalidField},
		{"numeric id", "mlsched.tasks.echo", `{"id":42,"type":"echo","payload":{}}`, "", protocol.CodeInvalidID},
	}
	for i, c := range cases {
		e.publish(c.subject, []byte(c.data), fmt.Sprintf("bad-%d", i))
	}
	e.submit(protocol.Task{ID: "good-after-bad", Type: "echo"})
	if res := e.result("good-after-bad"); res.Status != protocol.StatusSucceeded {
		t.Fatalf("a good task after bad ones: %+v", res)
	}
	for _, c := range cases {
		if c.id == "" {
			continue
		}
		res := e.result(c.id)
		if res.Status != protocol.StatusRejected || res.ErrorCode != c.code || res.Error == "" {
			t.Errorf("%s: result = %+v, want rejected with %s", c.name, res, c.code)
		}
		var sent struct{ Type string }
		if json.Unmarshal([]byte(c.data), &sent) != nil {
			sent.Type = "echo" // not JSON: the type the bytes begin with
		}
		if res.Type != sent.Type {
			t.Errorf("%s: result type = %q, want %q (the task's)", c.name, res.Type, sent.Type)
		}
		if strings.HasPrefix(res.Error, string(c.code)) { // the code has its own field
			t.Errorf("%s: error %q repeats its code", c.name, res.Error)
		}
	}
	e.waitFor("dead letters of unkeyable messages", func() bool {
		got := map[protocol.Code]int{}
		for _, dl := range e.deadLetters() {
			if strings.HasPrefix(dl.Reason, string(dl.Code)+":") {
				t.Errorf("dead letter reason %q repeats its code", dl.Reason)
			}
			got[dl.Code]++
		}
		for _, c := range cases {
			if c.id == "" && got[c.code] == 0 {
				return false
			}
		}
		return true
	})
	res := e.result("b-unserved")
	if want := `"nobody"`; !strings.Contains(res.Error, want) {
		t.Errorf("no-model error %q does not name the type %s", res.Error, want)
	}
	if res := e.result("b-unknown"); !strings.Contains(res.Error, "ghost") {
		t.Errorf("unknown-model error %q does not name the model", res.Error)
	}
}

// A hung node that answers after its attempt was declared lost: the late
// outcome counts in the statistics but does not change the final result.
func TestLateOutcomeOfSupersededAttemptIsNotFinal(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	hung := e.startNode("hung", []string{"z"}, map[string]behavior{"h": succeed})
	hung.silent.Store(true)
	e.submit(protocol.Task{ID: "late1", Type: "z", TimeoutMs: 200})
	e.waitFor("dispatch to the hung node", func() bool { return len(hung.attempts()) == 1 })
	e.startNode("ok", []string{"z"}, map[string]behavior{"g": func(protocol.Task, int) (protocol.OutcomeStatus, string) {
		return protocol.OutcomeModelError, "g failed"
	}})
	// attempt 2 on g fails, attempt 3 may go anywhere; wait for the final result
	res := e.result("late1")
	if res.History[0].Status != protocol.OutcomeLost {
		t.Fatalf("history = %+v", res.History)
	}
	// now the hung node wakes up and reports attempt 1 as a success
	hung.mu.Lock()
	h := hung.headers[0]
	hung.mu.Unlock()
	o := protocol.Outcome{TaskID: "late1", Type: "z", Attempt: 1, Model: "h", Node: "hung", Status: protocol.OutcomeSuccess,
		Output: json.RawMessage(`"late"`), LatencyMs: 5000}
	data, _ := json.Marshal(o)
	m := &nats.Msg{Subject: topology.OutcomeSubject("hung"), Data: data, Header: protocol.OutcomeHeader(h, "hung")}
	if _, err := e.ns.JS.PublishMsg(e.ctx, m); err != nil {
		t.Fatal(err)
	}
	e.waitFor("late outcome counted", func() bool { return e.d.Counters().Late.Load() == 1 })
	if got := e.result("late1"); got.Status != res.Status || string(got.Output) != string(res.Output) || got.Attempts != res.Attempts {
		t.Fatalf("final result changed: %+v → %+v", res, got)
	}
	if c := e.resultCount("late1"); c != 1 {
		t.Fatalf("late1 has %d stored results", c)
	}
}

// A task replayed from the dead-letter stream right away (inside the
// duplicate window) runs again and gets its new result: the message ids of
// its dispatches, outcomes and dead letters name the submission, not only
// the task id.
func TestReplayInsideTheDuplicateWindowGetsANewResult(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var healthy atomic.Bool
	e.startNode("n1", []string{"rp"}, map[string]behavior{"a": func(protocol.Task, int) (protocol.OutcomeStatus, string) {
		if healthy.Load() {
			return protocol.OutcomeSuccess, ""
		}
		return protocol.OutcomeModelError, "down"
	}})
	id := "job:1#replay"
	e.submit(protocol.Task{ID: id, Type: "rp", MaxAttempts: 2})
	if res := e.result(id); res.Status != protocol.StatusFailed || res.ErrorCode != protocol.CodeAttemptsExhausted {
		t.Fatalf("first run: %+v", res)
	}
	var original []byte
	e.waitFor("dead letter", func() bool {
		for _, dl := range e.deadLetters() {
			if dl.TaskID == id {
				original = dl.Original
				return true
			}
		}
		return false
	})

	// what `mlsched dlq replay` does: purge the result, resubmit the bytes
	healthy.Store(true)
	s, err := e.ns.JS.Stream(e.ctx, topology.StreamResults)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Purge(e.ctx, jetstream.WithPurgeSubject(topology.ResultSubject(id))); err != nil {
		t.Fatal(err)
	}
	e.publish(topology.TaskSubject("rp"), original, id+":replay:1")
	var res protocol.Result
	e.waitFor("the replayed task's result", func() bool {
		m, err := s.GetLastMsgForSubject(e.ctx, topology.ResultSubject(id))
		if err != nil {
			return false
		}
		return json.Unmarshal(m.Data, &res) == nil
	})
	if res.Status != protocol.StatusSucceeded || res.Attempts != 1 {
		t.Fatalf("replayed: %+v", res)
	}
}

// A task that already has a result (here: published before it ran, as a
// racing attempt's success would be) is not dead-lettered when a later
// attempt exhausts: its failure is not the task's result.
func TestExhaustedAttemptOfAFinishedTaskIsNotDeadLettered(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.startNode("n1", []string{"dl"}, map[string]behavior{"a": fail})
	done, _ := json.Marshal(protocol.Result{ID: "pre1", Type: "dl", Status: protocol.StatusSucceeded})
	if _, err := e.ns.JS.Publish(e.ctx, topology.ResultSubject("pre1"), done); err != nil {
		t.Fatal(err)
	}
	e.submit(protocol.Task{ID: "pre1", Type: "dl", MaxAttempts: 1})
	e.submit(protocol.Task{ID: "pre2", Type: "dl", MaxAttempts: 1})
	outcomes, err := e.ns.JS.Stream(e.ctx, topology.StreamOutcomes)
	if err != nil {
		t.Fatal(err)
	}
	e.waitFor("both outcomes settled and pre2 dead-lettered", func() bool {
		info, err := outcomes.Info(e.ctx)
		if err != nil || info.State.Msgs != 0 || e.d.Counters().Suppressed.Load() < 1 {
			return false
		}
		for _, dl := range e.deadLetters() {
			if dl.TaskID == "pre2" {
				return true
			}
		}
		return false
	})
	for _, dl := range e.deadLetters() {
		if dl.TaskID == "pre1" {
			t.Fatalf("pre1 already succeeded but was dead-lettered: %+v", dl)
		}
	}
	if res := e.result("pre1"); res.Status != protocol.StatusSucceeded {
		t.Fatalf("pre1's result changed: %+v", res)
	}
}

// Dispatch headers the dispatcher did not build are never acted on and never
// dropped: an outcome echoing them, and a stored dispatch carrying them that
// outlives its slack, are dead-lettered with code invalid_dispatch.
func TestInvalidDispatchHeadersAreDeadLettered(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.waitFor("streams", func() bool { _, err := e.ns.JS.Stream(e.ctx, topology.StreamDLQ); return err == nil })
	o, _ := json.Marshal(protocol.Outcome{TaskID: "inv1", Type: "x", Attempt: 1, Model: "m", Node: "n",
		Status: protocol.OutcomeSuccess})
	pd := protocol.Dispatch{TaskID: "inv1", Type: "x", Model: "m", Node: "n", Attempt: 1, MaxAttempts: 1,
		Deadline: time.Now().Add(time.Minute)}
	h := pd.Header()
	h.Set(protocol.HdrAttempt, "first")
	if _, err := e.ns.JS.PublishMsg(e.ctx, &nats.Msg{Subject: topology.OutcomeSubject("n"), Data: o, Header: h}); err != nil {
		t.Fatal(err)
	}
	// A dispatch without headers, to a node that never takes it.
	if _, err := e.ns.JS.Publish(e.ctx, topology.DispatchSubject("ghost"), []byte(`{"id":"inv2","type":"x"}`)); err != nil {
		t.Fatal(err)
	}
	var got []protocol.DeadLetter
	e.waitFor("both dead-lettered", func() bool {
		got = e.deadLetters()
		return len(got) == 2
	})
	for _, dl := range got {
		if dl.Code != protocol.CodeInvalidDispatch {
			t.Errorf("dead letter %+v, want code invalid_dispatch", dl)
		}
		switch {
		case strings.HasPrefix(dl.Subject, "mlsched.outcomes."):
			if !strings.Contains(dl.Reason, protocol.HdrAttempt) || string(dl.Original) != string(o) {
				t.Errorf("outcome dead letter %+v", dl)
			}
		case dl.Subject == topology.DispatchSubject("ghost"):
			if !strings.Contains(dl.Reason, protocol.HdrTaskID) {
				t.Errorf("dispatch dead letter %+v", dl)
			}
		default:
			t.Errorf("unexpected dead letter %+v", dl)
		}
	}
	if c := e.resultCount("inv1"); c != 0 {
		t.Errorf("an outcome with invalid headers produced %d results", c)
	}
}

package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/shared/client"
	"github.com/mlsched/mlsched/shared/natsconn"
	"github.com/mlsched/mlsched/shared/natstest"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// setup starts a NATS server with the protocol v1 streams (memory storage).
func setup(t *testing.T) (*natstest.Server, *client.Client) {
	t.Helper()
	srv := natstest.New(t)
	tc := topology.Config{Storage: jetstream.MemoryStorage}
	if err := topology.Ensure(ctx(t), srv.JS, tc); err != nil {
		t.Fatal(err)
	}
	return srv, client.New(srv.JS, client.WithTopology(tc))
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond) // poll interval, not synchronisation
	}
}

func publishResult(t *testing.T, js jetstream.JetStream, r protocol.Result) {
	t.Helper()
	data, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx(t), topology.ResultSubject(r.ID), data); err != nil {
		t.Fatal(err)
	}
}

// consumers reports how many consumers the results stream has, to know that
// a Wait has subscribed before publishing behind its back.
func consumers(t *testing.T, js jetstream.JetStream) int {
	s, err := js.Stream(ctx(t), topology.StreamResults)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Consumers
}

func TestSubmitPublishesExactBytesWithMsgID(t *testing.T) {
	t.Parallel()
	srv, c := setup(t)
	task := protocol.Task{ID: "t-1", Type: "classify", Payload: json.RawMessage(`{"text":"hello"}`),
		Models: []string{"m1", "m2"}, TimeoutMs: 500, MaxAttempts: 3}
	ack, err := c.Submit(ctx(t), task)
	if err != nil {
		t.Fatal(err)
	}
	if ack.Duplicate || ack.Seq != 1 {
		t.Fatalf("ack = %+v, want seq 1 not duplicate", ack)
	}
	s, err := srv.JS.Stream(ctx(t), topology.StreamTasks)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetMsg(ctx(t), ack.Seq)
	if err != nil {
		t.Fatal(err)
	}
	if m.Subject != "mlsched.tasks.classify" {
		t.Errorf("subject = %q", m.Subject)
	}
	if got := m.Header.Get(protocol.HdrMsgID); got != "t-1" {
		t.Errorf("Nats-Msg-Id = %q, want t-1", got)
	}
	want, _ := json.Marshal(task)
	if string(m.Data) != string(want) {
		t.Errorf("data = %s, want %s", m.Data, want)
	}
	back, err := protocol.DecodeTask(m.Data, protocol.Limits{})
	if err != nil {
		t.Fatalf("the dispatcher would reject what Submit sent: %v", err)
	}
	if back.ID != task.ID || back.TimeoutMs != 500 || len(back.Models) != 2 {
		t.Errorf("decoded %+v", back)
	}

	dup, err := c.Submit(ctx(t), task)
	if err != nil {
		t.Fatal(err)
	}
	if !dup.Duplicate || dup.Seq != ack.Seq {
		t.Fatalf("re-submit ack = %+v, want duplicate of seq %d", dup, ack.Seq)
	}
	info, err := s.Info(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 {
		t.Fatalf("stream holds %d tasks, want 1", info.State.Msgs)
	}
}

func TestSubmitValidatesLocally(t *testing.T) {
	t.Parallel()
	srv, _ := setup(t)
	c := client.New(srv.JS, client.WithLimits(protocol.Limits{MaxPayloadBytes: 256}))
	ok := protocol.Task{ID: "ok", Type: "echo"}
	cases := []struct {
		name string
		edit func(*protocol.Task)
		code protocol.Code
	}{
		{"missing id", func(t *protocol.Task) { t.ID = "" }, protocol.CodeMissingID},
		{"wildcard id", func(t *protocol.Task) { t.ID = "a.>" }, protocol.CodeInvalidID},
		{"missing type", func(t *protocol.Task) { t.Type = "" }, protocol.CodeMissingType},
		{"type with dot", func(t *protocol.Task) { t.Type = "a.b" }, protocol.CodeInvalidType},
		{"negative timeout", func(t *protocol.Task) { t.TimeoutMs = -1 }, protocol.CodeInvalidTimeout},
		{"too many attempts", func(t *protocol.Task) { t.MaxAttempts = 1000 }, protocol.CodeInvalidMaxAttempts},
		{"bad model name", func(t *protocol.Task) { t.Models = []string{"ok", "no way"} }, protocol.CodeUnknownModel},
		{"payload not JSON", func(t *protocol.Task) { t.Payload = json.RawMessage(`{oops`) }, protocol.CodeMalformedJSON},
		{"too large", func(t *protocol.Task) {
			t.Payload = json.RawMessage(`"` + strings.Repeat("x", 300) + `"`)
		}, protocol.CodePayloadTooLarge},
	}
	for _, tc := range cases {
		task := ok
		tc.edit(&task)
		before := task.ID
		_, err := c.Submit(ctx(t), task)
		var pe *protocol.Error
		if !errors.As(err, &pe) || pe.Code != tc.code {
			t.Errorf("%s: err = %v, want code %s", tc.name, err, tc.code)
		}
		if task.ID != before {
			t.Errorf("%s: Submit changed the caller's task", tc.name)
		}
	}
	s, _ := srv.JS.Stream(ctx(t), topology.StreamTasks)
	info, err := s.Info(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 0 {
		t.Fatalf("%d invalid tasks were published", info.State.Msgs)
	}
}

func TestSubmitCreatesMissingStreams(t *testing.T) {
	t.Parallel()
	srv := natstest.New(t) // no topology.Ensure
	c := client.New(srv.JS, client.WithTopology(topology.Config{Storage: jetstream.MemoryStorage}))
	ack, err := c.Submit(ctx(t), protocol.Task{ID: "first", Type: "echo"})
	if err != nil {
		t.Fatal(err)
	}
	if ack.Seq != 1 {
		t.Fatalf("ack = %+v", ack)
	}
	s, err := srv.JS.Stream(ctx(t), topology.StreamTasks)
	if err != nil {
		t.Fatal(err)
	}
	if s.CachedInfo().Config.Storage != jetstream.MemoryStorage {
		t.Errorf("streams were not created with the configured topology")
	}
}

func TestSubmitRawSendsBytesUnvalidated(t *testing.T) {
	t.Parallel()
	srv, c := setup(t)
	raw := []byte("not json at all \xff")
	ack, err := c.SubmitRaw(ctx(t), "echo", raw, "")
	if err != nil {
		t.Fatal(err)
	}
	s, _ := srv.JS.Stream(ctx(t), topology.StreamTasks)
	m, err := s.GetMsg(ctx(t), ack.Seq)
	if err != nil {
		t.Fatal(err)
	}
	if string(m.Data) != string(raw) || m.Header.Get(protocol.HdrMsgID) != "" {
		t.Fatalf("got %q headers %v", m.Data, m.Header)
	}
	if _, err := c.SubmitRaw(ctx(t), "bad.type", raw, "x"); protocol.CodeOf(err) != protocol.CodeInvalidType {
		t.Fatalf("bad type: err = %v", err)
	}
	a1, err := c.SubmitRaw(ctx(t), "echo", []byte(`{}`), "dup")
	if err != nil {
		t.Fatal(err)
	}
	a2, err := c.SubmitRaw(ctx(t), "echo", []byte(`{}`), "dup")
	if err != nil {
		t.Fatal(err)
	}
	if a1.Duplicate || !a2.Duplicate {
		t.Fatalf("acks %+v %+v: want only the second duplicate", a1, a2)
	}
}

func TestResult(t *testing.T) {
	t.Parallel()
	srv, c := setup(t)
	if _, err := c.Result(ctx(t), "r1"); !errors.Is(err, client.ErrNoResult) {
		t.Fatalf("before publishing: err = %v, want ErrNoResult", err)
	}
	publishResult(t, srv.JS, protocol.Result{ID: "r1", Type: "echo", Status: protocol.StatusSucceeded,
		Model: "m1", Attempts: 1, Output: json.RawMessage(`{"y":1}`)})
	r, err := c.Result(ctx(t), "r1")
	if err != nil {
		t.Fatal(err)
	}
	if r.ID != "r1" || r.Status != protocol.StatusSucceeded || r.Model != "m1" || string(r.Output) != `{"y":1}` {
		t.Fatalf("result = %+v", r)
	}
	if _, err := c.Result(ctx(t), "a*"); protocol.CodeOf(err) != protocol.CodeInvalidID {
		t.Fatalf("wildcard id: err = %v", err)
	}
	if _, err := srv.JS.Publish(ctx(t), topology.ResultSubject("junk"), []byte("{not json")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Result(ctx(t), "junk"); !errors.Is(err, client.ErrBadResult) {
		t.Fatalf("malformed result: err = %v, want ErrBadResult", err)
	}
}

func TestWaitResultAlreadyPublished(t *testing.T) {
	t.Parallel()
	srv, c := setup(t)
	publishResult(t, srv.JS, protocol.Result{ID: "done", Status: protocol.StatusFailed, ErrorCode: protocol.CodeAttemptsExhausted})
	r, err := c.Wait(ctx(t), "done")
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != protocol.StatusFailed || r.ErrorCode != protocol.CodeAttemptsExhausted {
		t.Fatalf("result = %+v", r)
	}
}

func TestWaitResultPublishedLater(t *testing.T) {
	t.Parallel()
	srv, c := setup(t)
	publishResult(t, srv.JS, protocol.Result{ID: "other", Status: protocol.StatusSucceeded})
	got := make(chan *protocol.Result, 1)
	errc := make(chan error, 1)
	go func() {
		r, err := c.Wait(context.Background(), "later")
		got <- r
		errc <- err
	}()
	eventually(t, "Wait to subscribe", func() bool { return consumers(t, srv.JS) == 1 })
	publishResult(t, srv.JS, protocol.Result{ID: "later", Status: protocol.StatusRejected, ErrorCode: protocol.CodeNoModel})
	select {
	case r := <-got:
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		if r.ID != "later" || r.Status != protocol.StatusRejected {
			t.Fatalf("result = %+v", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return after the result was published")
	}
}

func TestWaitContextCancelled(t *testing.T) {
	t.Parallel()
	_, c := setup(t)
	cx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := c.Wait(cx, "never")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want deadline exceeded", err)
	}
}

func TestWaitAllMany(t *testing.T) {
	t.Parallel()
	srv, c := setup(t)
	const n = 1000
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("task-%04d", i)
	}
	// Half the results exist before WaitAll, half arrive during it, and
	// results of other tasks are interleaved.
	for i := 0; i < n/2; i++ {
		publishResult(t, srv.JS, protocol.Result{ID: ids[i], Status: protocol.StatusSucceeded})
		publishResult(t, srv.JS, protocol.Result{ID: fmt.Sprintf("stranger-%d", i), Status: protocol.StatusFailed})
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		eventually(t, "WaitAll to subscribe", func() bool { return consumers(t, srv.JS) == 1 })
		for i := n / 2; i < n; i++ {
			publishResult(t, srv.JS, protocol.Result{ID: ids[i], Status: protocol.StatusSucceeded})
		}
	}()
	seen := map[string]int{}
	err := c.WaitAll(ctx(t), append(ids, ids[:10]...), func(r *protocol.Result) { seen[r.ID]++ })
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != n {
		t.Fatalf("saw %d results, want %d", len(seen), n)
	}
	for id, k := range seen {
		if k != 1 || !strings.HasPrefix(id, "task-") {
			t.Fatalf("result %s reported %d times", id, k)
		}
	}
}

func TestWaitAllFewUsesFilterAndCancels(t *testing.T) {
	t.Parallel()
	srv, c := setup(t)
	publishResult(t, srv.JS, protocol.Result{ID: "a", Status: protocol.StatusSucceeded})
	publishResult(t, srv.JS, protocol.Result{ID: "b", Status: protocol.StatusFailed})
	cx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var got []string
	err := c.WaitAll(cx, []string{"a", "b", "missing"}, func(r *protocol.Result) {
		got = append(got, r.ID)
		if len(got) == 2 {
			cancel() // "missing" never comes
		}
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want canceled", err)
	}
	if len(got) != 2 {
		t.Fatalf("got %v, want a and b", got)
	}
	if err := c.WaitAll(ctx(t), nil, func(*protocol.Result) { t.Error("called for no ids") }); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitAll(ctx(t), []string{"ok", "bad id"}, func(*protocol.Result) {}); protocol.CodeOf(err) != protocol.CodeInvalidID {
		t.Fatalf("invalid id: err = %v", err)
	}
}

func TestDialSubmitsWithProducerInbox(t *testing.T) {
	srv := natstest.New(t)
	c, err := client.Dial(natsconn.Config{URL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ack, err := c.Submit(ctx(t), protocol.Task{ID: "dial-1", Type: "t"})
	if err != nil || ack.Seq == 0 {
		t.Fatalf("Submit = %+v, %v", ack, err)
	}
	if _, err := client.Dial(natsconn.Config{URL: srv.URL, User: "u"}); err == nil {
		t.Fatal("Dial accepted a user without a password file")
	}
}

// Dial reads MLSCHED_NATS_* for what the Config leaves empty, as the
// binaries do (issue 22: Dial(natsconn.Config{}) ignored MLSCHED_NATS_URL
// and dialled 127.0.0.1:4222); a field set in code wins.
func TestDialReadsTheEnvironment(t *testing.T) {
	srv := natstest.New(t)
	t.Setenv("MLSCHED_NATS_URL", srv.URL)
	c, err := client.Dial(natsconn.Config{})
	if err != nil {
		t.Fatalf("Dial(Config{}) with MLSCHED_NATS_URL=%s: %v", srv.URL, err)
	}
	defer c.Close()
	if ack, err := c.Submit(ctx(t), protocol.Task{ID: "env-1", Type: "t"}); err != nil || ack.Seq == 0 {
		t.Fatalf("Submit = %+v, %v", ack, err)
	}
	t.Setenv("MLSCHED_NATS_URL", "nats://127.0.0.1:1")
	c2, err := client.Dial(natsconn.Config{URL: srv.URL})
	if err != nil {
		t.Fatalf("a URL set in code lost to the environment: %v", err)
	}
	c2.Close()
}

package dispatcher

import (
	"context"
	"encoding/json"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/dispatcher/internal/admission"
	"github.com/mlsched/mlsched/dispatcher/internal/finish"
	"github.com/mlsched/mlsched/dispatcher/internal/intake"
	"github.com/mlsched/mlsched/dispatcher/internal/outcome"
	"github.com/mlsched/mlsched/dispatcher/internal/policy"
	"github.com/mlsched/mlsched/dispatcher/internal/registry"
	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/shared/jsplumb"
	"github.com/mlsched/mlsched/shared/natstest"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
	"github.com/mlsched/mlsched/shared/tracing"
)

// Each stage alone, built from its params on a real NATS server with the
// real topology: what it publishes is stored, and the message it handled
// is settled through the Completer.

// stageEnv is the server, the topology, the publishers, the Completer and a
// stream "IN" whose messages stand for the consumed ones a stage settles.
type stageEnv struct {
	t        *testing.T
	ctx      context.Context
	ns       *natstest.Server
	cfg      Config
	pub      *jsplumb.Publisher
	complete *jsplumb.Completer
	counters *Counters
	metrics  *metrics
	tracer   *tracing.Tracer
	in       jetstream.Consumer
	seq      atomic.Int64
}

func newStageEnv(t *testing.T) *stageEnv {
	t.Helper()
	ctx := context.Background()
	ns := natstest.New(t)
	cfg := DefaultConfig()
	cfg.RetryBackoff = 0 // a retry goes back to intake at once
	if err := topology.Ensure(ctx, ns.JS, cfg.Topology()); err != nil {
		t.Fatal(err)
	}
	st, err := ns.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "IN", Subjects: []string{"in.>"}})
	if err != nil {
		t.Fatal(err)
	}
	in, err := st.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	pub := jsplumb.NewPublisher(ns.NC, jsplumb.PublisherConfig{Timeout: 10 * time.Second})
	if err := pub.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Stop() })
	tracer, err := tracing.New(tracing.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return &stageEnv{t: t, ctx: ctx, ns: ns, cfg: cfg, pub: pub, complete: &jsplumb.Completer{NakDelay: time.Second},
		counters: &Counters{}, metrics: newMetrics(&Dispatcher{}), tracer: tracer, in: in}
}

// consumed is a message of IN, delivered and not yet settled.
func (e *stageEnv) consumed() jetstream.Msg {
	e.t.Helper()
	subj := "in." + strconv.FormatInt(e.seq.Add(1), 10)
	if _, err := e.ns.JS.Publish(e.ctx, subj, nil); err != nil {
		e.t.Fatal(err)
	}
	b, err := e.in.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		e.t.Fatal(err)
	}
	for m := range b.Messages() {
		return m
	}
	e.t.Fatal("nothing fetched")
	return nil
}

// allSettled waits until every message of IN is acked.
func (e *stageEnv) allSettled() {
	e.t.Helper()
	e.waitFor("every consumed message acked", func() bool {
		info, err := e.in.Info(e.ctx)
		return err == nil && info.NumAckPending == 0 && info.NumPending == 0
	})
}

func (e *stageEnv) waitFor(what string, cond func() bool) {
	e.t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond) // polling, not synchronisation
	}
}

// stored counts the messages of stream on subject.
func (e *stageEnv) stored(stream, subject string) uint64 {
	e.t.Helper()
	s, err := e.ns.JS.Stream(e.ctx, stream)
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := s.Info(e.ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		e.t.Fatal(err)
	}
	return info.State.Subjects[subject]
}

func (e *stageEnv) finisher() *finish.Finisher {
	e.t.Helper()
	results, err := e.ns.JS.Stream(e.ctx, topology.StreamResults)
	if err != nil {
		e.t.Fatal(err)
	}
	dlq := &finish.DeadLetters{JS: e.ns.JS, Log: zerolog.Nop(), Count: &e.counters.DeadLettered}
	return finish.New(finish.Params{Log: zerolog.Nop(), ResPub: e.pub, Complete: e.complete, DLQ: dlq,
		ResultsStream: results, Counts: &e.counters.Counts, Metrics: e.metrics, Tracer: e.tracer})
}

// The finisher stores one result per task (a second is refused and
// counted), the failed result and dead letter of an exhausted task, and a
// dead letter for what is no task, and acks each message once stored.
func TestFinisherStage(t *testing.T) {
	t.Parallel()
	e := newStageEnv(t)
	fin := e.finisher()
	res := func(id string) *protocol.Result {
		return &protocol.Result{ID: id, Type: "t", Status: protocol.StatusSucceeded, Model: "m", Node: "n1", Attempts: 1}
	}
	fin.End(finish.Ending{Msg: e.consumed(), Result: res("a")})
	e.waitFor("a's result", func() bool { return e.counters.Results.Load() == 1 })
	fin.End(finish.Ending{Msg: e.consumed(), Result: res("a")}) // a redelivery: refused
	fin.End(finish.Ending{Msg: e.consumed(), Subject: topology.TaskSubject("t"), Data: []byte(`{"id":"b","type":"t"}`),
		Task: protocol.Task{ID: "b", Type: "t"}, Status: protocol.StatusFailed, Attempts: 3, Submission: "9",
		Err: protocol.Errorf(protocol.CodeAttemptsExhausted, "3 attempts failed")})
	fin.End(finish.Ending{Msg: e.consumed(), Subject: "mlsched.tasks.t", Data: []byte("junk"), Status: protocol.StatusRejected,
		Err: protocol.Errorf(protocol.CodeMalformedJSON, "not JSON")})
	e.allSettled()
	e.complete.Wait()
	if got := e.counters.Suppressed.Load(); got != 1 {
		t.Fatalf("suppressed %d, want 1", got)
	}
	if a, b := e.stored(topology.StreamResults, topology.ResultSubject("a")), e.stored(topology.StreamResults, topology.ResultSubject("b")); a != 1 || b != 1 {
		t.Fatalf("results stored: a %d, b %d", a, b)
	}
	e.waitFor("two dead letters", func() bool { return e.counters.DeadLettered.Load() == 2 })
	if x, i := e.stored(topology.StreamDLQ, topology.DLQSubject("exhausted")), e.stored(topology.StreamDLQ, topology.DLQSubject("invalid")); x != 1 || i != 1 {
		t.Fatalf("dead letters: exhausted %d, invalid %d", x, i)
	}
}

// recordingRetrier is the admission side of outcome.Retrier, for the
// outcome stage alone: it records the attempts handed back and settles
// their messages as a dispatch would.
type recordingRetrier struct {
	complete *jsplumb.Completer
	mu       sync.Mutex
	got      []finish.Spec
	wakes    atomic.Int64
}

func (r *recordingRetrier) Retry(a finish.Spec, msg jsplumb.Msg) {
	r.mu.Lock()
	r.got = append(r.got, a)
	r.mu.Unlock()
	r.complete.Settle(msg, nil)
}

func (r *recordingRetrier) Wake() { r.wakes.Add(1) }

// The outcome stage: a failed attempt goes back to intake through the
// Retrier (attempt 2, with its history and the task's bytes), a success
// becomes the task's result, and an outcome that answers no sealed
// dispatch is refused and counted.
func TestOutcomeStage(t *testing.T) {
	t.Parallel()
	e := newStageEnv(t)
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	skv, err := topology.EnsureSupersededBucket(ctx, e.ns.JS, e.cfg.Topology())
	if err != nil {
		t.Fatal(err)
	}
	sup := newSupersededSet(skv, zerolog.Nop())
	if err := sup.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer sup.Stop()
	snaps := &refresher{}
	snaps.table.Store(policy.NewTable(&stats.Snapshot{}, nil, time.Now()))
	sealer := newSealer(make([]byte, 32))
	retry := &recordingRetrier{complete: e.complete}
	oc := outcome.New(outcome.Params{Rules: e.cfg.Retry(), Limits: e.cfg.Limits(), AckWait: e.cfg.AckWait, Log: zerolog.Nop(),
		NC: e.ns.NC, Complete: e.complete, Batch: stats.NewBatcher(stats.NewMemory(e.cfg.Window()), stats.BatcherConfig{}),
		Sealer: sealer, Pipelines: pipelineSeal{s: sealer}, Superseded: sup, Retry: retry, Fin: e.finisher(),
		Counts: &e.counters.Counters, Observer: attemptObserver{metrics: e.metrics, snaps: snaps, rolls: nil},
		Expiry: (&flowRules{}).Expiry})

	task := []byte(`{"id":"r","type":"t","payload":1}`)
	dispatched := func(id string) protocol.Dispatch {
		now := time.Now()
		pd := protocol.Dispatch{TaskID: id, Type: "t", Model: "m", Node: "n1", Attempt: 1, MaxAttempts: 3,
			Deadline: now.Add(time.Minute), Timeout: 10 * time.Second, Submitted: now, Submission: "7"}
		pd.TaskSum = protocol.TaskSum(task)
		pd.Seal = sealer.Seal(&pd)
		return pd
	}
	failed := protocol.Outcome{TaskID: "r", Type: "t", Attempt: 1, Model: "m", Node: "n1",
		Status: protocol.OutcomeModelError, Error: "broke", Task: task}
	oc.Settle(e.consumed(), topology.OutcomeSubject("n1"), failed, dispatched("r"), true)
	ok := protocol.Outcome{TaskID: "s", Type: "t", Attempt: 1, Model: "m", Node: "n1",
		Status: protocol.OutcomeSuccess, Output: json.RawMessage(`"done"`)}
	oc.Settle(e.consumed(), topology.OutcomeSubject("n1"), ok, dispatched("s"), true)
	forged := dispatched("s")
	forged.Seal = "not-a-seal"
	oc.Settle(e.consumed(), topology.OutcomeSubject("n1"), ok, forged, true)
	e.allSettled()

	retry.mu.Lock()
	got := append([]finish.Spec(nil), retry.got...)
	retry.mu.Unlock()
	if len(got) != 1 || got[0].Task.ID != "r" || got[0].Attempt != 2 || len(got[0].History) != 1 ||
		got[0].History[0].Status != protocol.OutcomeModelError || string(got[0].Data) != string(task) {
		t.Fatalf("retries handed to intake: %+v", got)
	}
	if retry.wakes.Load() != 2 { // each recorded attempt freed a slot; the forged one did not
		t.Fatalf("wakes %d, want 2", retry.wakes.Load())
	}
	if n := e.stored(topology.StreamResults, topology.ResultSubject("s")); n != 1 {
		t.Fatalf("results of s: %d", n)
	}
	if e.counters.Forged.Load() != 1 {
		t.Fatalf("forged %d, want 1", e.counters.Forged.Load())
	}
}

// The intake stage: a valid task is decided, sealed and dispatched to its
// node's subject, and acked once the dispatch is stored; a task whose body
// is no task is rejected with a result.
func TestIntakeStage(t *testing.T) {
	t.Parallel()
	e := newStageEnv(t)
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	kv, err := topology.EnsureNodesBucket(ctx, e.ns.JS, e.cfg.Topology())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	hb := protocol.Heartbeat{Node: "n1", Capacity: 4, StartedAt: now, SentAt: now,
		Models: []protocol.ModelInfo{{Name: "m", Types: []string{"t"}}}}
	data, _ := json.Marshal(hb)
	if _, err := kv.Put(ctx, "n1", data); err != nil {
		t.Fatal(err)
	}
	reg := registry.New(kv, 30*time.Second, zerolog.Nop())
	go func() { _ = reg.Run(ctx) }()
	<-reg.Ready()
	engine, err := policy.NewEngine(e.cfg.PolicyConfig())
	if err != nil {
		t.Fatal(err)
	}
	snaps := &refresher{}
	snaps.table.Store(policy.NewTable(&stats.Snapshot{}, reg.Live(), time.Now()))
	skv, err := topology.EnsureSupersededBucket(ctx, e.ns.JS, e.cfg.Topology())
	if err != nil {
		t.Fatal(err)
	}
	sealer := newSealer(make([]byte, 32))
	sup := newSupersededSet(skv, zerolog.Nop())
	adm := admission.New(admission.Params{Config: e.cfg.admission(), Log: zerolog.Nop(), Engine: engine, Tables: snaps,
		Reg: reg, Pub: e.pub, Complete: e.complete, Batch: stats.NewBatcher(stats.NewMemory(e.cfg.Window()), stats.BatcherConfig{}),
		Sealer: sealer, Superseded: sup, Fin: e.finisher(), Counters: &e.counters.Tallies, Metrics: e.metrics, Tracer: e.tracer})
	in := intake.New(intake.Params{Limits: e.cfg.Limits(), MaxAttempts: e.cfg.MaxAttempts, AckWait: e.cfg.AckWait,
		Log: zerolog.Nop(), Admission: adm, Fin: e.finisher(), Complete: e.complete, Pipelines: pipelineSeal{s: sealer},
		Superseded: sup, Metrics: e.metrics, Lost: &e.counters.Lost, Parked: &e.counters.Parked})

	// The stage reads a task from MLSCHED_TASKS: consume it from there.
	cons, err := e.ns.JS.CreateOrUpdateConsumer(ctx, topology.StreamTasks, jetstream.ConsumerConfig{Durable: "stage",
		AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{`{"id":"x","type":"t","payload":"hi"}`, `{"id":"y","type":"t","payload":`} {
		if _, err := e.ns.JS.Publish(ctx, topology.TaskSubject("t"), []byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	b, err := cons.Fetch(2, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for m := range b.Messages() {
		in.HandleTask(m)
	}
	e.waitFor("both tasks settled", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending == 0 && info.NumPending == 0
	})
	s, err := e.ns.JS.Stream(ctx, topology.StreamDispatch)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(ctx, topology.DispatchSubject("n1"))
	if err != nil {
		t.Fatalf("no dispatch to n1: %v", err)
	}
	pd, err := protocol.ParseDispatch(m.Header)
	if err != nil || pd.TaskID != "x" || pd.Model != "m" || pd.Attempt != 1 || !sealer.Valid(&pd) ||
		string(m.Data) != `{"id":"x","type":"t","payload":"hi"}` {
		t.Fatalf("dispatch %+v (%v), body %s", pd, err, m.Data)
	}
	if e.counters.Dispatched.Load() != 1 {
		t.Fatalf("dispatched %d, want 1", e.counters.Dispatched.Load())
	}
	// y is no valid task but has an id: rejected with a result... or, if
	// its id cannot be read, dead-lettered. Either way it is settled and
	// kept, never dropped.
	e.waitFor("y ended", func() bool {
		return e.stored(topology.StreamResults, topology.ResultSubject("y"))+
			e.stored(topology.StreamDLQ, topology.DLQSubject("invalid")) == 1
	})
}

// Results and parked tasks go through a group commit on the streams the
// topology creates (file storage, atomic publish allowed), and straight
// through the publisher when MLSCHED_GROUP_COMMIT is off. Whether a given
// flood forms batches depends on how fast the server acknowledges, so the
// wiring is what is asserted here; the batching itself is GroupCommit's
// test (shared/jsplumb).
func TestResultsAndParkedTasksAreGroupCommitted(t *testing.T) {
	t.Parallel()
	e := newStageEnv(t)
	for _, name := range []string{topology.StreamTasks, topology.StreamResults} {
		s, err := e.ns.JS.Stream(e.ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if !e.cfg.GroupCommit {
			t.Fatal("MLSCHED_GROUP_COMMIT is off by default")
		}
		if sender, _ := groupCommit(e.cfg, e.pub, s); sender == jsplumb.Sender(e.pub) {
			t.Errorf("%s: published one by one, want a group commit", name)
		} else if _, ok := sender.(*jsplumb.GroupCommit); !ok {
			t.Errorf("%s: sender %T, want *jsplumb.GroupCommit", name, sender)
		}
		off := e.cfg
		off.GroupCommit = false
		if sender, _ := groupCommit(off, e.pub, s); sender != jsplumb.Sender(e.pub) {
			t.Errorf("%s with MLSCHED_GROUP_COMMIT=false: sender %T, want the publisher", name, sender)
		}
	}
}

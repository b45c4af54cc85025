package worker

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/shared/logtest"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// reportAnswer is how the stand-in dispatcher answers a direct report.
type reportAnswer int

const (
	answerSettled reportAnswer = iota // the dispatcher settled it
	answerDefer                       // "store it in MLSCHED_OUTCOMES"
	answerNone                        // never answers (a replica killed mid-report)
)

// reportResponder stands in for the dispatchers' queue group on the node's
// report subject (the real dispatcher's side is tested in the dispatcher
// module and end to end): it records each report's task id and answers as
// told.
type reportResponder struct {
	mu     sync.Mutex
	answer reportAnswer
	got    map[string]protocol.Outcome
	hdr    map[string]nats.Header
}

func (h *harness) respondReports(t *testing.T) *reportResponder {
	r := &reportResponder{got: map[string]protocol.Outcome{}, hdr: map[string]nats.Header{}}
	sub, err := h.srv.NC.QueueSubscribe(topology.ReportSubject(h.node), topology.QueueDispatchers, func(m *nats.Msg) {
		o, err := protocol.DecodeOutcome(m.Data)
		if err != nil {
			t.Errorf("a direct report that does not decode: %v", err)
			return
		}
		if _, err := protocol.ParseDispatch(m.Header); err != nil {
			t.Errorf("a direct report without the dispatch headers: %v", err)
		}
		r.mu.Lock()
		r.got[o.TaskID] = o
		r.hdr[o.TaskID] = m.Header
		a := r.answer
		r.mu.Unlock()
		switch a {
		case answerSettled:
			_ = m.Respond([]byte(`{"status":"settled"}`))
		case answerDefer:
			_ = m.Respond([]byte(`{"status":"deferred","reason":"store it"}`))
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := h.srv.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *reportResponder) set(a reportAnswer) { r.mu.Lock(); r.answer = a; r.mu.Unlock() }

func (r *reportResponder) saw(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.got[id]
	return ok
}

// dispatchesLeft is what the dispatch stream still holds (a work queue: a
// dispatch leaves it when the node acks it).
func (h *harness) dispatchesLeft(t *testing.T) uint64 {
	s, err := h.srv.JS.Stream(context.Background(), topology.StreamDispatch)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// A success goes to a dispatcher first and is stored only when no
// dispatcher settles it; a failure is always stored; the dispatch is acked
// only once its outcome is settled or stored.
func TestDirectReports(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "n1")
	r := h.respondReports(t)
	cfg := h.config()
	cfg.PublishTimeout = 500 * time.Millisecond // the wait for an answer that never comes
	h.start(cfg, WithHandler("ok", func(context.Context, Task) (any, error) { return "fine", nil }),
		WithHandler("bad", func(context.Context, Task) (any, error) { return nil, errors.New("model broke") }),
		WithModels([]ModelSpec{goModel("m-ok", "ok"), goModel("m-bad", "bad")}))

	// Settled by the dispatcher: acked, nothing stored.
	h.dispatch("settled", "m-ok", dispatchOpts{})
	waitFor(t, 10*time.Second, "the report and the dispatch's ack", func() bool {
		return r.saw("settled") && h.dispatchesLeft(t) == 0
	})
	if n := h.pendingOutcomes(); n != 0 {
		t.Fatalf("%d outcomes stored for a settled report", n)
	}

	// A compact dispatch is echoed compact.
	h.dispatch("compact", "m-ok", dispatchOpts{compact: true})
	waitFor(t, 10*time.Second, "the compact dispatch's report and ack", func() bool {
		return r.saw("compact") && h.dispatchesLeft(t) == 0
	})
	r.mu.Lock()
	ch := r.hdr["compact"]
	r.mu.Unlock()
	if pd, err := protocol.ParseDispatch(ch); err != nil || ch.Get(protocol.HdrDispatch) == "" || ch.Get(protocol.HdrTaskID) != "" || pd.TaskID != "compact" || pd.Node != "n1" {
		t.Fatalf("echo of a compact dispatch: %v (%v)", ch, err)
	}

	// Sent back by the dispatcher, or no answer at all: stored, then acked.
	for _, c := range []struct {
		id     string
		answer reportAnswer
	}{{"deferred", answerDefer}, {"unanswered", answerNone}} {
		r.set(c.answer)
		h.dispatch(c.id, "m-ok", dispatchOpts{})
		o := h.next(10 * time.Second)
		if o.TaskID != c.id || o.Status != protocol.OutcomeSuccess || string(o.Output) != `"fine"` {
			t.Fatalf("%s: stored outcome %+v", c.id, o.Outcome)
		}
		if !r.saw(c.id) {
			t.Fatalf("%s: stored without being reported first", c.id)
		}
		if _, err := protocol.ParseDispatch(o.Header); err != nil {
			t.Fatalf("%s: the stored outcome lost the dispatch headers: %v", c.id, err)
		}
		if got := o.Header.Get(protocol.HdrMsgID); got == "" {
			t.Fatalf("%s: the stored outcome has no message id", c.id)
		}
		waitFor(t, 10*time.Second, c.id+"'s dispatch acked", func() bool { return h.dispatchesLeft(t) == 0 })
	}

	// A failure is never reported directly: the stream's redelivery and
	// backoff are the dispatcher's tools for it.
	r.set(answerSettled)
	h.dispatch("failed", "m-bad", dispatchOpts{})
	if o := h.next(10 * time.Second); o.TaskID != "failed" || o.Status != protocol.OutcomeModelError {
		t.Fatalf("failure: stored outcome %+v", o.Outcome)
	}
	if r.saw("failed") {
		t.Fatal("a failed outcome was reported directly")
	}
}

// With no dispatcher subscribed the server answers "no responders" at once,
// and with MLSCHED_STORED_OUTCOMES_ONLY nothing is reported: both store.
func TestOutcomesStoredWithoutDirectReports(t *testing.T) {
	t.Parallel()
	for _, storedOnly := range []bool{false, true} {
		h := newHarness(t, "n1")
		var r *reportResponder
		if storedOnly {
			r = h.respondReports(t)
		}
		cfg := h.config()
		cfg.StoredOutcomesOnly = storedOnly
		cfg.PublishTimeout = time.Minute // a wait for an answer would show as a failed fetch below
		h.start(cfg, WithHandler("ok", func(context.Context, Task) (any, error) { return 1, nil }),
			WithModels([]ModelSpec{goModel("m-ok", "ok")}))
		h.dispatch("x", "m-ok", dispatchOpts{})
		if o := h.next(10 * time.Second); o.TaskID != "x" || o.Status != protocol.OutcomeSuccess {
			t.Fatalf("stored only %v: outcome %+v", storedOnly, o.Outcome)
		}
		if r != nil && r.saw("x") {
			t.Fatal("reported directly with MLSCHED_STORED_OUTCOMES_ONLY")
		}
	}
}

// An authorization written before direct reports refuses them: the worker
// notices at the first unanswered report, says so once, and stores every
// outcome from then on instead of waiting for an answer each time.
func TestDirectReportsRefusedByPermissions(t *testing.T) {
	t.Parallel()
	h, pw := deniedServer(t, "mlsched.report.>")
	r := h.respondReports(t) // a dispatcher is there: only the permission stops the reports
	cfg := h.config()
	cfg.NATS.User, cfg.NATS.PasswordFile = "n1", pw
	cfg.PublishTimeout = 300 * time.Millisecond
	var logs logtest.Buffer
	h.start(cfg, WithLogger(zerolog.New(&logs)), WithHandler("ok", func(context.Context, Task) (any, error) { return 1, nil }),
		WithModels([]ModelSpec{goModel("m-ok", "ok")}))
	for _, id := range []string{"p1", "p2", "p3"} {
		h.dispatch(id, "m-ok", dispatchOpts{})
		if o := h.next(10 * time.Second); o.TaskID != id || o.Status != protocol.OutcomeSuccess {
			t.Fatalf("%s: stored outcome %+v", id, o.Outcome)
		}
	}
	if r.saw("p1") || r.saw("p2") || r.saw("p3") {
		t.Fatal("a refused report reached the dispatcher")
	}
	all := string(bytes.Join(logs.Lines(), []byte("\n")))
	if n := strings.Count(all, "NATS refuses this node's direct reports"); n != 1 {
		t.Fatalf("the refusal is logged %d times, want once:\n%s", n, all)
	}
}

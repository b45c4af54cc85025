package dispatcher_test

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// A direct report is settled like a stored outcome (checked, counted, one
// result) and answered only once the result is stored; what the stored
// path must handle is sent back to be stored; forged reports are refused
// like forged outcomes.
func TestDirectReports(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	n := e.startNode("n1", []string{"t"}, map[string]behavior{"m": succeed})
	n.silent.Store(true) // the test answers its dispatches
	dispatched := func(i int) nats.Header {
		e.t.Helper()
		e.waitFor("a dispatch", func() bool { n.mu.Lock(); defer n.mu.Unlock(); return len(n.headers) > i })
		n.mu.Lock()
		defer n.mu.Unlock()
		return n.headers[i]
	}
	report := func(subject string, o protocol.Outcome, h nats.Header) string {
		t.Helper()
		data, _ := json.Marshal(o)
		m, err := e.ns.NC.RequestMsg(&nats.Msg{Subject: subject, Data: data, Header: h}, 10*time.Second)
		if err != nil {
			t.Fatalf("report on %s: %v", subject, err)
		}
		return string(m.Data)
	}
	const settled, acked = `{"status":"settled"}`, `{"status":"acked"}`
	success := func(id string) protocol.Outcome {
		return protocol.Outcome{TaskID: id, Type: "t", Attempt: 1, Model: "m", Node: "n1",
			Status: protocol.OutcomeSuccess, Output: json.RawMessage(`{"direct":true}`), LatencyMs: 2}
	}

	e.submit(protocol.Task{ID: "a", Type: "t"})
	ha := protocol.OutcomeHeader(dispatched(0), "n1")
	if got := report(topology.ReportSubject("n1"), success("a"), ha); got != settled {
		t.Fatalf("answer %s, want %s", got, settled)
	}
	// Answered after the result is stored: it is readable now.
	s, err := e.ns.JS.Stream(e.ctx, topology.StreamResults)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(e.ctx, topology.ResultSubject("a"))
	if err != nil {
		t.Fatalf("answered before the result was stored: %v", err)
	}
	var res protocol.Result
	if err := json.Unmarshal(m.Data, &res); err != nil {
		t.Fatal(err)
	}
	if res.Status != protocol.StatusSucceeded || string(res.Output) != `{"direct":true}` || res.Node != "n1" ||
		res.Attempts != 1 || len(res.History) != 1 {
		t.Fatalf("result %+v", res)
	}
	// Reported again (a lost answer): settled, no second result.
	if got := report(topology.ReportSubject("n1"), success("a"), ha); got != settled {
		t.Fatalf("second report: answer %s", got)
	}
	e.waitFor("the second result refused", func() bool { return e.d.Counters().Suppressed.Load() == 1 })
	if c := e.resultCount("a"); c != 1 {
		t.Fatalf("%d results for a", c)
	}

	// Not a success, or headers that do not parse: sent back, nothing done.
	e.submit(protocol.Task{ID: "b", Type: "t"})
	hb := protocol.OutcomeHeader(dispatched(1), "n1")
	failed := success("b")
	failed.Status, failed.Output, failed.Error = protocol.OutcomeModelError, nil, "broke"
	bare := nats.Header{}
	bare.Set(protocol.HdrTaskID, "b")
	for _, c := range []struct {
		name string
		o    protocol.Outcome
		h    nats.Header
	}{{"a failure", failed, hb}, {"no dispatch headers", success("b"), bare}} {
		if got := report(topology.ReportSubject("n1"), c.o, c.h); !strings.HasPrefix(got, `{"status":"deferred","reason":`) {
			t.Fatalf("%s: answer %s, want it sent back", c.name, got)
		}
	}
	if got := e.d.Counters().ReportsDeferred.Load(); got != 2 {
		t.Fatalf("reports sent back = %d, want 2", got)
	}

	// Forged: counted and ignored, as on the stream.
	forged := []struct {
		name, subject string
		o             protocol.Outcome
	}{
		{"another node's subject", topology.ReportSubject("n2"), func() protocol.Outcome { o := success("b"); o.Node = "n2"; return o }()},
		{"another task in the body", topology.ReportSubject("n1"), success("victim")},
	}
	for _, f := range forged {
		if got := report(f.subject, f.o, hb); got != settled {
			t.Fatalf("%s: answer %s", f.name, got)
		}
	}
	if got := e.d.Counters().Forged.Load(); got != int64(len(forged)) {
		t.Fatalf("forged = %d, want %d", got, len(forged))
	}
	if e.resultCount("b") != 0 || e.resultCount("victim") != 0 {
		t.Fatal("a refused report made a result")
	}
	// The real report of b still settles it.
	if got := report(topology.ReportSubject("n1"), success("b"), hb); got != settled {
		t.Fatalf("b: answer %s", got)
	}
	if r := e.result("b"); r.Status != protocol.StatusSucceeded {
		t.Fatalf("b: %+v", r)
	}
	// A report naming its dispatch's ack subject: the dispatcher acks the
	// dispatch once the result is stored, and answers "acked". An ack
	// subject of another node's consumer is not used: the usual answer
	// comes instead.
	e.submit(protocol.Task{ID: "c", Type: "t"})
	hc := protocol.OutcomeHeader(dispatched(2), "n1")
	n.mu.Lock()
	ackSubj := n.acks[2]
	n.mu.Unlock()
	other := nats.Header{}
	for k, v := range hc {
		other[k] = v
	}
	other.Set(protocol.HdrAck, strings.Replace(ackSubj, topology.NodeConsumer("n1"), topology.NodeConsumer("n2"), 1))
	if got := report(topology.ReportSubject("n1"), success("c"), other); got != settled {
		t.Fatalf("ack subject of another node's consumer: answer %q", got)
	}
	hc.Set(protocol.HdrAck, ackSubj)
	if got := report(topology.ReportSubject("n1"), success("c"), hc); got != acked {
		t.Fatalf("with the ack subject: answer %q, want %s", got, acked)
	}
	if r := e.result("c"); r.Status != protocol.StatusSucceeded {
		t.Fatalf("c: %+v", r)
	}
	e.waitFor("c's dispatch acked", func() bool {
		s, err := e.ns.JS.Stream(e.ctx, topology.StreamDispatch)
		if err != nil {
			return false
		}
		info, err := s.Info(e.ctx)
		// a and b were answered, never acked by the silent node: only c is gone
		return err == nil && info.State.Msgs == 2
	})
	rep := e.stats()
	if rep.Counters["reports"] != 7 || rep.Counters["reports_deferred"] != 2 {
		t.Fatalf("stats counters: reports %d, deferred %d", rep.Counters["reports"], rep.Counters["reports_deferred"])
	}
}

// A node that announces the compact encoding gets one Mlsched-Dispatch
// header; a node that does not gets the v1 headers. Both settle.
func TestCompactDispatchOnlyToNodesThatReadIt(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	v1 := e.startNode("v1", []string{"t"}, map[string]behavior{"m1": succeed})
	e.compactNodes = true
	compact := e.startNode("compact", []string{"t"}, map[string]behavior{"m2": succeed})
	e.waitFor("both nodes known", func() bool { return len(e.stats().Nodes) == 2 })
	for i := 0; ; i++ {
		id := "c-" + strconv.Itoa(i)
		e.submit(protocol.Task{ID: id, Type: "t", Models: []string{[]string{"m1", "m2"}[i%2]}})
		if r := e.result(id); r.Status != protocol.StatusSucceeded {
			t.Fatalf("%s: %+v", id, r)
		}
		if i >= 3 {
			break
		}
	}
	for _, c := range []struct {
		n       *node
		compact bool
	}{{v1, false}, {compact, true}} {
		c.n.mu.Lock()
		hs := append([]nats.Header(nil), c.n.headers...)
		c.n.mu.Unlock()
		if len(hs) == 0 {
			t.Fatalf("node %s got no dispatch", c.n.id)
		}
		for _, h := range hs {
			_, hasCompact := h[protocol.HdrDispatch]
			_, hasV1 := h[protocol.HdrTaskID]
			if hasCompact != c.compact || hasV1 == c.compact {
				t.Errorf("node %s (compact %v) got headers %v", c.n.id, c.compact, h)
			}
			if _, err := protocol.ParseDispatch(h); err != nil {
				t.Errorf("node %s: %v", c.n.id, err)
			}
		}
	}
}

package protocol_test

import (
	"encoding/json"
	"errors"
	"net/textproto"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mlsched/mlsched/shared/protocol"
)

func fullDispatch() protocol.Dispatch {
	return protocol.Dispatch{
		TaskID: "task-1", Type: "ocr", Model: "tesseract", Node: "gpu-1", Attempt: 2, MaxAttempts: 3,
		Deadline:  time.UnixMilli(1_800_000_000_123),
		Timeout:   1500 * time.Millisecond,
		Submitted: time.UnixMilli(1_800_000_000_000), Submission: "42",
		History: []protocol.Attempt{{Attempt: 1, Model: "easyocr", Node: "gpu-2", Status: protocol.OutcomeTimeout,
			Error: "no answer", LatencyMs: 1500}},
		Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		TaskSum:     protocol.TaskSum([]byte(`{"id":"task-1","type":"ocr"}`)), Seal: "00ff",
		TaskAck: "$JS.ACK.MLSCHED_TASKS.dispatcher.1.42.7.1800000000000000000.0",
	}
}

func TestDispatchRoundTrip(t *testing.T) {
	for name, d := range map[string]protocol.Dispatch{
		"full": fullDispatch(),
		"minimal": {TaskID: "t", Type: "x", Model: "m", Node: "n", Attempt: 1, MaxAttempts: 1,
			Deadline: time.UnixMilli(1)},
	} {
		got, err := protocol.ParseDispatch(d.Header())
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !reflect.DeepEqual(got, d) {
			t.Errorf("%s: round trip\n got %+v\nwant %+v", name, got, d)
		}
	}
}

func TestDispatchHeaderNamesAreCanonical(t *testing.T) {
	d := fullDispatch()
	for k := range d.Header() {
		if c := textproto.CanonicalMIMEHeaderKey(k); c != k {
			t.Errorf("header %q is not canonical (%q)", k, c)
		}
	}
}

func TestParseDispatchIsStrict(t *testing.T) {
	base := fullDispatch()
	cases := []struct {
		name   string
		edit   func(h nats.Header)
		header string // named in the error
	}{
		{"no task id", func(h nats.Header) { delete(h, protocol.HdrTaskID) }, protocol.HdrTaskID},
		{"wildcard task id", func(h nats.Header) { h.Set(protocol.HdrTaskID, "a.*") }, protocol.HdrTaskID},
		{"no type", func(h nats.Header) { delete(h, protocol.HdrType) }, protocol.HdrType},
		{"no model", func(h nats.Header) { h.Set(protocol.HdrModel, "") }, protocol.HdrModel},
		{"no node", func(h nats.Header) { delete(h, protocol.HdrNode) }, protocol.HdrNode},
		{"node with a dot", func(h nats.Header) { h.Set(protocol.HdrNode, "gpu.1") }, protocol.HdrNode},
		{"type with a space", func(h nats.Header) { h.Set(protocol.HdrType, "o cr") }, protocol.HdrType},
		{"attempt word", func(h nats.Header) { h.Set(protocol.HdrAttempt, "one") }, protocol.HdrAttempt},
		{"attempt zero", func(h nats.Header) { h.Set(protocol.HdrAttempt, "0") }, protocol.HdrAttempt},
		{"no max attempts", func(h nats.Header) { delete(h, protocol.HdrMaxAttempts) }, protocol.HdrMaxAttempts},
		{"max below attempt", func(h nats.Header) { h.Set(protocol.HdrMaxAttempts, "1") }, protocol.HdrMaxAttempts},
		{"no deadline", func(h nats.Header) { delete(h, protocol.HdrDeadline) }, protocol.HdrDeadline},
		{"deadline word", func(h nats.Header) { h.Set(protocol.HdrDeadline, "tomorrow") }, protocol.HdrDeadline},
		{"negative timeout", func(h nats.Header) { h.Set(protocol.HdrTimeout, "-5") }, protocol.HdrTimeout},
		{"submitted word", func(h nats.Header) { h.Set(protocol.HdrSubmitted, "now") }, protocol.HdrSubmitted},
		{"damaged history", func(h nats.Header) { h.Set(protocol.HdrHistory, "[{") }, protocol.HdrHistory},
	}
	for _, c := range cases {
		h := base.Header()
		c.edit(h)
		got, err := protocol.ParseDispatch(h)
		if err == nil {
			t.Errorf("%s: accepted", c.name)
			continue
		}
		if !errors.Is(err, &protocol.Error{Code: protocol.CodeInvalidDispatch}) || !strings.Contains(err.Error(), c.header) {
			t.Errorf("%s: error %v, want invalid_dispatch naming %s", c.name, err, c.header)
		}
		// What could be read is kept, so the report about it can be keyed.
		if c.header != protocol.HdrTaskID && got.TaskID != base.TaskID {
			t.Errorf("%s: task id %q lost", c.name, got.TaskID)
		}
		if c.header != protocol.HdrAttempt && got.Attempt != base.Attempt {
			t.Errorf("%s: attempt %d lost", c.name, got.Attempt)
		}
		if got.Submission != base.Submission {
			t.Errorf("%s: submission %q lost", c.name, got.Submission)
		}
	}
}

func TestOutcomeHeaderEchoesTheDispatch(t *testing.T) {
	d := fullDispatch()
	h := d.Header()
	h.Set(protocol.HdrMsgID, d.MsgID("d"))
	h.Set("Nats-Expected-Stream", "X")
	h.Set("Mlsched-Future", "kept")
	o := protocol.OutcomeHeader(h, "gpu-9")
	if _, ok := o[protocol.HdrMsgID]; ok || o.Get("Nats-Expected-Stream") != "" {
		t.Errorf("Nats-* headers echoed: %v", o)
	}
	if o.Get("Mlsched-Future") != "kept" || o.Get(protocol.HdrNode) != "gpu-9" {
		t.Errorf("echo %v", o)
	}
	got, err := protocol.ParseDispatch(o)
	d.Node = "gpu-9"
	if err != nil || !reflect.DeepEqual(got, d) {
		t.Errorf("outcome header parses to %+v, %v", got, err)
	}
	if d.MsgID("o") != "o:task-1:42:2" {
		t.Errorf("MsgID %q", d.MsgID("o"))
	}
}

// TestDispatchHeadersMatchTheDocs checks docs/protocol.md's dispatch header
// table against the codec: the same names, and "required" exactly where
// ParseDispatch refuses a dispatch without the header.
func TestDispatchHeadersMatchTheDocs(t *testing.T) {
	raw, err := os.ReadFile("../../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	start := strings.Index(doc, "## Dispatch (internal")
	if start < 0 {
		t.Fatal("docs/protocol.md has no Dispatch section")
	}
	doc = doc[start:]
	doc = doc[:strings.Index(doc[3:], "\n## ")+3]
	documented := map[string]string{} // name → required column
	for _, line := range strings.Split(doc, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`") {
			continue
		}
		documented[strings.Trim(strings.TrimSpace(cells[1]), "`")] = strings.TrimSpace(cells[2])
	}
	d := fullDispatch()
	h := d.Header()
	h.Set(protocol.HdrMsgID, d.MsgID("d"))
	for name := range h {
		if _, ok := documented[name]; !ok {
			t.Errorf("header %s is written but not documented", name)
		}
	}
	for name, req := range documented {
		if _, ok := h[name]; !ok {
			t.Errorf("header %s is documented but not written", name)
			continue
		}
		if name == protocol.HdrMsgID {
			continue // the publisher's, not the codec's
		}
		without := d.Header()
		delete(without, name)
		_, err := protocol.ParseDispatch(without)
		switch {
		case req == "yes" && err == nil:
			t.Errorf("header %s is documented as required but a dispatch without it parses", name)
		case req == "no" && err != nil:
			t.Errorf("header %s is documented as optional but: %v", name, err)
		case req != "yes" && req != "no":
			t.Errorf("header %s: required column %q, want yes or no", name, req)
		}
	}
}

// A malformed traceparent is dropped, never an error; the lowercase W3C
// spelling is read too.
func TestDispatchTraceparent(t *testing.T) {
	d := fullDispatch()
	h := d.Header()
	for _, bad := range []string{"garbage", "00-00000000000000000000000000000000-00f067aa0ba902b7-01", "\xff"} {
		h[protocol.HdrTraceparent] = []string{bad}
		got, err := protocol.ParseDispatch(h)
		if err != nil || got.Traceparent != "" {
			t.Errorf("traceparent %q: %q, %v", bad, got.Traceparent, err)
		}
	}
	delete(h, protocol.HdrTraceparent)
	h["traceparent"] = []string{d.Traceparent}
	if got, err := protocol.ParseDispatch(h); err != nil || got.Traceparent != d.Traceparent {
		t.Errorf("lowercase traceparent: %q, %v", got.Traceparent, err)
	}
	if rh := protocol.ResultHeader("t", d.Traceparent); rh.Get(protocol.HdrTraceparent) != d.Traceparent {
		t.Errorf("result header %v", rh)
	}
	if rh := protocol.ResultHeader("t", ""); len(rh) != 1 {
		t.Errorf("result header without a trace: %v", rh)
	}
}

// HeaderInto on a reused buffer must write exactly what Header writes: no
// header of the previous dispatch may survive, and Put adds one more.
func TestHeaderIntoReused(t *testing.T) {
	full := fullDispatch()
	minimal := protocol.Dispatch{TaskID: "t", Type: "x", Model: "m", Node: "n", Attempt: 1, MaxAttempts: 1,
		Deadline: time.UnixMilli(1)}
	var b protocol.HeaderBuf
	for i, d := range []protocol.Dispatch{full, minimal, full, minimal} {
		h := d.HeaderInto(&b)
		if want := d.Header(); !reflect.DeepEqual(h, want) {
			t.Fatalf("use %d: HeaderInto wrote\n %v\nHeader writes\n %v", i, h, want)
		}
		got, err := protocol.ParseDispatch(h)
		if err != nil || !reflect.DeepEqual(got, d) {
			t.Fatalf("use %d: round trip %+v, %v", i, got, err)
		}
		b.Put(protocol.HdrMsgID, d.MsgID("d"))
		if v := h.Get(protocol.HdrMsgID); v != d.MsgID("d") || len(h) != len(d.Header())+1 {
			t.Fatalf("use %d: after Put, %s = %q and %d headers", i, protocol.HdrMsgID, v, len(h))
		}
	}
}

// A report's answer is json.Marshal's bytes, and reads back; anything that
// is not an answer is an error.
func TestReportReply(t *testing.T) {
	for _, r := range []protocol.ReportReply{{Status: protocol.ReportAcked}, {Status: protocol.ReportSettled},
		{Status: protocol.ReportDeferred, Reason: "not a success: store it"}} {
		want, _ := json.Marshal(r)
		got := r.AppendJSON(nil)
		if string(got) != string(want) {
			t.Fatalf("%+v: %s, want %s", r, got, want)
		}
		back, err := protocol.DecodeReportReply(got)
		if err != nil || back != r {
			t.Fatalf("%s read as %+v, %v", got, back, err)
		}
	}
	for _, bad := range []string{``, `{"stream":"mlsched-report","seq":0}`, `{"status":"maybe"}`, `nope`} {
		if r, err := protocol.DecodeReportReply([]byte(bad)); err == nil {
			t.Fatalf("%q read as %+v", bad, r)
		}
	}
}

package protocol_test

import (
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mlsched/mlsched/shared/protocol"
)

func TestCompactDispatchRoundTrip(t *testing.T) {
	for name, d := range map[string]protocol.Dispatch{
		"full": fullDispatch(),
		"minimal": {TaskID: "t", Type: "x", Model: "m", Node: "n", Attempt: 1, MaxAttempts: 1,
			Deadline: time.UnixMilli(1)},
	} {
		h := d.CompactHeader()
		if _, v1 := h[protocol.HdrTaskID]; v1 || len(h) > 4 { // the compact header, the history, the trace context and the task ack
			t.Errorf("%s: compact header has %d entries: %v", name, len(h), h)
		}
		got, err := protocol.ParseDispatch(h)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !reflect.DeepEqual(got, d) {
			t.Errorf("%s: round trip\n got %+v\nwant %+v", name, got, d)
		}
		// The same dispatch either way, seal included: the seal covers the
		// fields (dispatcher/trust.go), so one made over either encoding
		// verifies over the other (TestSealSurvivesBothEncodings there).
		d.Seal = strings.Repeat("ab", 32)
		again, err := protocol.ParseDispatch(d.CompactHeader())
		if err != nil || again.Seal != d.Seal {
			t.Errorf("%s: the seal does not survive the compact encoding (%v)", name, err)
		}
	}
}

func TestParseCompactDispatchIsStrict(t *testing.T) {
	good := compactOf(fullDispatch()).Get(protocol.HdrDispatch)
	f := strings.Split(good, " ")
	with := func(i int, v string) string {
		g := append([]string(nil), f...)
		g[i] = v
		return strings.Join(g, " ")
	}
	for name, v := range map[string]string{
		"too few fields":        strings.Join(f[:len(f)-1], " "),
		"too many fields":       good + " extra",
		"trailing space":        good + " ",
		"another layout":        with(0, "2"),
		"empty task id":         with(1, ""),
		"dotted type":           with(2, "a.b"),
		"attempt 0":             with(5, "0"),
		"attempt over the max":  with(5, "4"),
		"deadline not a number": with(7, "soon"),
		"negative timeout":      with(8, "-1"),
		"submitted garbage":     with(9, "x"),
	} {
		_, err := protocol.ParseDispatch(nats.Header{protocol.HdrDispatch: {v}})
		var pe *protocol.Error
		if !errors.As(err, &pe) || pe.Code != protocol.CodeInvalidDispatch || !strings.Contains(pe.Msg, protocol.HdrDispatch) {
			t.Errorf("%s (%q): %v, want %s naming %s", name, v, err, protocol.CodeInvalidDispatch, protocol.HdrDispatch)
		}
	}
	// The shared optional headers are read as in v1.
	h := compactOf(fullDispatch())
	h.Set(protocol.HdrHistory, "[not json")
	if _, err := protocol.ParseDispatch(h); err == nil || !strings.Contains(err.Error(), protocol.HdrHistory) {
		t.Errorf("bad history: %v", err)
	}
}

// The echo of a compact dispatch keeps the chosen node (the dispatcher
// compares it with the reporting subject's) and adds no v1 header.
func TestOutcomeHeaderOfACompactDispatch(t *testing.T) {
	d := fullDispatch()
	h := d.CompactHeader()
	h.Set(protocol.HdrMsgID, d.MsgID("d"))
	o := protocol.OutcomeHeader(h, "other-node")
	if _, ok := o[protocol.HdrMsgID]; ok {
		t.Error("the echo carries the dispatch's Nats-Msg-Id")
	}
	if _, ok := o[protocol.HdrNode]; ok {
		t.Error("the echo of a compact dispatch adds Mlsched-Node")
	}
	got, err := protocol.ParseDispatch(o)
	if err != nil || got.Node != d.Node {
		t.Fatalf("echo: node %q, %v", got.Node, err)
	}
}

func TestCompactDispatchIsDocumented(t *testing.T) {
	raw, err := os.ReadFile("../../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	i := strings.Index(doc, protocol.HdrDispatch+": 1 ")
	if i < 0 {
		t.Fatalf("docs/protocol.md shows no %s layout", protocol.HdrDispatch)
	}
	line := doc[i+len(protocol.HdrDispatch)+2:]
	line = line[:strings.IndexByte(line, '\n')]
	if n := len(strings.Fields(line)); n != len(strings.Split(compactOf(fullDispatch()).Get(protocol.HdrDispatch), " ")) {
		t.Errorf("the documented layout has %d fields: %q", n, line)
	}
}

func FuzzParseCompactDispatch(f *testing.F) {
	f.Add(compactOf(fullDispatch()).Get(protocol.HdrDispatch))
	f.Add("1 a b c d 1 1 1 0 0 - - -")
	f.Add("1  b c d 1 1 1 0 0 x y z")
	f.Fuzz(func(t *testing.T, v string) {
		d, err := protocol.ParseDispatch(nats.Header{protocol.HdrDispatch: {v}})
		if err != nil {
			return
		}
		again, err := protocol.ParseDispatch(d.CompactHeader())
		if err != nil {
			t.Fatalf("%q parses but its re-encoding does not: %v", v, err)
		}
		if !reflect.DeepEqual(again, d) {
			t.Fatalf("%q: re-encoded\n got %+v\nwant %+v", v, again, d)
		}
	})
}

func compactOf(d protocol.Dispatch) nats.Header { return d.CompactHeader() }

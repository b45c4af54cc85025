package protocol_test

import (
	"bytes"
	"encoding/json"
	"math"
	"testing"
	"time"

	"github.com/mlsched/mlsched/shared/protocol"
)

// encodeSeeds are strings and raw values for the encoders' fuzz tests: HTML
// characters encoding/json escapes, the line separators, control
// characters, bad UTF-8, and raw JSON that encoding/json compacts or
// refuses.
var encodeSeeds = []struct {
	text string
	raw  string
	f    float64
}{
	{"task-000123", `{"label":"spam","score":0.97}`, 3.217},
	{"<b>&amp;</b>", " { \"a\" : [1, 2,\n 3] } ", 1e21},
	{"\u2028\u2029\u007f\u0000\x01", `"<html>&"`, 1e-7},
	{"\xff\xfe bad \xed\xa0\x80", `[1,]`, -0.0},
	{"\"quoted\"\\ \t\n\r", `nul`, 123456789.123},
	{"é😀", ``, 0.000001},
	{"", `{"a":"\u00e9\ud83d"}`, 1e20},
	{"x", "  ", math.MaxFloat64},
	{"y", `{"a":1} {}`, math.SmallestNonzeroFloat64},
	{"z", `1e400`, 5e-324},
}

// FuzzEncodeResult holds Encode to json.Marshal for a result: the same
// bytes, or an error from both.
func FuzzEncodeResult(f *testing.F) {
	for _, s := range encodeSeeds {
		f.Add(s.text, []byte(s.raw), s.f, int64(1764576000123456789))
	}
	f.Fuzz(func(t *testing.T, text string, raw []byte, ms float64, nanos int64) {
		res := protocol.Result{ID: text, Type: "t" + text, Status: protocol.StatusSucceeded, Model: text, Node: "n",
			Attempts: 2, Output: raw, Error: text, ErrorCode: protocol.Code(text), LatencyMs: ms,
			History: []protocol.Attempt{{Attempt: 1, Model: text, Node: "n", Status: protocol.OutcomeTimeout, Error: text, LatencyMs: ms,
				BatchWaitMs: ms / 3, DeadlineLeftMs: -ms}, {}},
			FinishedAt: time.Unix(0, nanos).UTC(), RetryAfterMs: len(text)}
		checkResultEncode(t, &res)
		res.Output, res.History, res.Error = nil, nil, ""
		checkResultEncode(t, &res)
	})
}

// FuzzEncodeOutcome holds Encode to json.Marshal for an outcome.
func FuzzEncodeOutcome(f *testing.F) {
	for _, s := range encodeSeeds {
		f.Add(s.text, []byte(s.raw), s.f)
	}
	f.Fuzz(func(t *testing.T, text string, raw []byte, ms float64) {
		o := protocol.Outcome{TaskID: text, Type: text, Attempt: 1, Model: text, Node: text, Status: protocol.OutcomeSuccess,
			Output: raw, Error: text, LatencyMs: ms, BatchWaitMs: ms / 3, DeadlineLeftMs: -ms, Task: raw}
		checkOutcomeEncode(t, &o)
		o.Task = nil
		checkOutcomeEncode(t, &o)
	})
}

func TestEncodeMatchesJSON(t *testing.T) {
	for _, s := range encodeSeeds {
		res := protocol.Result{ID: s.text, Output: json.RawMessage(s.raw), LatencyMs: s.f, Error: s.text,
			History: []protocol.Attempt{{Model: s.text, LatencyMs: s.f}}, FinishedAt: time.Now()}
		checkResultEncode(t, &res)
		o := protocol.Outcome{TaskID: s.text, Output: json.RawMessage(s.raw), LatencyMs: s.f, BatchWaitMs: s.f, DeadlineLeftMs: -s.f,
			Task: json.RawMessage(s.raw)}
		checkOutcomeEncode(t, &o)
	}
	// Values encoding/json refuses: the error is encoding/json's own.
	for _, ms := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
		res := protocol.Result{ID: "a", LatencyMs: ms}
		_, werr := json.Marshal(&res)
		_, err := protocol.EncodeResult(&res)
		if werr == nil || err == nil || err.Error() != werr.Error() {
			t.Errorf("%v: encoding/json says %v, EncodeResult says %v", ms, werr, err)
		}
	}
}

func checkResultEncode(t *testing.T, r *protocol.Result) {
	t.Helper()
	got, err := protocol.EncodeResult(r)
	checkEncoded(t, r, got, err)
}

func checkOutcomeEncode(t *testing.T, o *protocol.Outcome) {
	t.Helper()
	got, err := protocol.EncodeOutcome(o)
	checkEncoded(t, o, got, err)
}

// checkEncoded: got and err are json.Marshal(v)'s.
func checkEncoded(t *testing.T, v any, got []byte, err error) {
	t.Helper()
	want, werr := json.Marshal(v)
	if (werr == nil) != (err == nil) || (werr != nil && err.Error() != werr.Error()) {
		t.Fatalf("%+v: encoding/json says %v, the encoder says %v", v, werr, err)
	}
	if werr == nil && !bytes.Equal(got, want) {
		t.Fatalf("%+v:\nencoding/json %s\nthe encoder   %s", v, want, got)
	}
}

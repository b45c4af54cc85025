package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"unicode/utf8"

	fastjson "github.com/segmentio/encoding/json"
)

// The one codec of the messages coded once per task (a task, a
// dispatch's task head, an outcome, a result): github.com/segmentio/encoding
// (its json package), with encoding/json as the reference, both ways:
// EncodeResult and EncodeOutcome write json.Marshal's bytes, and the decoders read what
// json.Unmarshal would.
//
// Why a library and not encoding/json alone: on the path of one task these
// decodes cost about 7 µs of CPU more through encoding/json, over the 3 µs
// a message may cost (issue 18); the library replaced a hand-written reader
// of 830 lines (docs/benchmarks.md, "The wire codec").
//
// Why segmentio/encoding: it keeps encoding/json's rules. goccy/go-json,
// as fast, failed the conformance seeds: it accepted invalid JSON inside
// values it skips or keeps raw ({"payload":[1,]}, a tab in a string) and
// decoded 9223372036854775808 into an int without an error.
// segmentio/encoding differs from encoding/json on two points only, both
// guarded below: the Unicode folding of member names, and the nesting limit.
//
// Why encoding/json stays behind it: its words are the ones producers see
// in a rejection, and it is the rule of what is accepted. Anything the fast
// decoder refuses (or that is not valid UTF-8, or may fold or nest as only
// encoding/json handles, or that makes it panic) is decoded again by
// encoding/json, whose value or error is the answer. The fuzz tests hold
// the pair to encoding/json alone: the same inputs accepted, the same
// fields decoded.

var errDecoderPanic = errors.New("protocol: fast decoder panicked")

// decode unmarshals data into v as json.Unmarshal would.
func decode[T any](data []byte, v *T) error {
	if decodeFast(data, v) {
		return nil
	}
	var zero T
	*v = zero
	return json.Unmarshal(data, v)
}

// decodeFast decodes data into v through the fast decoder, and reports
// false (v then unusable) for anything only encoding/json may answer.
func decodeFast[T any](data []byte, v *T) bool {
	return utf8.Valid(data) && !foldsOntoASCII(data) && !tooDeep(data) && fastDecode(data, v) == nil
}

// foldsOntoASCII reports whether data holds, raw or escaped, one of the
// two runes whose Unicode simple folding is an ASCII letter: the Kelvin
// sign (U+212A, k) and the long s (U+017F, s). encoding/json matches a
// member name through that folding ("tas\u212a_id" is task_id); the fast
// decoder folds ASCII only, so such a message goes to encoding/json.
func foldsOntoASCII(data []byte) bool {
	if bytes.Contains(data, []byte("\u212a")) || bytes.Contains(data, []byte("\u017f")) { // the runes themselves
		return true
	}
	for rest := data; ; {
		i := bytes.Index(rest, []byte(`\u`))
		if i < 0 || len(rest) < i+6 {
			return false
		}
		if esc := rest[i+2 : i+6]; bytes.EqualFold(esc, []byte("212a")) || bytes.EqualFold(esc, []byte("017f")) {
			return true
		}
		rest = rest[i+2:]
	}
}

// maxJSONDepth is encoding/json's nesting limit, which the fast decoder
// does not have.
const maxJSONDepth = 10000

// tooDeep reports whether data may nest deeper than encoding/json allows:
// only a document with more openers than the limit can.
func tooDeep(data []byte) bool {
	return len(data) > maxJSONDepth && bytes.Count(data, []byte("["))+bytes.Count(data, []byte("{")) > maxJSONDepth
}

// fastDecode is segmentio/encoding's Unmarshal; a panic on hostile input is an
// error, never a crash.
func fastDecode(data []byte, v any) (err error) {
	defer func() {
		if recover() != nil {
			err = errDecoderPanic
		}
	}()
	return fastjson.Unmarshal(data, v)
}

// EncodeResult returns json.Marshal(r)'s bytes and error: the result the
// dispatcher stores, once per task.
func EncodeResult(r *Result) ([]byte, error) { return encode(r, r.Output) }

// EncodeOutcome returns json.Marshal(o)'s bytes and error: the outcome a
// worker reports, once per attempt.
func EncodeOutcome(o *Outcome) ([]byte, error) { return encode(o, o.Output, o.Task) }

// encode returns json.Marshal(v)'s bytes and error; raws are v's
// json.RawMessage fields. The fast encoder writes them; whatever it refuses
// (or panics on) is encoded again by encoding/json, whose bytes or error are
// the answer. It does not check a raw value the way encoding/json does (it
// keeps the first of {"a":1} {} where encoding/json refuses both), so a raw
// field that is not one valid JSON value goes to encoding/json too.
// FuzzEncodeResult and FuzzEncodeOutcome hold the pair to json.Marshal's
// bytes.
//
// Why not encoding/json alone: under load json.Marshal of the result was
// 9% of the dispatcher's CPU (a profile of mlsched-bench, 2026-12-03), about
// 3.5 µs per task; segmentio/encoding writes the same bytes in about half
// the time, with one allocation instead of two (BenchmarkCodecs).
func encode(v any, raws ...json.RawMessage) ([]byte, error) {
	for _, raw := range raws {
		if len(raw) > 0 && !fastjson.Valid(raw) {
			return json.Marshal(v)
		}
	}
	if data, ok := encodeFast(v); ok {
		return data, nil
	}
	return json.Marshal(v)
}

// encodeFast is segmentio/encoding's Marshal; ok is false on an error or a
// panic.
func encodeFast(v any) (data []byte, ok bool) {
	defer func() {
		if recover() != nil {
			data, ok = nil, false
		}
	}()
	data, err := fastjson.Marshal(v)
	return data, err == nil
}

// DecodeOutcome decodes an outcome message exactly as json.Unmarshal into
// an Outcome would: the dispatcher decodes one per attempt. On error the
// Outcome is not usable.
func DecodeOutcome(data []byte) (Outcome, error) {
	var o Outcome
	if err := decode(data, &o); err != nil {
		return Outcome{}, err
	}
	return o, nil
}

// TaskHead is what a worker needs of a dispatch the dispatcher validated:
// what to run, and the priority and tenant it orders its queue by.
type TaskHead struct {
	ID       string          `json:"id"`
	Type     string          `json:"type"`
	Payload  json.RawMessage `json:"payload"`
	Priority int             `json:"priority"`
	Tenant   string          `json:"tenant"`
	Size     float64         `json:"size"`
}

// DecodeTaskHead decodes a task message's head, and nothing else, exactly as
// json.Unmarshal would into a TaskHead.
func DecodeTaskHead(data []byte) (TaskHead, error) {
	var h TaskHead
	if err := decode(data, &h); err != nil {
		return TaskHead{}, err
	}
	return h, nil
}

// DecodeResult decodes a result message exactly as json.Unmarshal into a
// Result would: what a producer pays per result it reads. On error the
// Result is not usable.
func DecodeResult(data []byte) (Result, error) {
	var res Result
	if err := decode(data, &res); err != nil {
		return Result{}, err
	}
	return res, nil
}

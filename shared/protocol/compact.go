package protocol

import (
	"encoding/json"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// The compact encoding of a dispatch: every field but the history and the
// trace context in one header, for nodes that announce they read it
// (Heartbeat.CompactDispatch). Fourteen header lines cost every process on
// the path (the dispatcher writes them, nats-server scans them, the worker
// parses them into a map, echoes them and the dispatcher parses them again);
// one line of space-separated fields costs a fraction. A node that does not
// announce it gets the headers of protocol v1, so older and third-party
// workers keep working. The seal covers the fields, not their encoding.
//
//	Mlsched-Dispatch: 1 <task-id> <type> <model> <node> <attempt> <max-attempts> <deadline-ms> <timeout-ms> <submitted-ms> <task-seq> <task-sum> <seal>
//
// The leading 1 is the layout's version. Tokens hold no white space, so a
// single space separates the fields; an absent number is 0, an absent task
// sequence, task sum or seal "-" (NATS trims a header value's trailing
// spaces). Mlsched-History
// and Traceparent stay headers of their own, present only when set.
const HdrDispatch = "Mlsched-Dispatch"

// compactFields is the number of space-separated fields of HdrDispatch.
const compactFields = 13

// absent stands for an empty task sequence, task sum or seal: NATS trims
// header values, so a trailing empty field would be lost.
const absent = "-"

// CompactHeaderInto encodes the dispatch compactly into b (cleared first),
// like HeaderInto.
func (d *Dispatch) CompactHeaderInto(b *HeaderBuf) nats.Header {
	if b.h == nil {
		b.h = make(nats.Header, 4)
	} else {
		clear(b.h)
	}
	b.vals, b.n = [dispatchHeaders]string{}, 0
	v := make([]byte, 0, 64+len(d.TaskID)+len(d.Type)+len(d.Model)+len(d.Node)+len(d.Submission)+len(d.TaskSum)+len(d.Seal))
	v = append(v, '1', ' ')
	v = append(v, d.TaskID...)
	v = append(v, ' ')
	v = append(v, d.Type...)
	v = append(v, ' ')
	v = append(v, d.Model...)
	v = append(v, ' ')
	v = append(v, d.Node...)
	v = append(v, ' ')
	v = strconv.AppendInt(v, int64(d.Attempt), 10)
	v = append(v, ' ')
	v = strconv.AppendInt(v, int64(d.MaxAttempts), 10)
	v = append(v, ' ')
	v = strconv.AppendInt(v, d.Deadline.UnixMilli(), 10)
	v = append(v, ' ')
	v = strconv.AppendInt(v, max(d.Timeout.Milliseconds(), 0), 10)
	v = append(v, ' ')
	if d.Submitted.IsZero() {
		v = append(v, '0')
	} else {
		v = strconv.AppendInt(v, d.Submitted.UnixMilli(), 10)
	}
	for _, f := range [...]string{d.Submission, d.TaskSum, d.Seal} {
		v = append(v, ' ')
		if f == "" {
			f = absent // header values are trimmed on the wire: never end with a space
		}
		v = append(v, f...)
	}
	b.Put(HdrDispatch, string(v))
	if len(d.History) > 0 {
		hist, _ := json.Marshal(d.History) // plain strings and numbers: cannot fail
		b.Put(HdrHistory, string(hist))
	}
	if d.Traceparent != "" {
		b.Put(HdrTraceparent, d.Traceparent)
	}
	if d.TaskAck != "" {
		b.Put(HdrTaskAck, d.TaskAck)
	}
	if d.Pipeline != "" {
		b.Put(HdrPipeline, d.Pipeline)
	}
	return b.h
}

// CompactHeader is CompactHeaderInto a new buffer.
func (d *Dispatch) CompactHeader() nats.Header {
	return d.CompactHeaderInto(&HeaderBuf{})
}

// parseCompact decodes HdrDispatch (v) into d, reporting the first problem
// through bad as ParseDispatch does; the other headers are ParseDispatch's.
func parseCompact(v string, d *Dispatch, bad func(name, format string, args ...any)) {
	var f [compactFields]string
	rest := v
	for i := range compactFields {
		if i == compactFields-1 {
			if strings.IndexByte(rest, ' ') >= 0 {
				bad(HdrDispatch, "more than %d fields", compactFields)
				return
			}
			f[i] = rest
			break
		}
		var ok bool
		if f[i], rest, ok = strings.Cut(rest, " "); !ok {
			bad(HdrDispatch, "%d fields, want %d", i+1, compactFields)
			return
		}
	}
	if f[0] != "1" {
		bad(HdrDispatch, "layout %q, want 1", truncate(f[0], 16))
		return
	}
	token := func(what, s string, max int) string {
		if err := ValidToken(s, max); err != nil {
			bad(HdrDispatch, "%s: %v", what, err)
		}
		return s
	}
	num := func(what, s string, min int64) int64 {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < min {
			bad(HdrDispatch, "%s %q is not an integer of at least %d", what, truncate(s, 32), min)
			return 0
		}
		return n
	}
	d.TaskID = token("task id", f[1], DefaultLimits.MaxIDLen)
	d.Type = token("type", f[2], 64)
	d.Model = token("model", f[3], 128)
	d.Node = token("node", f[4], 64)
	d.Attempt = int(num("attempt", f[5], 1))
	d.MaxAttempts = int(num("max attempts", f[6], 1))
	if d.Attempt > d.MaxAttempts && d.MaxAttempts > 0 {
		bad(HdrDispatch, "max attempts %d is below the attempt number %d", d.MaxAttempts, d.Attempt)
	}
	if ms := num("deadline", f[7], 1); ms > 0 {
		d.Deadline = time.UnixMilli(ms)
	}
	d.Timeout = time.Duration(num("timeout", f[8], 0)) * time.Millisecond
	if ms := num("submitted", f[9], 0); ms > 0 {
		d.Submitted = time.UnixMilli(ms)
	}
	opt := func(s string) string {
		if s == absent {
			return ""
		}
		return s
	}
	d.Submission, d.TaskSum, d.Seal = opt(f[10]), opt(f[11]), opt(f[12])
}

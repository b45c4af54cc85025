package protocol

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// Headers that make a dispatch verifiable, echoed by the worker on the
// outcome: the sum of the task's bytes and the dispatcher's seal over the
// dispatch's fields (dispatcher/trust.go).
const (
	HdrTaskSum = "Mlsched-Task-Sum"
	HdrSeal    = "Mlsched-Seal"
)

// TaskSum is the hex SHA-256 of a task's bytes, as in HdrTaskSum.
func TaskSum(task []byte) string {
	s := sha256.Sum256(task)
	return hex.EncodeToString(s[:])
}

// Dispatch is one attempt of one submission of a task: what the dispatcher
// decided and what a worker needs to run it. It travels as the headers of
// the dispatch message (whose body is the task's original bytes, unchanged),
// comes back echoed on the attempt's outcome, and is read again by the
// sweeper from the stored dispatch. Header and ParseDispatch are its only
// codec; nothing else should know a header name.
type Dispatch struct {
	// TaskID and Type are the task's (required).
	TaskID string
	Type   string
	// Model and Node are the decision (required).
	Model string
	Node  string
	// Attempt is 1-based (required); MaxAttempts is the task's limit, at
	// least Attempt (required).
	Attempt     int
	MaxAttempts int
	// Deadline is when the attempt expires: past it the worker does not run
	// it and the sweeper declares it lost (required; millisecond precision).
	Deadline time.Time
	// Timeout is the per-attempt model timeout (optional; zero: the worker's
	// timeout for the model).
	Timeout time.Duration
	// Submitted is when the task entered the task stream, for the result's
	// submit-to-result latency (optional; zero when unknown).
	Submitted time.Time
	// Submission names this submission of the task, its sequence in the task
	// stream, so that the message ids of a task submitted again (a replayed
	// dead letter) do not collide with the first submission's (optional;
	// empty when unknown).
	Submission string
	// History holds the earlier attempts, oldest first (optional).
	History []Attempt
	// Traceparent is the W3C trace context the attempt runs in: the
	// producer's, or the dispatcher's dispatch span with tracing on
	// (optional; a malformed one is dropped, never an error).
	Traceparent string
	// TaskSum is TaskSum of the task's bytes and Seal the dispatcher's
	// HMAC of the other fields (optional here; a dispatcher refuses an
	// outcome whose dispatch is not sealed with its key: dispatcher/trust.go
	// seals and verifies).
	TaskSum string
	Seal    string
	// TaskAck is the acknowledgement subject of the task message in
	// MLSCHED_TASKS (optional): the task stays unacknowledged, the record
	// of its attempts, until its final result is stored, and the dispatcher
	// that stores it acks the task there (docs/protocol.md, "What is stored
	// where"). Not sealed: a dispatcher acks it only when its stream
	// sequence is the sealed Submission.
	TaskAck string
	// Pipeline is a pipeline step's sealed progress (HdrPipeline), carried
	// as it is (optional; the dispatcher seals and reads it).
	Pipeline string
}

// Headers of a dispatch, echoed on its outcome. Every name is in canonical
// MIME form, so that a literal nats.Header map needs no canonicalisation.
const (
	HdrMsgID       = "Nats-Msg-Id"
	HdrTaskID      = "Mlsched-Task-Id"
	HdrType        = "Mlsched-Type"
	HdrModel       = "Mlsched-Model"
	HdrNode        = "Mlsched-Node"
	HdrAttempt     = "Mlsched-Attempt"
	HdrMaxAttempts = "Mlsched-Max-Attempts"
	HdrDeadline    = "Mlsched-Deadline"
	HdrTimeout     = "Mlsched-Timeout-Ms"
	HdrHistory     = "Mlsched-History"
	HdrTaskSeq     = "Mlsched-Task-Seq"
	HdrSubmitted   = "Mlsched-Submitted"
	// HdrAck is on a direct report only: the subject that acknowledges the
	// reported dispatch, which the dispatcher publishes itself, once the
	// result is stored, with the report's reply subject, so that JetStream's
	// confirmation of that acknowledgement is the worker's answer
	// (docs/protocol.md, "Direct reports").
	HdrAck = "Mlsched-Ack"
	// HdrTraceparent is the W3C trace context (the "traceparent" header in
	// its canonical MIME form). A producer sets it on the task message; it
	// is carried on the dispatch, the outcome and the result, and sent on
	// to HTTP model servers.
	HdrTraceparent = "Traceparent"
	// HdrTaskAck carries Dispatch.TaskAck, in both encodings.
	HdrTaskAck = "Mlsched-Task-Ack"
)

// Header encodes the dispatch as message headers (without Nats-Msg-Id: pass
// MsgID("d") to the publish). Optional fields are left out when zero.
func (d *Dispatch) Header() nats.Header {
	return d.HeaderInto(&HeaderBuf{})
}

// HeaderBuf is reusable storage for HeaderInto: the map and the value
// slices of one dispatch's headers. The hot path keeps them in a sync.Pool
// and reuses them once the publish has returned (nats.go encodes headers
// into its buffer before PublishMsg returns and keeps no reference).
type HeaderBuf struct {
	h    nats.Header
	vals [dispatchHeaders]string
	n    int // vals used
}

// Put sets header k (a canonical name) to v in the map HeaderInto
// returned, e.g. the Nats-Msg-Id, sharing the buffer's storage.
func (b *HeaderBuf) Put(k, v string) {
	if b.n >= len(b.vals) {
		b.h[k] = []string{v}
		return
	}
	b.vals[b.n] = v
	b.h[k] = b.vals[b.n : b.n+1 : b.n+1]
	b.n++
}

// HeaderInto is Header writing into b (cleared first): the returned map is
// b's and is valid until b is reused.
func (d *Dispatch) HeaderInto(b *HeaderBuf) nats.Header {
	// The hot path of every dispatch: one map sized for every header and one
	// array backing every value (the names are canonical already, so no
	// Header.Set is needed).
	if b.h == nil {
		b.h = make(nats.Header, dispatchHeaders)
	} else {
		clear(b.h)
	}
	b.vals, b.n = [dispatchHeaders]string{}, 0
	put := b.Put
	put(HdrTaskID, d.TaskID)
	put(HdrType, d.Type)
	put(HdrModel, d.Model)
	put(HdrNode, d.Node)
	put(HdrAttempt, strconv.Itoa(d.Attempt))
	put(HdrMaxAttempts, strconv.Itoa(d.MaxAttempts))
	put(HdrDeadline, strconv.FormatInt(d.Deadline.UnixMilli(), 10))
	if d.Timeout > 0 {
		put(HdrTimeout, strconv.FormatInt(d.Timeout.Milliseconds(), 10))
	}
	if !d.Submitted.IsZero() {
		put(HdrSubmitted, strconv.FormatInt(d.Submitted.UnixMilli(), 10))
	}
	if d.Submission != "" {
		put(HdrTaskSeq, d.Submission)
	}
	if len(d.History) > 0 {
		hist, _ := json.Marshal(d.History) // plain strings and numbers: cannot fail
		put(HdrHistory, string(hist))
	}
	if d.Traceparent != "" {
		put(HdrTraceparent, d.Traceparent)
	}
	if d.TaskAck != "" {
		put(HdrTaskAck, d.TaskAck)
	}
	if d.TaskSum != "" {
		put(HdrTaskSum, d.TaskSum)
	}
	if d.Seal != "" {
		put(HdrSeal, d.Seal)
	}
	if d.Pipeline != "" {
		put(HdrPipeline, d.Pipeline)
	}
	return b.h
}

// dispatchHeaders is how many headers Header writes at most, plus one for
// the Nats-Msg-Id the publish adds.
const dispatchHeaders = 17

// MsgID is the Nats-Msg-Id of a message about this attempt: kind "d" for the
// dispatch, "o" for the worker's outcome, "l" for the sweeper's lost report.
func (d *Dispatch) MsgID(kind string) string {
	return MsgID(kind, d.TaskID, d.Submission, d.Attempt)
}

// ParseDispatch decodes dispatch headers strictly: a required header that is
// missing or unreadable, or an optional one present but unreadable, is an
// *Error with CodeInvalidDispatch naming the header. The returned Dispatch
// holds every field that could be read even then, so that a report about a
// bad dispatch can still be keyed. Absent optional headers take their zero
// values, which mean what the field docs say.
func ParseDispatch(h nats.Header) (Dispatch, error) {
	var d Dispatch
	var first *Error
	bad := func(name, format string, args ...any) {
		if first == nil {
			first = Errorf(CodeInvalidDispatch, "header %s: "+format, append([]any{name}, args...)...)
		}
	}
	get := func(name string) string {
		if v := h[name]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	required := func(name string) (string, bool) {
		v := get(name)
		if v == "" {
			bad(name, "missing")
			return "", false
		}
		return v, true
	}
	positive := func(name string, v string) (int64, bool) {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 {
			bad(name, "%q is not a positive integer", truncate(v, 32))
			return 0, false
		}
		return n, true
	}
	token := func(name string, max int) string {
		v, ok := required(name)
		if ok {
			if err := ValidToken(v, max); err != nil {
				bad(name, "%v", err)
			}
		}
		return v
	}
	if v := get(HdrDispatch); v != "" { // the compact encoding (compact.go)
		parseCompact(v, &d, bad)
		parseOptional(h, &d, bad)
		if first != nil {
			return d, first
		}
		return d, nil
	}
	d.TaskID = token(HdrTaskID, DefaultLimits.MaxIDLen)
	d.Type = token(HdrType, 64)
	d.Model = token(HdrModel, 128)
	d.Node = token(HdrNode, 64)
	if v, ok := required(HdrAttempt); ok {
		if n, ok := positive(HdrAttempt, v); ok {
			d.Attempt = int(n)
		}
	}
	if v, ok := required(HdrMaxAttempts); ok {
		if n, ok := positive(HdrMaxAttempts, v); ok {
			d.MaxAttempts = int(n)
			if d.Attempt > d.MaxAttempts {
				bad(HdrMaxAttempts, "%d is below the attempt number %d", d.MaxAttempts, d.Attempt)
			}
		}
	}
	if v, ok := required(HdrDeadline); ok {
		if ms, ok := positive(HdrDeadline, v); ok {
			d.Deadline = time.UnixMilli(ms)
		}
	}
	if v := get(HdrTimeout); v != "" {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms < 0 {
			bad(HdrTimeout, "%q is not a number of milliseconds", truncate(v, 32))
		} else {
			d.Timeout = time.Duration(ms) * time.Millisecond
		}
	}
	if v := get(HdrSubmitted); v != "" {
		if ms, ok := positive(HdrSubmitted, v); ok {
			d.Submitted = time.UnixMilli(ms)
		}
	}
	d.Submission = get(HdrTaskSeq)
	d.TaskSum, d.Seal = get(HdrTaskSum), get(HdrSeal)
	parseOptional(h, &d, bad)
	if first != nil {
		return d, first
	}
	return d, nil
}

// parseOptional reads the headers both encodings share: the history and
// the trace context.
func parseOptional(h nats.Header, d *Dispatch, bad func(name, format string, args ...any)) {
	if v := h[HdrHistory]; len(v) > 0 && v[0] != "" {
		var hist []Attempt
		if err := json.Unmarshal([]byte(v[0]), &hist); err != nil {
			bad(HdrHistory, "not a JSON array of attempts: %v", err)
		}
		d.History = hist
	}
	d.Traceparent = TraceparentOf(h)
	if v := h[HdrTaskAck]; len(v) > 0 {
		d.TaskAck = v[0]
	}
	if v := h[HdrPipeline]; len(v) > 0 {
		d.Pipeline = v[0]
	}
}

// OutcomeHeader is the header of an attempt's outcome: the dispatch's
// headers echoed (so that any dispatcher replica can settle the outcome
// without per-task state), except the Nats-* ones the server or the
// publisher set, with the reporting node. Headers this version does not
// know are echoed too. The values are shared with dispatch, not copied (a
// dozen allocations per task saved): neither header may be modified in
// place afterwards.
func OutcomeHeader(dispatch nats.Header, node string) nats.Header {
	h := make(nats.Header, len(dispatch)+1)
	for k, vs := range dispatch {
		if strings.HasPrefix(k, "Nats-") {
			continue
		}
		h[k] = vs
	}
	if _, compact := dispatch[HdrDispatch]; !compact {
		// v1: the reporting node replaces the chosen one (a compact
		// dispatch keeps the chosen node, checked against the subject's).
		h[HdrNode] = []string{node}
	}
	return h
}

// ResultHeader is the header of a task's result message, with the trace
// context the task ran in when it has one.
func ResultHeader(taskID, traceparent string) nats.Header {
	if traceparent != "" {
		return nats.Header{HdrTaskID: {taskID}, HdrTraceparent: {traceparent}}
	}
	return nats.Header{HdrTaskID: {taskID}}
}

// TraceparentOf returns the valid W3C traceparent of a message header
// (canonical "Traceparent" or the lowercase form W3C writes), or "".
func TraceparentOf(h nats.Header) string {
	v := h[HdrTraceparent]
	if len(v) == 0 {
		v = h["traceparent"]
	}
	if len(v) == 0 || !ValidTraceparent(v[0]) {
		return ""
	}
	return v[0]
}

// ValidTraceparent reports whether tp is a well-formed W3C traceparent:
// version 00 (or a later version, whose first four fields have the same
// form), non-zero trace and span ids, lowercase hex.
func ValidTraceparent(tp string) bool {
	// 00-<32 hex trace id>-<16 hex span id>-<2 hex flags>
	if len(tp) < 55 || tp[2] != '-' || tp[35] != '-' || tp[52] != '-' {
		return false
	}
	if tp[:2] == "ff" || (tp[:2] == "00" && len(tp) != 55) || (len(tp) > 55 && tp[55] != '-') {
		return false
	}
	hex := func(s string) (nonzero, ok bool) {
		for i := 0; i < len(s); i++ {
			c := s[i]
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
				return false, false
			}
			nonzero = nonzero || c != '0'
		}
		return nonzero, true
	}
	_, okV := hex(tp[:2])
	_, okF := hex(tp[53:55])
	trace, okT := hex(tp[3:35])
	span, okS := hex(tp[36:52])
	return okV && okF && okT && okS && trace && span
}

// A direct report's answer. A worker reports a success as a core-NATS
// request carrying the dispatch's headers (above); the dispatcher answers it
// with a ReportReply once the result is stored.

// ReportStatus is a dispatcher's answer to a direct report
// (docs/protocol.md, "Direct reports").
type ReportStatus string

const (
	// ReportAcked: the task's result is stored and the dispatcher has
	// acknowledged the dispatch itself (the report named it in HdrAck): the
	// worker acks nothing.
	ReportAcked ReportStatus = "acked"
	// ReportSettled: the outcome is settled (its result stored, or the
	// report refused as forged or late): the worker acks its dispatch.
	ReportSettled ReportStatus = "settled"
	// ReportDeferred: the dispatcher could not settle it at once (not a
	// success, headers that do not parse, a result it could not store): the
	// worker stores the outcome in MLSCHED_OUTCOMES.
	ReportDeferred ReportStatus = "deferred"
)

// ReportReply is the body of the answer to a direct report.
type ReportReply struct {
	Status ReportStatus `json:"status"`
	// Reason says why a report was deferred.
	Reason string `json:"reason,omitempty"`
}

// The two answers of the hot path, encoded once.
var (
	replyAcked   = []byte(`{"status":"acked"}`)
	replySettled = []byte(`{"status":"settled"}`)
)

// AppendJSON appends the reply's JSON (json.Marshal's bytes).
func (r ReportReply) AppendJSON(b []byte) []byte {
	switch {
	case r.Reason == "" && r.Status == ReportAcked:
		return append(b, replyAcked...)
	case r.Reason == "" && r.Status == ReportSettled:
		return append(b, replySettled...)
	}
	data, _ := json.Marshal(r) // two strings: cannot fail
	return append(b, data...)
}

// DecodeReportReply reads the answer to a direct report. A reply that is
// not one (empty, not JSON, an unknown status) is an error: the worker then
// stores the outcome, which is always safe.
func DecodeReportReply(b []byte) (ReportReply, error) {
	switch {
	case bytes.Equal(b, replyAcked):
		return ReportReply{Status: ReportAcked}, nil
	case bytes.Equal(b, replySettled):
		return ReportReply{Status: ReportSettled}, nil
	}
	var r ReportReply
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("answer to a direct report: %w", err)
	}
	switch r.Status {
	case ReportAcked, ReportSettled, ReportDeferred:
		return r, nil
	}
	return r, fmt.Errorf("answer to a direct report: unknown status %q", r.Status)
}

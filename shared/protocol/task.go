package protocol

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Task is what a producer publishes to mlsched.tasks.<type>. Unknown fields
// are ignored. Zero values mean "use the configured default".
type Task struct {
	ID      string          `json:"id"`
	Type    string          `json:"type"`
	Payload json.RawMessage `json:"payload,omitempty"`
	// Models is an optional allow-list of model names.
	Models      []string `json:"models,omitempty"`
	TimeoutMs   int64    `json:"timeout_ms,omitempty"`
	MaxAttempts int      `json:"max_attempts,omitempty"`
	// MaxLatencyMs asks for the most reliable model whose p95 fits the budget.
	MaxLatencyMs int64 `json:"max_latency_ms,omitempty"`
	// MinSuccessRate excludes models whose smoothed success rate is lower.
	MinSuccessRate float64 `json:"min_success_rate,omitempty"`
	// Priority orders tasks: higher is served first, -10..10, default 0.
	// Negative means sheddable: shed first when the cluster cannot keep up
	// (docs/policies.md, "Flow control").
	Priority int `json:"priority,omitempty"`
	// Tenant is the fairness and quota key, one subject token; empty means
	// DefaultTenant.
	Tenant string `json:"tenant,omitempty"`
	// DeadlineMs is the task's whole budget from submission, queueing
	// included: past it the task is not started and fails with
	// CodeExpired. Zero: none (or the type's configured default).
	DeadlineMs int64 `json:"deadline_ms,omitempty"`
	// Size is how much work the task carries, in the type's own unit
	// (tokens, pixels, seconds of audio): a model's latency and cost may
	// grow with it. Zero: unknown.
	Size float64 `json:"size,omitempty"`
	// Pipeline, when set, makes the task a pipeline of steps
	// (pipeline.go, docs/protocol.md "Pipelines").
	Pipeline *Pipeline `json:"pipeline,omitempty"`
}

// Priority bounds and the default tenant.
const (
	MinPriority   = -10
	MaxPriority   = 10
	DefaultTenant = "default"
	// MaxTenantLen bounds a tenant name in bytes.
	MaxTenantLen = 64
)

// TenantName is the task's tenant, DefaultTenant when it names none.
func (t *Task) TenantName() string {
	if t.Tenant == "" {
		return DefaultTenant
	}
	return t.Tenant
}

// Limits bound what a task may carry. The zero value applies DefaultLimits.
type Limits struct {
	// MaxPayloadBytes bounds the raw task message (default 1 MiB).
	MaxPayloadBytes int
	// MaxModels bounds the allow-list length (default 64).
	MaxModels int
	// MaxIDLen bounds the id length in bytes (default 128).
	MaxIDLen int
	// MaxTimeoutMs bounds timeout_ms (default 1 hour).
	MaxTimeoutMs int64
	// MaxAttempts bounds max_attempts (default 10).
	MaxAttempts int
	// MaxDeadlineMs bounds deadline_ms (default 24 hours).
	MaxDeadlineMs int64
	// MaxSize bounds size (default 1e12).
	MaxSize float64
}

// DefaultLimits are applied for every zero field of Limits.
var DefaultLimits = Limits{
	MaxPayloadBytes: 1 << 20,
	MaxModels:       64,
	MaxIDLen:        128,
	MaxTimeoutMs:    3_600_000,
	MaxAttempts:     10,
	MaxDeadlineMs:   86_400_000,
	MaxSize:         1e12,
}

func (l Limits) withDefaults() Limits {
	if l.MaxPayloadBytes <= 0 {
		l.MaxPayloadBytes = DefaultLimits.MaxPayloadBytes
	}
	if l.MaxModels <= 0 {
		l.MaxModels = DefaultLimits.MaxModels
	}
	if l.MaxIDLen <= 0 {
		l.MaxIDLen = DefaultLimits.MaxIDLen
	}
	if l.MaxTimeoutMs <= 0 {
		l.MaxTimeoutMs = DefaultLimits.MaxTimeoutMs
	}
	if l.MaxAttempts <= 0 {
		l.MaxAttempts = DefaultLimits.MaxAttempts
	}
	if l.MaxDeadlineMs <= 0 {
		l.MaxDeadlineMs = DefaultLimits.MaxDeadlineMs
	}
	if l.MaxSize <= 0 {
		l.MaxSize = DefaultLimits.MaxSize
	}
	return l
}

// DecodeTask decodes and validates a task message. On failure it returns an
// *Error; the returned Task still carries whatever id could be read, so that
// the caller can key a rejected result by it (an empty or invalid ID means the
// message is unkeyable and belongs in the dead-letter stream).
func DecodeTask(data []byte, lim Limits) (Task, error) {
	lim = lim.withDefaults()
	var t Task
	if len(data) > lim.MaxPayloadBytes {
		t.ID, t.Type = peekHead(data, lim.MaxIDLen)
		return t, Errorf(CodePayloadTooLarge, "task is %d bytes, the limit is %d", len(data), lim.MaxPayloadBytes)
	}
	// codec.go's decoder when it accepts the task; every error through
	// encoding/json, whose messages are the ones producers see.
	if t, ok := decodeTaskFast(data); ok {
		return t, t.Validate(lim)
	}
	return decodeTaskReflect(data, lim)
}

// decodeTaskFast decodes a task through codec.go's fast decoder. It
// reports false for anything DecodeTask must reject on syntax (invalid JSON
// or UTF-8, not an object), so that decodeTaskReflect words the error.
// FuzzDecodeTask holds the two to the same tasks and errors.
func decodeTaskFast(data []byte) (Task, bool) {
	var t Task
	trimmed := bytes.TrimLeft(data, " \t\r\n")
	if len(trimmed) == 0 || trimmed[0] != '{' || !decodeFast(data, &t) {
		return Task{}, false
	}
	return t, true
}

// decodeTaskReflect is DecodeTask through encoding/json: the reference
// decodeTaskFast must agree with, and the words of every syntax error.
func decodeTaskReflect(data []byte, lim Limits) (Task, error) {
	var t Task
	if !utf8.Valid(data) {
		t.ID, t.Type = peekHead(data, lim.MaxIDLen) // keyable when the bad bytes are elsewhere
		return t, Errorf(CodeInvalidUTF8, "task is not valid UTF-8")
	}
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 {
		return t, Errorf(CodeMalformedJSON, "task is empty")
	}
	if trimmed[0] != '{' {
		if json.Valid(trimmed) {
			return t, Errorf(CodeNotObject, "task must be a JSON object")
		}
		return t, Errorf(CodeMalformedJSON, "task is not valid JSON")
	}
	if err := json.Unmarshal(trimmed, &t); err != nil {
		t = Task{}
		t.ID, t.Type = peekHead(trimmed, lim.MaxIDLen)
		var ute *json.UnmarshalTypeError
		if asType(err, &ute) {
			if ute.Field == "id" { // not a string: nothing can key a result
				return Task{}, Errorf(CodeInvalidID, "id must be a string, not a JSON %s", ute.Value)
			}
			return t, Errorf(CodeInvalidField, "field %q has the wrong type: %v", ute.Field, err)
		}
		return t, Errorf(CodeMalformedJSON, "task is not valid JSON: %v", err)
	}
	return t, t.Validate(lim)
}

// Validate checks a decoded task against the limits.
func (t *Task) Validate(lim Limits) error {
	lim = lim.withDefaults()
	if t.ID == "" {
		return Errorf(CodeMissingID, "task has no id")
	}
	if err := ValidToken(t.ID, lim.MaxIDLen); err != nil {
		id := t.ID
		t.ID = "" // unkeyable: it cannot name a result subject
		return Errorf(CodeInvalidID, "id %q: %v", truncate(id, 64), err)
	}
	if t.Type == "" {
		return Errorf(CodeMissingType, "task has no type")
	}
	if err := ValidToken(t.Type, 64); err != nil {
		return Errorf(CodeInvalidType, "type %q: %v", truncate(t.Type, 64), err)
	}
	if t.TimeoutMs < 0 || t.TimeoutMs > lim.MaxTimeoutMs {
		return Errorf(CodeInvalidTimeout, "timeout_ms %d is outside 0..%d", t.TimeoutMs, lim.MaxTimeoutMs)
	}
	if t.MaxAttempts < 0 || t.MaxAttempts > lim.MaxAttempts {
		return Errorf(CodeInvalidMaxAttempts, "max_attempts %d is outside 0..%d", t.MaxAttempts, lim.MaxAttempts)
	}
	if t.MaxLatencyMs < 0 {
		return Errorf(CodeInvalidField, "max_latency_ms %d is negative", t.MaxLatencyMs)
	}
	if t.MinSuccessRate < 0 || t.MinSuccessRate > 1 {
		return Errorf(CodeInvalidField, "min_success_rate %g is outside 0..1", t.MinSuccessRate)
	}
	if t.Priority < MinPriority || t.Priority > MaxPriority {
		return Errorf(CodeInvalidPriority, "priority %d is outside %d..%d", t.Priority, MinPriority, MaxPriority)
	}
	if t.Tenant != "" {
		if err := ValidToken(t.Tenant, MaxTenantLen); err != nil {
			return Errorf(CodeInvalidTenant, "tenant %q: %v", truncate(t.Tenant, 64), err)
		}
	}
	if t.DeadlineMs < 0 || t.DeadlineMs > lim.MaxDeadlineMs {
		return Errorf(CodeInvalidDeadline, "deadline_ms %d is outside 0..%d", t.DeadlineMs, lim.MaxDeadlineMs)
	}
	if !(t.Size >= 0 && t.Size <= lim.MaxSize) { // NaN fails too
		return Errorf(CodeInvalidField, "size %g is outside 0..%g", t.Size, lim.MaxSize)
	}
	if len(t.Models) > lim.MaxModels {
		return Errorf(CodeTooManyModels, "allow-list has %d models, the limit is %d", len(t.Models), lim.MaxModels)
	}
	for _, m := range t.Models {
		if err := ValidToken(m, 128); err != nil {
			return Errorf(CodeUnknownModel, "allow-list entry %q: %v", truncate(m, 64), err)
		}
	}
	if t.Pipeline != nil {
		return t.Pipeline.Validate(t.Type, lim)
	}
	return nil
}

// ValidToken reports whether s can be used as one NATS subject token and a
// Redis key part: 1..max bytes of printable ASCII without '.', '*', '>' or
// white space.
func ValidToken(s string, max int) error {
	if s == "" {
		return fmt.Errorf("is empty")
	}
	if len(s) > max {
		return fmt.Errorf("is %d bytes long, the limit is %d", len(s), max)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c <= ' ' || c >= 0x7f:
			return fmt.Errorf("contains white space, a control or a non-ASCII character at byte %d", i)
		case c == '.' || c == '*' || c == '>':
			return fmt.Errorf("contains %q, which is reserved in subjects", c)
		}
	}
	return nil
}

// peekHead recovers the top-level string "id" and "type" of a message that
// failed full decoding (invalid JSON, a field of the wrong type, invalid
// UTF-8 elsewhere, too large), so that its rejection is a result the
// producer waiting on mlsched.results.<id> can read, of the type it sent,
// rather than a dead letter the producer's credentials cannot read. It reads
// the object member by member and stops at the first syntax error: a
// truncated or otherwise broken message keeps the members before the break.
// As in encoding/json, the last of repeated members counts. The id follows
// Validate's rules with the configured length limit, the type a type's;
// either is "" when it cannot be used.
func peekHead(data []byte, maxIDLen int) (id, typ string) {
	dec := json.NewDecoder(bytes.NewReader(data))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return "", ""
	}
	var rawID, rawType string
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			break
		}
		name, _ := key.(string)
		if name != "id" && name != "type" {
			var skip json.RawMessage // skips the value without tokenising it
			if dec.Decode(&skip) != nil {
				break
			}
			continue
		}
		val, err := dec.Token()
		if err != nil {
			break
		}
		s, isString := val.(string)
		if d, ok := val.(json.Delim); ok && (d == '{' || d == '[') {
			// An object or array: not usable, and its members must not
			// be mistaken for the task's.
			if skipNested(dec) != nil {
				break
			}
		}
		if !isString {
			s = ""
		}
		if name == "id" {
			rawID = s
		} else {
			rawType = s
		}
	}
	if ValidToken(rawID, maxIDLen) != nil {
		return "", ""
	}
	if ValidToken(rawType, 64) != nil {
		rawType = ""
	}
	return rawID, rawType
}

// skipNested consumes tokens up to the end of the object or array whose
// opening delimiter dec has just returned.
func skipNested(dec *json.Decoder) error {
	for depth := 1; depth > 0; {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		if d, ok := tok.(json.Delim); ok {
			if d == '{' || d == '[' {
				depth++
			} else {
				depth--
			}
		}
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}

package protocol

import (
	"encoding/json"
	"fmt"
	"strconv"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// jsonscan.go is a small strict JSON reader for the messages on the hot
// path, decoded once per task: one pass, no reflection, and no copies of
// the raw values it hands out. It accepts exactly what encoding/json
// accepts and decodes a member as json.Unmarshal would decode it into a
// field of the same type (string, int, float64, json.RawMessage), matching
// member names as encoding/json does (exact, else case-insensitively);
// the fuzz tests hold it to that, against encoding/json itself.

// maxJSONDepth is encoding/json's nesting limit.
const maxJSONDepth = 10000

// JSONError is a syntax or type error found by the hot-path decoders, at a
// byte offset of the message.
type JSONError struct {
	Offset int
	Msg    string
}

func (e *JSONError) Error() string { return fmt.Sprintf("%s (at byte %d)", e.Msg, e.Offset) }

// jsonReader reads one JSON document from data.
type jsonReader struct {
	data []byte
	pos  int
}

func (r *jsonReader) fail(format string, args ...any) error {
	return &JSONError{Offset: r.pos, Msg: fmt.Sprintf(format, args...)}
}

func (r *jsonReader) unexpected() error {
	if r.pos >= len(r.data) {
		return r.fail("unexpected end of JSON input")
	}
	return r.fail("invalid character %q", r.data[r.pos])
}

func (r *jsonReader) ws() {
	for r.pos < len(r.data) {
		switch r.data[r.pos] {
		case ' ', '\t', '\n', '\r':
			r.pos++
		default:
			return
		}
	}
}

// peek returns the next byte (0 at the end).
func (r *jsonReader) peek() byte {
	if r.pos < len(r.data) {
		return r.data[r.pos]
	}
	return 0
}

// end checks that only white space follows the document.
func (r *jsonReader) end() error {
	r.ws()
	if r.pos < len(r.data) {
		return r.fail("invalid character %q after top-level value", r.data[r.pos])
	}
	return nil
}

// object reads the object at pos (depth its nesting level, 1 at the top),
// calling member for each member with its unquoted name, pos at the value:
// member must consume the value.
func (r *jsonReader) object(depth int, member func(key []byte) error) error {
	if depth > maxJSONDepth {
		return r.fail("exceeded max depth")
	}
	r.pos++ // '{'
	r.ws()
	if r.peek() == '}' {
		r.pos++
		return nil
	}
	for {
		if r.peek() != '"' {
			return r.unexpected()
		}
		raw, escaped, err := r.str()
		if err != nil {
			return err
		}
		key := raw
		if escaped {
			key = unquoteJSON(raw)
		}
		r.ws()
		if r.peek() != ':' {
			return r.unexpected()
		}
		r.pos++
		r.ws()
		if err := member(key); err != nil {
			return err
		}
		r.ws()
		switch r.peek() {
		case ',':
			r.pos++
			r.ws()
		case '}':
			r.pos++
			return nil
		default:
			return r.unexpected()
		}
	}
}

// document reads data as one JSON value that must be an object, each
// member through member, or null (nothing set), as json.Unmarshal into a
// struct does; any other value is an error naming what ("an outcome").
func (r *jsonReader) document(what string, member func(key []byte) error) error {
	r.ws()
	var err error
	switch r.peek() {
	case '{':
		err = r.object(1, member)
	case 'n': // json.Unmarshal leaves the value as it was
		err = r.literal("null")
	default:
		if err = r.skip(0); err == nil {
			if err = r.end(); err == nil {
				err = &JSONError{Offset: 0, Msg: what + " must be a JSON object"}
			}
		}
	}
	if err == nil {
		err = r.end()
	}
	return err
}

// skip reads and validates any value at pos (depth the nesting level of
// the enclosing object or array).
func (r *jsonReader) skip(depth int) error {
	switch c := r.peek(); {
	case c == '{':
		return r.object(depth+1, func([]byte) error { return r.skip(depth + 1) })
	case c == '[':
		if depth+1 > maxJSONDepth {
			return r.fail("exceeded max depth")
		}
		r.pos++
		r.ws()
		if r.peek() == ']' {
			r.pos++
			return nil
		}
		for {
			if err := r.skip(depth + 1); err != nil {
				return err
			}
			r.ws()
			switch r.peek() {
			case ',':
				r.pos++
				r.ws()
			case ']':
				r.pos++
				return nil
			default:
				return r.unexpected()
			}
		}
	case c == '"':
		_, _, err := r.str()
		return err
	case c == '-' || c >= '0' && c <= '9':
		_, err := r.number()
		return err
	case c == 't':
		return r.literal("true")
	case c == 'f':
		return r.literal("false")
	case c == 'n':
		return r.literal("null")
	default:
		return r.unexpected()
	}
}

func (r *jsonReader) literal(lit string) error {
	for i := 0; i < len(lit); i++ {
		if r.peek() != lit[i] {
			return r.unexpected()
		}
		r.pos++
	}
	return nil
}

// str reads the string at pos and returns its raw contents (between the
// quotes, aliasing data) and whether it has escapes.
func (r *jsonReader) str() (raw []byte, escaped bool, err error) {
	r.pos++ // '"'
	start := r.pos
	for r.pos < len(r.data) {
		c := r.data[r.pos]
		switch {
		case c == '"':
			raw = r.data[start:r.pos]
			r.pos++
			return raw, escaped, nil
		case c == '\\':
			escaped = true
			r.pos++
			switch r.peek() {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				r.pos++
			case 'u':
				r.pos++
				for range 4 {
					if !isHex(r.peek()) {
						return nil, false, r.fail("invalid character %q in \\u hexadecimal character escape", r.peek())
					}
					r.pos++
				}
			default:
				if r.pos >= len(r.data) {
					return nil, false, r.unexpected()
				}
				return nil, false, r.fail("invalid character %q in string escape code", r.peek())
			}
		case c < ' ':
			return nil, false, r.fail("invalid character %q in string literal", c)
		default:
			r.pos++
		}
	}
	return nil, false, r.unexpected()
}

// number reads the number at pos and returns its literal.
func (r *jsonReader) number() ([]byte, error) {
	start := r.pos
	if r.peek() == '-' {
		r.pos++
	}
	switch c := r.peek(); {
	case c == '0':
		r.pos++
	case c >= '1' && c <= '9':
		r.digits()
	default:
		return nil, r.unexpected()
	}
	if r.peek() == '.' {
		r.pos++
		if !isDigit(r.peek()) {
			return nil, r.unexpected()
		}
		r.digits()
	}
	if c := r.peek(); c == 'e' || c == 'E' {
		r.pos++
		if c := r.peek(); c == '+' || c == '-' {
			r.pos++
		}
		if !isDigit(r.peek()) {
			return nil, r.unexpected()
		}
		r.digits()
	}
	return r.data[start:r.pos], nil
}

func (r *jsonReader) digits() {
	for isDigit(r.peek()) {
		r.pos++
	}
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func isHex(c byte) bool { return isDigit(c) || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' }

// typeError reads (validating) the value at pos, which does not fit the
// member, and returns json's kind of error for it.
func (r *jsonReader) typeError(name, want string) error {
	at := r.pos
	if err := r.skip(1); err != nil {
		return err
	}
	return &JSONError{Offset: at, Msg: fmt.Sprintf("field %q: want %s, got %s", name, want, kindOf(r.data[at]))}
}

func kindOf(c byte) string {
	switch c {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	default:
		return "a number"
	}
}

// Decoders of one member into a field, as json.Unmarshal decodes it: a
// null leaves the field unchanged (a json.RawMessage takes it as "null").

func (r *jsonReader) stringField(name string, dst *string) error {
	switch r.peek() {
	case '"':
		raw, escaped, err := r.str()
		if err != nil {
			return err
		}
		if escaped {
			*dst = string(unquoteJSON(raw))
		} else {
			*dst = unquotedString(raw)
		}
		return nil
	case 'n':
		return r.literal("null")
	}
	return r.typeError(name, "a string")
}

func (r *jsonReader) intField(name string, dst *int) error {
	switch c := r.peek(); {
	case c == '-' || isDigit(c):
		at := r.pos
		lit, err := r.number()
		if err != nil {
			return err
		}
		n, ok := parseJSONInt(lit)
		if !ok {
			return &JSONError{Offset: at, Msg: fmt.Sprintf("field %q: number %s is not an integer in range", name, lit)}
		}
		*dst = n
		return nil
	case c == 'n':
		return r.literal("null")
	}
	return r.typeError(name, "a number")
}

// int64Field is intField for an int64 (the *_ms fields).
func (r *jsonReader) int64Field(name string, dst *int64) error {
	n := int(*dst)
	if err := r.intField(name, &n); err != nil {
		return err
	}
	*dst = int64(n)
	return nil
}

// stringsField decodes an array of strings as encoding/json decodes into
// a []string (arrayInto's rules; a null element keeps its entry).
func (r *jsonReader) stringsField(name string, dst *[]string) error {
	return arrayInto(r, name, dst, func(e *string) error { return r.stringField(name, e) })
}

// arrayInto decodes the array at pos into *dst as encoding/json decodes
// into a slice: null sets it to nil; an array decodes its i-th element
// (through elem) into the i-th entry already there (not zeroed) or a new
// one, and the slice ends at the array's length (empty, not nil, for []).
func arrayInto[T any](r *jsonReader, name string, dst *[]T, elem func(*T) error) error {
	switch r.peek() {
	case 'n':
		if err := r.literal("null"); err != nil {
			return err
		}
		*dst = nil
		return nil
	case '[':
	default:
		return r.typeError(name, "an array")
	}
	s := *dst
	n := 0
	r.pos++
	r.ws()
	if r.peek() == ']' {
		r.pos++
		*dst = []T{}
		return nil
	}
	for {
		switch { // as reflect grows it: a slot past len within cap keeps its old entry
		case n < len(s):
		case n < cap(s):
			s = s[:n+1]
		default:
			var zero T
			s = append(s, zero)
		}
		if err := elem(&s[n]); err != nil {
			return err
		}
		n++
		r.ws()
		switch r.peek() {
		case ',':
			r.pos++
			r.ws()
		case ']':
			r.pos++
			*dst = s[:n]
			return nil
		default:
			return r.unexpected()
		}
	}
}

func (r *jsonReader) floatField(name string, dst *float64) error {
	switch c := r.peek(); {
	case c == '-' || isDigit(c):
		at := r.pos
		lit, err := r.number()
		if err != nil {
			return err
		}
		f, err := strconv.ParseFloat(string(lit), 64)
		if err != nil {
			return &JSONError{Offset: at, Msg: fmt.Sprintf("field %q: number %s is out of range", name, lit)}
		}
		*dst = f
		return nil
	case c == 'n':
		return r.literal("null")
	}
	return r.typeError(name, "a number")
}

// rawField takes the value's bytes as they are, aliasing data (capacity
// capped, so that an append to it cannot write into data).
func (r *jsonReader) rawField(depth int, dst *json.RawMessage) error {
	start := r.pos
	if err := r.skip(depth); err != nil {
		return err
	}
	*dst = r.data[start:r.pos:r.pos]
	return nil
}

// parseJSONInt parses an integer literal as json.Unmarshal does into an
// int: no fraction or exponent, within int's range.
func parseJSONInt(lit []byte) (int, bool) {
	neg := len(lit) > 0 && lit[0] == '-'
	digits := lit
	if neg {
		digits = lit[1:]
	}
	if len(digits) == 0 || len(digits) > 18 { // 18 digits cannot overflow int64
		n, err := strconv.ParseInt(string(lit), 10, strconv.IntSize)
		return int(n), err == nil
	}
	n := 0
	for _, c := range digits {
		if !isDigit(c) {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	if neg {
		n = -n
	}
	if strconv.IntSize == 32 && int64(n) != int64(int32(n)) {
		return 0, false
	}
	return n, true
}

// unquotedString is the string of raw contents without escapes, with
// invalid UTF-8 replaced by U+FFFD as encoding/json does.
func unquotedString(raw []byte) string {
	for i := 0; i < len(raw); i++ {
		if raw[i] >= utf8.RuneSelf {
			if !utf8.Valid(raw[i:]) {
				return string(unquoteJSON(raw))
			}
			break
		}
	}
	return string(raw)
}

// unquoteJSON decodes a string's validated raw contents as encoding/json
// does: escapes decoded, an unpaired surrogate and invalid UTF-8 replaced
// by U+FFFD.
func unquoteJSON(raw []byte) []byte {
	b := make([]byte, 0, len(raw)+utf8.UTFMax)
	for i := 0; i < len(raw); {
		c := raw[i]
		switch {
		case c == '\\':
			e := raw[i+1]
			i += 2
			switch e {
			case 'b':
				b = append(b, '\b')
			case 'f':
				b = append(b, '\f')
			case 'n':
				b = append(b, '\n')
			case 'r':
				b = append(b, '\r')
			case 't':
				b = append(b, '\t')
			case 'u':
				rr := hex4(raw[i:])
				i += 4
				if utf16.IsSurrogate(rr) {
					if i+6 <= len(raw) && raw[i] == '\\' && raw[i+1] == 'u' {
						if dec := utf16.DecodeRune(rr, hex4(raw[i+2:])); dec != unicode.ReplacementChar {
							i += 6
							b = utf8.AppendRune(b, dec)
							continue
						}
					}
					rr = unicode.ReplacementChar
				}
				b = utf8.AppendRune(b, rr)
			default: // '"', '\\', '/'
				b = append(b, e)
			}
		case c < utf8.RuneSelf:
			b = append(b, c)
			i++
		default:
			rr, n := utf8.DecodeRune(raw[i:])
			b = utf8.AppendRune(b, rr) // U+FFFD for an invalid byte
			i += n
		}
	}
	return b
}

// hex4 decodes four validated hex digits (-1 when they are not).
func hex4(s []byte) rune {
	if len(s) < 4 {
		return -1
	}
	var r rune
	for _, c := range s[:4] {
		switch {
		case isDigit(c):
			c -= '0'
		case c >= 'a' && c <= 'f':
			c = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			c = c - 'A' + 10
		default:
			return -1
		}
		r = r*16 + rune(c)
	}
	return r
}

// fieldIndex returns the index in names of the member name key, matched as
// encoding/json matches a member to a field: exactly, else ignoring case
// by Unicode simple folding. names are lower-case ASCII.
func fieldIndex(key []byte, names []string) int {
	for i, n := range names {
		if string(key) == n {
			return i
		}
	}
	for i, n := range names {
		if foldEqual(key, n) {
			return i
		}
	}
	return -1
}

// foldEqual reports whether key folds to the lower-case ASCII name: each
// rune compared by the smallest rune of its fold set (so the Kelvin sign
// matches k, as in encoding/json).
func foldEqual(key []byte, name string) bool {
	j := 0
	for i := 0; i < len(key); {
		r := rune(key[i])
		if r < utf8.RuneSelf {
			i++
		} else {
			var n int
			r, n = utf8.DecodeRune(key[i:])
			i += n
			r = foldRune(r)
		}
		if r >= 'a' && r <= 'z' {
			r -= 'a' - 'A'
		}
		if j >= len(name) {
			return false
		}
		c := rune(name[j])
		if c >= 'a' && c <= 'z' {
			c -= 'a' - 'A'
		}
		if r != c {
			return false
		}
		j++
	}
	return j == len(name)
}

// foldRune returns the smallest rune of r's fold set.
func foldRune(r rune) rune {
	for {
		r2 := unicode.SimpleFold(r)
		if r2 <= r {
			return r2
		}
		r = r2
	}
}

// outcomeFields are Outcome's JSON member names, in decodeOutcomeMember's
// order.
var outcomeFields = []string{"task_id", "type", "attempt", "model", "node", "status", "output", "error", "latency_ms", "task"}

// DecodeOutcome decodes an outcome message exactly as json.Unmarshal into
// an Outcome would (same inputs accepted, same fields), in one pass and
// without reflection: the dispatcher decodes one per attempt. Output and
// Task alias data, which must not change afterwards. On error the Outcome
// is not usable.
func DecodeOutcome(data []byte) (Outcome, error) {
	var o Outcome
	r := jsonReader{data: data}
	err := r.document("an outcome", func(key []byte) error {
		switch fieldIndex(key, outcomeFields) {
		case 0:
			return r.stringField("task_id", &o.TaskID)
		case 1:
			return r.stringField("type", &o.Type)
		case 2:
			return r.intField("attempt", &o.Attempt)
		case 3:
			return r.stringField("model", &o.Model)
		case 4:
			return r.stringField("node", &o.Node)
		case 5:
			return r.statusField(&o.Status)
		case 6:
			return r.rawField(1, &o.Output)
		case 7:
			return r.stringField("error", &o.Error)
		case 8:
			return r.floatField("latency_ms", &o.LatencyMs)
		case 9:
			return r.rawField(1, &o.Task)
		}
		return r.skip(1)
	})
	if err != nil {
		return Outcome{}, err
	}
	return o, nil
}

// outcomeStatuses are the statuses a worker sends, shared instead of
// allocated per outcome.
var outcomeStatuses = []OutcomeStatus{OutcomeSuccess, OutcomeModelError, OutcomeTimeout, OutcomeTaskError,
	OutcomeExpired, OutcomeLost}

func (r *jsonReader) statusField(dst *OutcomeStatus) error {
	if r.peek() == '"' {
		save := r.pos
		raw, escaped, err := r.str()
		if err != nil {
			return err
		}
		if !escaped {
			for _, s := range outcomeStatuses {
				if string(raw) == string(s) {
					*dst = s
					return nil
				}
			}
		}
		r.pos = save
	}
	var s string
	s = string(*dst)
	if err := r.stringField("status", &s); err != nil {
		return err
	}
	*dst = OutcomeStatus(s)
	return nil
}

// taskHeadFields are the task members DecodeTaskHead reads.
var taskHeadFields = []string{"id", "type", "payload"}

// DecodeTaskHead decodes a task message's id, type and payload, and nothing
// else, exactly as json.Unmarshal would into a struct of those three fields
// (string, string, json.RawMessage), in one pass: what a worker needs of a
// dispatch the dispatcher validated. The payload aliases data.
func DecodeTaskHead(data []byte) (id, typ string, payload json.RawMessage, err error) {
	r := jsonReader{data: data}
	err = r.document("a task", func(key []byte) error {
		switch fieldIndex(key, taskHeadFields) {
		case 0:
			return r.stringField("id", &id)
		case 1:
			return r.stringField("type", &typ)
		case 2:
			return r.rawField(1, &payload)
		}
		return r.skip(1)
	})
	if err != nil {
		return "", "", nil, err
	}
	return id, typ, payload, nil
}

// resultFields and attemptFields are Result's and Attempt's JSON member
// names, in DecodeResult's order.
var (
	resultFields  = []string{"id", "type", "status", "model", "node", "attempts", "output", "error", "error_code", "latency_ms", "history", "finished_at", "retry_after_ms"}
	attemptFields = []string{"attempt", "model", "node", "status", "error", "latency_ms"}
)

// DecodeResult decodes a result message exactly as json.Unmarshal into a
// Result would (same inputs accepted, same fields, encoding/json's quirks
// included: a repeated "history" decodes into the entries already there),
// in one pass and without reflection: what a producer pays per result it
// reads. Output aliases data, which must not change afterwards. On error
// the Result is not usable.
func DecodeResult(data []byte) (Result, error) {
	var res Result
	r := jsonReader{data: data}
	err := r.document("a result", func(key []byte) error {
		switch fieldIndex(key, resultFields) {
		case 0:
			return r.stringField("id", &res.ID)
		case 1:
			return r.stringField("type", &res.Type)
		case 2:
			return r.stringField("status", (*string)(&res.Status))
		case 3:
			return r.stringField("model", &res.Model)
		case 4:
			return r.stringField("node", &res.Node)
		case 5:
			return r.intField("attempts", &res.Attempts)
		case 6:
			return r.rawField(1, &res.Output)
		case 7:
			return r.stringField("error", &res.Error)
		case 8:
			return r.stringField("error_code", (*string)(&res.ErrorCode))
		case 9:
			return r.floatField("latency_ms", &res.LatencyMs)
		case 10:
			return r.history(&res.History)
		case 11:
			var raw json.RawMessage
			if err := r.rawField(1, &raw); err != nil {
				return err
			}
			if err := res.FinishedAt.UnmarshalJSON(raw); err != nil {
				return &JSONError{Offset: r.pos, Msg: "field \"finished_at\": " + err.Error()}
			}
			return nil
		case 12:
			return r.intField("retry_after_ms", &res.RetryAfterMs)
		}
		return r.skip(1)
	})
	if err != nil {
		return Result{}, err
	}
	return res, nil
}

// history decodes a result's "history" as encoding/json decodes into a
// []Attempt (arrayInto's rules).
func (r *jsonReader) history(dst *[]Attempt) error {
	return arrayInto(r, "history", dst, r.attempt)
}

// attempt decodes one history entry into a (null leaves it).
func (r *jsonReader) attempt(a *Attempt) error {
	switch r.peek() {
	case 'n':
		return r.literal("null")
	case '{':
	default:
		return r.typeError("history", "an object")
	}
	return r.object(3, func(key []byte) error {
		switch fieldIndex(key, attemptFields) {
		case 0:
			return r.intField("attempt", &a.Attempt)
		case 1:
			return r.stringField("model", &a.Model)
		case 2:
			return r.stringField("node", &a.Node)
		case 3:
			return r.stringField("status", (*string)(&a.Status))
		case 4:
			return r.stringField("error", &a.Error)
		case 5:
			return r.floatField("latency_ms", &a.LatencyMs)
		}
		return r.skip(3)
	})
}

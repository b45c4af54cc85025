package protocol

import (
	"strconv"
	"unicode/utf8"
)

// decodeTaskFast is DecodeTask's single pass for the common shape of a task:
// one JSON object whose keys are Task's field names exactly (others are
// skipped), unescaped strings for id, type, tenant and models, integers for the
// *_ms, max_attempts and priority fields, any valid JSON as payload. It validates the
// JSON syntax and the UTF-8 of the whole message as it decodes. Whenever the
// input is anything else (invalid, an escape in a field's string, a key
// that only case-insensitively names a field, a duplicate key, a null, a
// number out of range...), it returns false and DecodeTask takes the
// reflection path, whose result and errors are the reference: what this
// function returns with true must equal what encoding/json decodes
// (FuzzDecodeTaskFast checks it).
func decodeTaskFast(data []byte) (Task, bool) {
	var t Task
	s := fastScanner{b: data}
	s.space()
	if !s.byte('{') {
		return t, false
	}
	var seen uint16
	s.space()
	if s.byte('}') {
		return t, s.end()
	}
	for {
		s.space()
		key, ok := s.plainString()
		if !ok {
			return t, false
		}
		s.space()
		if !s.byte(':') {
			return t, false
		}
		s.space()
		field := taskField(key)
		if field < 0 {
			if foldsToTaskField(key) {
				return t, false // encoding/json matches keys case-insensitively
			}
			if !s.skipValue() {
				return t, false
			}
		} else {
			if seen&(1<<field) != 0 {
				return t, false // a duplicate: leave last-wins to encoding/json
			}
			seen |= 1 << field
			if !s.field(&t, field) {
				return t, false
			}
		}
		s.space()
		if s.byte(',') {
			continue
		}
		if s.byte('}') {
			return t, s.end()
		}
		return t, false
	}
}

const (
	fID = iota
	fType
	fPayload
	fModels
	fTimeoutMs
	fMaxAttempts
	fMaxLatencyMs
	fMinSuccessRate
	fPriority
	fTenant
	fDeadlineMs
)

var taskFields = [...]string{fID: "id", fType: "type", fPayload: "payload", fModels: "models",
	fTimeoutMs: "timeout_ms", fMaxAttempts: "max_attempts", fMaxLatencyMs: "max_latency_ms",
	fMinSuccessRate: "min_success_rate", fPriority: "priority", fTenant: "tenant", fDeadlineMs: "deadline_ms"}

func taskField(key []byte) int {
	for i, f := range taskFields {
		if string(key) == f {
			return i
		}
	}
	return -1
}

// foldsToTaskField reports whether key equals a field name ignoring ASCII
// case (encoding/json also folds the Kelvin sign and long s: keys with
// non-ASCII bytes never reach here, plainString refuses them).
func foldsToTaskField(key []byte) bool {
	for _, f := range taskFields {
		if len(key) != len(f) {
			continue
		}
		same := true
		for i := range len(f) {
			c := key[i]
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			if c != f[i] {
				same = false
				break
			}
		}
		if same {
			return true
		}
	}
	return false
}

type fastScanner struct {
	b        []byte
	i        int
	nonASCII bool // a string held bytes >= 0x80: end checks the UTF-8
}

func (s *fastScanner) space() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *fastScanner) byte(c byte) bool {
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// end: only white space may follow the object, and the message must be
// valid UTF-8.
func (s *fastScanner) end() bool {
	s.space()
	return s.i == len(s.b) && (!s.nonASCII || utf8.Valid(s.b))
}

// plainString reads a string of printable ASCII without escapes.
func (s *fastScanner) plainString() ([]byte, bool) {
	if !s.byte('"') {
		return nil, false
	}
	start := s.i
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			s.i++
			return s.b[start : s.i-1], true
		case c == '\\' || c < 0x20 || c >= 0x80:
			return nil, false
		}
		s.i++
	}
	return nil, false
}

func (s *fastScanner) field(t *Task, f int) bool {
	switch f {
	case fID, fType, fTenant:
		v, ok := s.plainString()
		if !ok {
			return false
		}
		switch f {
		case fID:
			t.ID = string(v)
		case fType:
			t.Type = string(v)
		default:
			t.Tenant = string(v)
		}
		return true
	case fPayload:
		if s.i < len(s.b) && s.b[s.i] == 'n' {
			return false // null: leave it to encoding/json
		}
		start := s.i
		if !s.skipValue() {
			return false
		}
		t.Payload = append([]byte(nil), s.b[start:s.i]...)
		return true
	case fModels:
		if !s.byte('[') {
			return false
		}
		s.space()
		if s.byte(']') {
			t.Models = []string{}
			return true
		}
		for {
			s.space()
			v, ok := s.plainString()
			if !ok {
				return false
			}
			t.Models = append(t.Models, string(v))
			s.space()
			if s.byte(',') {
				continue
			}
			return s.byte(']')
		}
	case fTimeoutMs, fMaxLatencyMs, fMaxAttempts, fPriority, fDeadlineMs:
		start := s.i
		if !s.number() {
			return false
		}
		n, err := strconv.ParseInt(string(s.b[start:s.i]), 10, 64) // refuses fractions and exponents
		if err != nil {
			return false
		}
		switch f {
		case fTimeoutMs:
			t.TimeoutMs = n
		case fMaxLatencyMs:
			t.MaxLatencyMs = n
		case fDeadlineMs:
			t.DeadlineMs = n
		default:
			if int64(int(n)) != n {
				return false
			}
			if f == fPriority {
				t.Priority = int(n)
			} else {
				t.MaxAttempts = int(n)
			}
		}
		return true
	case fMinSuccessRate:
		start := s.i
		if !s.number() {
			return false
		}
		v, err := strconv.ParseFloat(string(s.b[start:s.i]), 64)
		if err != nil {
			return false
		}
		t.MinSuccessRate = v
		return true
	}
	return false
}

// number reads a JSON number.
func (s *fastScanner) number() bool {
	s.byte('-')
	switch {
	case s.byte('0'):
	case s.digits() == 0:
		return false
	}
	if s.byte('.') && s.digits() == 0 {
		return false
	}
	if s.byte('e') || s.byte('E') {
		if !s.byte('+') {
			s.byte('-')
		}
		if s.digits() == 0 {
			return false
		}
	}
	return true
}

func (s *fastScanner) digits() int {
	start := s.i
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
	}
	return s.i - start
}

// anyString reads a JSON string with any valid escapes.
func (s *fastScanner) anyString() bool {
	if !s.byte('"') {
		return false
	}
	for s.i < len(s.b) {
		c := s.b[s.i]
		s.i++
		switch {
		case c == '"':
			return true
		case c == '\\':
			if s.i >= len(s.b) {
				return false
			}
			e := s.b[s.i]
			s.i++
			switch e {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if s.i+4 > len(s.b) {
					return false
				}
				for _, h := range s.b[s.i : s.i+4] {
					if !('0' <= h && h <= '9' || 'a' <= h && h <= 'f' || 'A' <= h && h <= 'F') {
						return false
					}
				}
				s.i += 4
			default:
				return false
			}
		case c < 0x20:
			return false
		case c >= 0x80:
			s.nonASCII = true
		}
	}
	return false
}

// maxFastDepth bounds the nesting skipValue follows (encoding/json allows
// 10000; deeper input takes the reflection path and its error).
const maxFastDepth = 512

// skipValue reads any JSON value, validating it.
func (s *fastScanner) skipValue() bool {
	var stack [maxFastDepth]byte // the open containers, '{' or '['
	depth := 0
	for {
		// a value
		if s.i >= len(s.b) {
			return false
		}
		switch c := s.b[s.i]; {
		case c == '{' || c == '[':
			if depth == maxFastDepth {
				return false
			}
			s.i++
			stack[depth] = c
			depth++
			s.space()
			if (c == '{' && s.byte('}')) || (c == '[' && s.byte(']')) {
				depth--
				break // an empty container is a complete value
			}
			if c == '{' {
				if !s.anyString() {
					return false
				}
				s.space()
				if !s.byte(':') {
					return false
				}
				s.space()
			}
			continue // its first value
		case c == '"':
			if !s.anyString() {
				return false
			}
		case c == '-' || ('0' <= c && c <= '9'):
			if !s.number() {
				return false
			}
		default:
			if !s.literal() {
				return false
			}
		}
		// after a complete value: close containers or go to the next value
		for {
			if depth == 0 {
				return true
			}
			s.space()
			if s.byte(',') {
				s.space()
				if stack[depth-1] == '{' {
					if !s.anyString() {
						return false
					}
					s.space()
					if !s.byte(':') {
						return false
					}
					s.space()
				}
				break
			}
			closer := byte('}')
			if stack[depth-1] == '[' {
				closer = ']'
			}
			if !s.byte(closer) {
				return false
			}
			depth--
		}
	}
}

func (s *fastScanner) literal() bool {
	for _, lit := range [...]string{"true", "false", "null"} {
		if len(s.b)-s.i >= len(lit) && string(s.b[s.i:s.i+len(lit)]) == lit {
			s.i += len(lit)
			return true
		}
	}
	return false
}

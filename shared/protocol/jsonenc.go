package protocol

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"unicode/utf8"
)

// jsonenc.go writes the messages encoded once per attempt (a worker's
// outcome, the dispatcher's result) without reflection. The bytes are
// exactly json.Marshal's (HTML-safe string escapes, compacted raw values,
// ES6 number format, RFC 3339 times), which FuzzAppendJSON holds them to.

// AppendJSON appends the outcome encoded as json.Marshal encodes it. Output
// and Task must be valid JSON (else an error, as from json.Marshal).
func (o *Outcome) AppendJSON(b []byte) ([]byte, error) {
	var err error
	b = append(b, `{"task_id":`...)
	b = appendJSONString(b, o.TaskID)
	b = append(b, `,"type":`...)
	b = appendJSONString(b, o.Type)
	b = append(b, `,"attempt":`...)
	b = strconv.AppendInt(b, int64(o.Attempt), 10)
	b = append(b, `,"model":`...)
	b = appendJSONString(b, o.Model)
	b = append(b, `,"node":`...)
	b = appendJSONString(b, o.Node)
	b = append(b, `,"status":`...)
	b = appendJSONString(b, string(o.Status))
	if len(o.Output) > 0 {
		b = append(b, `,"output":`...)
		if b, err = appendJSONRaw(b, o.Output, "output"); err != nil {
			return nil, err
		}
	}
	if o.Error != "" {
		b = append(b, `,"error":`...)
		b = appendJSONString(b, o.Error)
	}
	b = append(b, `,"latency_ms":`...)
	if b, err = appendJSONFloat(b, o.LatencyMs, "latency_ms"); err != nil {
		return nil, err
	}
	if len(o.Task) > 0 {
		b = append(b, `,"task":`...)
		if b, err = appendJSONRaw(b, o.Task, "task"); err != nil {
			return nil, err
		}
	}
	return append(b, '}'), nil
}

// AppendJSON appends the result encoded as json.Marshal encodes it. Output
// must be valid JSON (else an error, as from json.Marshal).
func (r *Result) AppendJSON(b []byte) ([]byte, error) {
	var err error
	b = append(b, `{"id":`...)
	b = appendJSONString(b, r.ID)
	b = append(b, `,"type":`...)
	b = appendJSONString(b, r.Type)
	b = append(b, `,"status":`...)
	b = appendJSONString(b, string(r.Status))
	if r.Model != "" {
		b = append(b, `,"model":`...)
		b = appendJSONString(b, r.Model)
	}
	if r.Node != "" {
		b = append(b, `,"node":`...)
		b = appendJSONString(b, r.Node)
	}
	b = append(b, `,"attempts":`...)
	b = strconv.AppendInt(b, int64(r.Attempts), 10)
	if len(r.Output) > 0 {
		b = append(b, `,"output":`...)
		if b, err = appendJSONRaw(b, r.Output, "output"); err != nil {
			return nil, err
		}
	}
	if r.Error != "" {
		b = append(b, `,"error":`...)
		b = appendJSONString(b, r.Error)
	}
	if r.ErrorCode != "" {
		b = append(b, `,"error_code":`...)
		b = appendJSONString(b, string(r.ErrorCode))
	}
	b = append(b, `,"latency_ms":`...)
	if b, err = appendJSONFloat(b, r.LatencyMs, "latency_ms"); err != nil {
		return nil, err
	}
	if len(r.History) > 0 {
		b = append(b, `,"history":[`...)
		for i := range r.History {
			if i > 0 {
				b = append(b, ',')
			}
			if b, err = r.History[i].appendJSON(b); err != nil {
				return nil, err
			}
		}
		b = append(b, ']')
	}
	b = append(b, `,"finished_at":"`...)
	if b, err = r.FinishedAt.AppendText(b); err != nil {
		return nil, fmt.Errorf("json: finished_at: %w", err)
	}
	return append(b, `"}`...), nil
}

func (a *Attempt) appendJSON(b []byte) ([]byte, error) {
	b = append(b, `{"attempt":`...)
	b = strconv.AppendInt(b, int64(a.Attempt), 10)
	b = append(b, `,"model":`...)
	b = appendJSONString(b, a.Model)
	b = append(b, `,"node":`...)
	b = appendJSONString(b, a.Node)
	b = append(b, `,"status":`...)
	b = appendJSONString(b, string(a.Status))
	if a.Error != "" {
		b = append(b, `,"error":`...)
		b = appendJSONString(b, a.Error)
	}
	b = append(b, `,"latency_ms":`...)
	b, err := appendJSONFloat(b, a.LatencyMs, "history latency_ms")
	if err != nil {
		return nil, err
	}
	return append(b, '}'), nil
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s quoted as json.Marshal quotes a string: <, >
// and & escaped for HTML, control characters escaped, invalid UTF-8 as
// U+FFFD, U+2028 and U+2029 escaped.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= ' ' && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '\\', '"':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// appendJSONFloat appends f as json.Marshal formats a float64.
func appendJSONFloat(b []byte, f float64, field string) ([]byte, error) {
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return nil, fmt.Errorf("json: unsupported value %s in %s", strconv.FormatFloat(f, 'g', -1, 64), field)
	}
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' { // e-09 -> e-9
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b, nil
}

// appendJSONRaw appends a raw JSON value as json.Marshal writes a
// json.RawMessage: validated, compacted (white space outside strings
// dropped), <, >, &, U+2028 and U+2029 escaped.
func appendJSONRaw(b, raw []byte, field string) ([]byte, error) {
	r := jsonReader{data: raw}
	r.ws()
	if r.skip(0) != nil || r.end() != nil {
		_, err := json.Marshal(json.RawMessage(raw)) // its error, for the message
		return nil, fmt.Errorf("json: %s: %w", field, err)
	}
	start, inString := 0, false
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		switch {
		case inString && c == '\\':
			i++ // the escaped byte (a \u's digits are plain)
		case c == '"':
			inString = !inString
		case !inString && (c == ' ' || c == '\t' || c == '\n' || c == '\r'):
			b = append(b, raw[start:i]...)
			start = i + 1
		case c == '<' || c == '>' || c == '&':
			b = append(b, raw[start:i]...)
			b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			start = i + 1
		case c == 0xE2 && i+2 < len(raw) && raw[i+1] == 0x80 && raw[i+2]&^1 == 0xA8: // U+2028, U+2029
			b = append(b, raw[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[raw[i+2]&0xF])
			i += 2
			start = i + 1
		}
	}
	return append(b, raw[start:]...), nil
}

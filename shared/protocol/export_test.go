package protocol

// DecodeTaskReflect is DecodeTask without its single-pass decoder: the
// reference the fast path is checked against.
func DecodeTaskReflect(data []byte, lim Limits) (Task, error) {
	lim = lim.withDefaults()
	if len(data) > lim.MaxPayloadBytes {
		return DecodeTask(data, lim) // the size check comes first in both
	}
	return decodeTaskReflect(data, lim)
}

// DecodeTaskFast is the single-pass decoder alone.
var DecodeTaskFast = decodeTaskFast

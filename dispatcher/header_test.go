package dispatcher

import (
	"net/textproto"
	"testing"

	"github.com/mlsched/mlsched/shared/protocol"
)

// intake.go builds dispatch headers as a literal map, which is only right
// when every name is already in canonical form.
func TestDispatchHeaderNamesAreCanonical(t *testing.T) {
	for _, k := range []string{protocol.HdrTaskID, protocol.HdrType, protocol.HdrModel, protocol.HdrNode,
		protocol.HdrAttempt, protocol.HdrMaxAttempts, protocol.HdrDeadline, protocol.HdrTimeout,
		protocol.HdrSubmitted, protocol.HdrTaskSeq, protocol.HdrHistory} {
		if c := textproto.CanonicalMIMEHeaderKey(k); c != k {
			t.Errorf("header %q is not canonical (%q)", k, c)
		}
	}
}

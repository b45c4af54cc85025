package protocol_test

import (
	"encoding/json"
	"testing"

	"github.com/mlsched/mlsched/shared/protocol"
)

// A report's answer is json.Marshal's bytes, and reads back; anything that
// is not an answer is an error.
func TestReportReply(t *testing.T) {
	for _, r := range []protocol.ReportReply{{Status: protocol.ReportAcked}, {Status: protocol.ReportSettled},
		{Status: protocol.ReportDeferred, Reason: "not a success: store it"}} {
		want, _ := json.Marshal(r)
		got := r.AppendJSON(nil)
		if string(got) != string(want) {
			t.Fatalf("%+v: %s, want %s", r, got, want)
		}
		back, err := protocol.DecodeReportReply(got)
		if err != nil || back != r {
			t.Fatalf("%s read as %+v, %v", got, back, err)
		}
	}
	for _, bad := range []string{``, `{"stream":"mlsched-report","seq":0}`, `{"status":"maybe"}`, `nope`} {
		if r, err := protocol.DecodeReportReply([]byte(bad)); err == nil {
			t.Fatalf("%q read as %+v", bad, r)
		}
	}
}

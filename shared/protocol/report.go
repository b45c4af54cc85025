package protocol

import (
	"bytes"
	"encoding/json"
	"fmt"
)

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

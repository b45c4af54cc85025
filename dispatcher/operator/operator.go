// Package operator holds the operator's actions on a running cluster, shared
// by the CLI (mlsched dlq replay, mlsched cancel) and the dashboard: replay
// a dead letter, cancel a task, look a task up. Each is a request or a
// publish on NATS; nothing here runs in the dispatch path.
package operator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/shared/client"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// ErrNotReplayable marks a dead letter that replay cannot resubmit.
var ErrNotReplayable = errors.New("cannot be replayed")

// Replay resubmits dead letter seq of the dlq stream, whose decoded entry is
// dl. A task id has at most one final result, so the old one is purged
// first: the replay's result replaces it. The fresh Nats-Msg-Id keeps the
// task stream's duplicate window from swallowing the resubmission. The
// entry is deleted only once the task stream has it. The dispatcher's
// message ids name the submission (Mlsched-Task-Seq), not only the task id,
// so a replay may follow at once. It returns the task's sequence in the
// task stream.
func Replay(ctx context.Context, js jetstream.JetStream, c *client.Client, dlq jetstream.Stream, seq uint64, dl protocol.DeadLetter) (uint64, error) {
	if dl.Truncated {
		return 0, fmt.Errorf("%w: it keeps only the first %d of the original's %d bytes (sha256 %s)", ErrNotReplayable,
			len(dl.Original), dl.OriginalBytes, dl.OriginalSHA256)
	}
	id := dl.TaskID
	if id == "" {
		return 0, fmt.Errorf("%w: its original has no usable task id (unkeyable: code %s), so no result could ever be keyed; fix the producer and submit a corrected task", ErrNotReplayable, dl.Code)
	}
	if err := protocol.ValidToken(id, 1<<10); err != nil {
		return 0, fmt.Errorf("%w: task id %q: %v", ErrNotReplayable, id, err)
	}
	typ := OriginalType(dl)
	if typ == "" {
		return 0, fmt.Errorf("%w: cannot tell the task type of the original", ErrNotReplayable)
	}
	results, err := js.Stream(ctx, topology.StreamResults)
	if err != nil {
		return 0, fmt.Errorf("stream %s: %w", topology.StreamResults, err)
	}
	if err := results.Purge(ctx, jetstream.WithPurgeSubject(topology.ResultSubject(id))); err != nil {
		return 0, fmt.Errorf("purge the old result of %s: %w", id, err)
	}
	ack, err := c.SubmitRaw(ctx, typ, dl.Original, fmt.Sprintf("%s:replay:%d", id, seq))
	if err != nil {
		return 0, fmt.Errorf("resubmit %s: %w", id, err)
	}
	if err := dlq.DeleteMsg(ctx, seq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return ack.Seq, fmt.Errorf("task %s resubmitted (seq %d) but the dead letter was not deleted: %w", id, ack.Seq, err)
	}
	return ack.Seq, nil
}

// ReplaySeq reads dead letter seq from MLSCHED_DLQ and replays it; it
// returns the task id and its sequence in the task stream.
func ReplaySeq(ctx context.Context, js jetstream.JetStream, c *client.Client, seq uint64) (string, uint64, error) {
	dlq, err := js.Stream(ctx, topology.StreamDLQ)
	if err != nil {
		return "", 0, fmt.Errorf("stream %s: %w", topology.StreamDLQ, err)
	}
	m, err := dlq.GetMsg(ctx, seq)
	if err != nil {
		return "", 0, fmt.Errorf("dead letter %d: %w", seq, err)
	}
	var dl protocol.DeadLetter
	if err := json.Unmarshal(m.Data, &dl); err != nil {
		return "", 0, fmt.Errorf("%w: the entry is not a dead letter: %v", ErrNotReplayable, err)
	}
	taskSeq, err := Replay(ctx, js, c, dlq, seq, dl)
	return dl.TaskID, taskSeq, err
}

// OriginalType finds the task type from the original's "type" field, or
// from the subject it was published on.
func OriginalType(dl protocol.DeadLetter) string {
	var probe struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(dl.Original, &probe) == nil && protocol.ValidToken(probe.Type, 64) == nil {
		return probe.Type
	}
	if t, ok := strings.CutPrefix(dl.Subject, topology.TaskSubject("")); ok && protocol.ValidToken(t, 64) == nil {
		return t
	}
	return ""
}

// Cancel asks the dispatchers to cancel task id (protocol.SubjectAdminCancel)
// and returns their answer.
func Cancel(ctx context.Context, nc *nats.Conn, id, reason string) (protocol.CancelReply, error) {
	data, _ := json.Marshal(protocol.CancelRequest{ID: id, Reason: reason})
	m, err := nc.RequestWithContext(ctx, protocol.SubjectAdminCancel, data)
	if errors.Is(err, nats.ErrNoResponders) {
		return protocol.CancelReply{}, fmt.Errorf("no dispatcher is listening on %s: %w", protocol.SubjectAdminCancel, err)
	}
	if err != nil {
		return protocol.CancelReply{}, fmt.Errorf("cancel request: %w", err)
	}
	var r protocol.CancelReply
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return r, fmt.Errorf("malformed cancel reply (%v): %.200s", err, m.Data)
	}
	return r, nil
}

// Lookup is what is known of a task: its final result, if it has one.
type Lookup struct {
	ID     string           `json:"id"`
	Result *protocol.Result `json:"result,omitempty"`
	// State is "finished" (Result is set) or "no result yet" (waiting,
	// running, or unknown: its submission is not looked for).
	State string `json:"state"`
}

// LookupTask reads task id's result from MLSCHED_RESULTS.
func LookupTask(ctx context.Context, js jetstream.JetStream, id string) (Lookup, error) {
	out := Lookup{ID: id}
	if err := protocol.ValidToken(id, protocol.DefaultLimits.MaxIDLen); err != nil {
		return out, protocol.Errorf(protocol.CodeInvalidID, "id %q: %v", id, err)
	}
	c := client.New(js)
	r, err := c.Result(ctx, id)
	switch {
	case errors.Is(err, client.ErrNoResult):
		out.State = "no result yet"
		return out, nil
	case err != nil:
		return out, err
	}
	out.Result, out.State = r, "finished"
	return out, nil
}

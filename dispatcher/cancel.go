package dispatcher

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/dispatcher/internal/finish"
	"github.com/mlsched/mlsched/shared/opshttp"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// cancelTimeout bounds the work of one cancel request (a scan of the
// backlog); `mlsched cancel` waits a little longer.
const cancelTimeout = 20 * time.Second

// canceller carries out `mlsched cancel` (see serve).
type canceller struct {
	cfg        Config
	log        zerolog.Logger
	nc         *nats.Conn
	js         jetstream.JetStream
	results    jetstream.Stream // where a task's result is read
	superseded *supersededSet   // where a submission is marked cancelled
	counters   *Counters
	metrics    *metrics
}

// serve answers `mlsched cancel`. One replica of the queue group takes
// each request; what it does holds for every replica:
//
//  1. it finds the task's submissions where a live task can be: waiting in
//     MLSCHED_TASKS, dispatched in MLSCHED_DISPATCH, or retrying in
//     MLSCHED_OUTCOMES;
//  2. it marks each submission cancelled in MLSCHED_SUPERSEDED, which every
//     replica follows: intake drops the task if it still waits, and every
//     outcome of it is late (counted, never final, never retried);
//  3. it publishes the cancelled result with the same expected-last-sequence
//     0 rule that makes every result final, so a result that won the race
//     stays and the reply says the task had finished.
//
// The requests are handled one at a time on the subscription's goroutine,
// off the dispatch path.
func (cn *canceller) serve() (*nats.Subscription, error) {
	return cn.nc.QueueSubscribe(protocol.SubjectAdminCancel, protocol.QueueAdminCancel, func(m *nats.Msg) {
		var req protocol.CancelRequest
		var reply protocol.CancelReply
		if err := json.Unmarshal(m.Data, &req); err != nil {
			reply = protocol.CancelReply{Outcome: protocol.CancelInvalid, Error: "request is not a JSON CancelRequest: " + err.Error()}
		} else {
			ctx, cancel := context.WithTimeout(context.Background(), cancelTimeout)
			reply = cn.Cancel(ctx, req)
			cancel()
		}
		reply.Dispatcher = cn.cfg.Name
		data, _ := json.Marshal(reply)
		_ = m.Respond(data)
	})
}

// Cancel cancels a task that has no result yet (see serveCancel).
func (cn *canceller) Cancel(ctx context.Context, req protocol.CancelRequest) protocol.CancelReply {
	id := req.ID
	reply := protocol.CancelReply{ID: id}
	fail := func(err error) protocol.CancelReply {
		reply.Outcome, reply.Error = protocol.CancelInvalid, err.Error()
		return reply
	}
	maxLen := cn.cfg.Limits().MaxIDLen
	if maxLen <= 0 {
		maxLen = protocol.DefaultLimits.MaxIDLen
	}
	if err := protocol.ValidToken(id, maxLen); err != nil {
		return fail(fmt.Errorf("id %q: %w", id, err))
	}
	if st, ok, err := cn.storedStatus(ctx, id); err != nil {
		return fail(err)
	} else if ok {
		reply.Outcome, reply.Status = protocol.CancelFinished, st
		return reply
	}
	found, err := cn.findTask(ctx, id)
	if err != nil {
		return fail(fmt.Errorf("looking for task %q: %w", id, err))
	}
	if len(found) == 0 {
		// It may have finished while we looked.
		if st, ok, err := cn.storedStatus(ctx, id); err == nil && ok {
			reply.Outcome, reply.Status = protocol.CancelFinished, st
			return reply
		}
		reply.Outcome = protocol.CancelUnknown
		return reply
	}
	taskType := ""
	for _, f := range found {
		if err := cn.superseded.Cancel(ctx, id, f.submission); err != nil {
			return fail(fmt.Errorf("marking task %q cancelled: %w", id, err))
		}
		reply.Where = append(reply.Where, f.where)
		if taskType == "" {
			taskType = f.taskType
		}
	}
	msg := "cancelled by an operator"
	if req.Reason != "" {
		msg += ": " + req.Reason
	}
	res := protocol.Result{ID: id, Type: taskType, Status: protocol.StatusCancelled, Error: msg,
		ErrorCode: protocol.CodeCancelled, FinishedAt: time.Now().UTC()}
	data, err := protocol.EncodeResult(&res)
	if err != nil {
		return fail(err)
	}
	out := &nats.Msg{Subject: topology.ResultSubject(id), Data: data, Header: protocol.ResultHeader(id, "")}
	if _, err := cn.js.PublishMsg(ctx, out, jetstream.WithExpectLastSequencePerSubject(0)); err != nil {
		if !finish.IsWrongLastSequence(err) {
			return fail(fmt.Errorf("publishing the cancelled result: %w", err))
		}
		st, _, _ := cn.storedStatus(ctx, id)
		reply.Outcome, reply.Status = protocol.CancelFinished, st
		return reply
	}
	// The task message will not be needed: it stays in the task stream
	// until its result is stored, whether it waits or runs (intake would
	// drop it, a late outcome ack it), but removing it now keeps the
	// backlog true. Its submission is its sequence there.
	for _, f := range found {
		if seq, err := strconv.ParseUint(f.submission, 10, 64); err == nil {
			_ = cn.tasksStreamDelete(ctx, seq)
		}
	}
	cn.counters.Results.Add(1)
	cn.counters.Cancelled.Add(1)
	cn.counters.Types.Add(taskType, protocol.StatusCancelled)
	cn.metrics.results.Get(opshttp.L2{A: taskType, B: string(protocol.StatusCancelled)}).Inc()
	cn.log.Info().Str("task_id", id).Strs("where", reply.Where).Msg("task cancelled")
	reply.Outcome, reply.Status = protocol.CancelDone, protocol.StatusCancelled
	return reply
}

// storedStatus returns the status of the task's stored result, if any.
func (cn *canceller) storedStatus(ctx context.Context, id string) (protocol.Status, bool, error) {
	r, found, err := finish.Lookup(ctx, cn.results, id)
	if !found {
		return "", false, err
	}
	return r.Status, true, nil // a result that does not decode has no status to tell
}

func (cn *canceller) tasksStreamDelete(ctx context.Context, seq uint64) error {
	s, err := cn.js.Stream(ctx, topology.StreamTasks)
	if err != nil {
		return err
	}
	return s.DeleteMsg(ctx, seq)
}

// foundTask is one submission of a task found in a stream.
type foundTask struct {
	where      string // waiting, dispatched or retrying
	submission string
	taskType   string
	seq        uint64 // in the stream it was found in
}

// findTask scans the streams where a task without a result can be. They
// hold live messages, and the task stream finished tasks too until the task
// pruner's next pass, so the scan is bounded by the backlog; it is an
// operator's rare request and runs off the dispatch path. Cancel looks for a
// stored result first, so a finished task found here is reported finished.
func (cn *canceller) findTask(ctx context.Context, id string) ([]foundTask, error) {
	var found []foundTask
	seen := map[string]bool{}
	add := func(f foundTask) {
		if !seen[f.submission] {
			seen[f.submission] = true
			found = append(found, f)
		}
	}
	// The attempt streams first: a task running or retrying is still in
	// the task stream too (until its result), and is named where it runs.
	quoted, _ := json.Marshal(id)
	err := cn.scanStream(ctx, topology.StreamDispatch, topology.SubjectDispatchAll, func(m *jetstream.RawStreamMsg) {
		if pd, _ := protocol.ParseDispatch(m.Header); pd.TaskID == id { // what could be read: cancel even a damaged one
			add(foundTask{where: "dispatched", submission: pd.Submission, taskType: pd.Type, seq: m.Sequence})
		}
	})
	if err != nil {
		return nil, err
	}
	err = cn.scanStream(ctx, topology.StreamOutcomes, topology.SubjectOutcomesAll, func(m *jetstream.RawStreamMsg) {
		if !bytes.Contains(m.Data, quoted) {
			return
		}
		var o struct {
			TaskID string `json:"task_id"`
			Type   string `json:"type"`
		}
		if json.Unmarshal(m.Data, &o) == nil && o.TaskID == id {
			pd, _ := protocol.ParseDispatch(m.Header) // the outcome echoes its dispatch
			add(foundTask{where: "retrying", submission: pd.Submission, taskType: o.Type, seq: m.Sequence})
		}
	})
	if err != nil {
		return nil, err
	}
	err = cn.scanStream(ctx, topology.StreamTasks, topology.SubjectTasksAll, func(m *jetstream.RawStreamMsg) {
		if !bytes.Contains(m.Data, quoted) {
			return
		}
		var t struct{ ID, Type string }
		if json.Unmarshal(m.Data, &t) == nil && t.ID == id {
			add(foundTask{where: "waiting", submission: strconv.FormatUint(m.Sequence, 10), taskType: t.Type, seq: m.Sequence})
		}
	})
	return found, err
}

// scanStream reads every message stored in the stream when the scan starts,
// one "next message from this sequence" get at a time: work-queue streams
// allow no second consumer.
func (cn *canceller) scanStream(ctx context.Context, stream, subjects string, each func(*jetstream.RawStreamMsg)) error {
	s, err := cn.js.Stream(ctx, stream)
	if err != nil {
		return err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return err
	}
	if info.State.Msgs == 0 {
		return nil
	}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; {
		m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subjects))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if m.Sequence > info.State.LastSeq {
			return nil
		}
		each(m)
		seq = m.Sequence + 1
	}
	return nil
}

package dispatcher

import (
	"encoding/json"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// publishResult publishes a task's final result. JetStream refuses it when
// the task already has one (expected last subject sequence 0), which is what
// makes the result final: a duplicate delivery, a racing replica or a late
// outcome cannot publish a second or changed result. settle runs once the
// result is stored or refused.
func (d *Dispatcher) publishResult(res *protocol.Result, settle func(error)) {
	res.FinishedAt = time.Now().UTC()
	data, err := json.Marshal(res)
	if err != nil { // cannot happen with our types; never drop the message
		settle(err)
		return
	}
	m := &nats.Msg{Subject: topology.ResultSubject(res.ID), Data: data, Header: nats.Header{}}
	m.Header.Set(protocol.HdrTaskID, res.ID)
	fut, err := d.js.PublishMsgAsync(m, jetstream.WithMsgID("r:"+res.ID), jetstream.WithExpectLastSequencePerSubject(0))
	if err != nil {
		settle(err)
		return
	}
	id, status, model, node := res.ID, res.Status, res.Model, res.Node
	d.pending <- pendingAck{fut: fut, done: func(ack *jetstream.PubAck, err error) {
		switch {
		case isWrongLastSequence(err), err == nil && ack.Duplicate:
			d.counters.Suppressed.Add(1)
			d.log.Info().Str("task_id", id).Str("model", model).Str("node", node).Msg("task already has a final result: suppressed a second one")
			settle(nil)
		case err != nil:
			d.log.Warn().Err(err).Str("task_id", id).Msg("result publish failed, will retry")
			settle(err)
		default:
			d.counters.Results.Add(1)
			if status == protocol.StatusRejected {
				d.counters.Rejected.Add(1)
			}
			d.log.Debug().Str("task_id", id).Str("model", model).Str("node", node).Str("status", string(status)).Msg("result published")
			settle(nil)
		}
	}}
}

func isWrongLastSequence(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
	}
	return false
}

// reject ends a task that cannot run: a keyed task gets a result with the
// error; an unkeyable message (no usable id) goes to the dead-letter stream
// with its original bytes.
func (d *Dispatcher) reject(subject string, data []byte, t protocol.Task, err error, status protocol.Status,
	history []protocol.Attempt, attempts int, submitted time.Time, settle func(error)) {
	code := protocol.CodeOf(err)
	if t.ID == "" {
		d.deadLetter("invalid", protocol.DeadLetter{Reason: err.Error(), Code: code, Subject: subject, Original: data}, settle)
		return
	}
	res := &protocol.Result{ID: t.ID, Type: t.Type, Status: status, Attempts: attempts, Error: err.Error(),
		ErrorCode: code, History: history, LatencyMs: msSince(submitted)}
	if status == protocol.StatusFailed && code == protocol.CodeAttemptsExhausted {
		// keep the task for an operator to inspect and replay
		settle = join(2, settle)
		d.deadLetter("exhausted", protocol.DeadLetter{Reason: res.Error, Code: code, Subject: subject,
			TaskID: t.ID, History: history, Original: data}, settle)
	}
	d.publishResult(res, settle)
}

// deadLetter stores an entry in MLSCHED_DLQ under mlsched.dlq.<kind>.
func (d *Dispatcher) deadLetter(kind string, dl protocol.DeadLetter, settle func(error)) {
	dl.At = time.Now().UTC()
	data, err := json.Marshal(dl)
	if err != nil {
		settle(err)
		return
	}
	m := &nats.Msg{Subject: topology.DLQSubject(kind), Data: data}
	opts := []jetstream.PublishOpt{}
	if dl.TaskID != "" {
		opts = append(opts, jetstream.WithMsgID("x:"+kind+":"+dl.TaskID))
	}
	fut, err := d.js.PublishMsgAsync(m, opts...)
	if err != nil {
		settle(err)
		return
	}
	d.pending <- pendingAck{fut: fut, done: func(ack *jetstream.PubAck, err error) {
		if err == nil && !ack.Duplicate {
			d.counters.DeadLettered.Add(1)
			d.log.Warn().Str("task_id", dl.TaskID).Str("code", string(dl.Code)).Str("reason", dl.Reason).Msg("dead-lettered")
		}
		settle(err)
	}}
}

func msSince(t time.Time) float64 {
	if t.IsZero() {
		return 0
	}
	return float64(time.Since(t).Microseconds()) / 1000
}

// join returns a settle function that calls settle once it has been called n
// times, with the first error seen. Settle callbacks run on the settle loop
// and must not publish themselves, so dependent publishes are started
// together and joined here.
func join(n int, settle func(error)) func(error) {
	var mu sync.Mutex
	var first error
	return func(err error) {
		mu.Lock()
		n--
		if err != nil && first == nil {
			first = err
		}
		last, e := n == 0, first
		mu.Unlock()
		if last {
			settle(e)
		}
	}
}

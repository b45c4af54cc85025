package finish

import (
	"context"
	"encoding/json"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/shared/jsplumb"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// DeadLetters is the one way into MLSCHED_DLQ. Every entry carries a
// Nats-Msg-Id, so storing it again (a redelivered message, a sweep retried
// after a crash) is harmless inside the duplicate window: an entry about a
// task is named by the task's submission (TaskEntry), any other by the
// stream position of the message it is about (MessageEntry).
type DeadLetters struct {
	JS    jetstream.JetStream
	Log   zerolog.Logger
	Count *atomic.Int64 // entries stored, duplicates not counted
	// OnStored, when set, is told the kind of every entry stored (not of a
	// duplicate), for the metrics.
	OnStored func(kind string)
}

// TaskEntry names the entry of kind about one submission of a task.
func TaskEntry(kind, taskID, submission string) string {
	return protocol.MsgID("x", taskID, submission, 0) + ":" + kind
}

// MessageEntry names the entry of kind about the message at seq of stream.
func MessageEntry(kind, stream string, seq uint64) string {
	return "x:" + stream + ":" + strconv.FormatUint(seq, 10) + ":" + kind
}

// MessageEntryOf is MessageEntry for a consumed message ("" when its
// position is unknown, as for a direct report: then the entry has no id).
func MessageEntryOf(kind string, msg jsplumb.Msg) string {
	jm, ok := msg.(jetstream.Msg)
	if !ok {
		return ""
	}
	meta, err := jm.Metadata()
	if err != nil {
		return ""
	}
	return MessageEntry(kind, meta.Stream, meta.Sequence.Stream)
}

func (p *DeadLetters) message(kind string, dl protocol.DeadLetter) (*nats.Msg, error) {
	dl.At = time.Now().UTC()
	dl.TruncateOriginal() // an oversized message must not make an unpublishable dead letter
	data, err := json.Marshal(dl)
	if err != nil {
		return nil, err
	}
	return &nats.Msg{Subject: topology.DLQSubject(kind), Data: data}, nil
}

func opts(id string) []jetstream.PublishOpt {
	if id == "" {
		return nil
	}
	return []jetstream.PublishOpt{jetstream.WithMsgID(id)}
}

// Publish stores an entry and waits for it.
func (p *DeadLetters) Publish(ctx context.Context, kind string, dl protocol.DeadLetter, id string) error {
	m, err := p.message(kind, dl)
	if err != nil {
		return err
	}
	ack, err := p.JS.PublishMsg(ctx, m, opts(id)...)
	return p.stored(kind, dl, ack, err)
}

func (p *DeadLetters) stored(kind string, dl protocol.DeadLetter, ack *jetstream.PubAck, err error) error {
	if err != nil {
		p.Log.Warn().Err(err).Str("task_id", dl.TaskID).Msg("dead letter not stored, will retry")
		return err
	}
	if !ack.Duplicate {
		p.Count.Add(1)
		if p.OnStored != nil {
			p.OnStored(kind)
		}
		p.Log.Warn().Str("task_id", dl.TaskID).Str("code", string(dl.Code)).Str("reason", dl.Reason).Msg("dead-lettered")
	}
	return nil
}

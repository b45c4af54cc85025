package dispatcher

import (
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/dispatcher/internal/admission"
	"github.com/mlsched/mlsched/dispatcher/internal/finish"
	"github.com/mlsched/mlsched/shared/jsplumb"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// intake is the stage a task enters by: it reads a task message of
// MLSCHED_TASKS (or a parked one: park.go), validates it, ends it at once
// when it has its result or was cancelled, parks a flooding tenant's task,
// and hands the rest to admission (internal/admission) as its first
// attempt.
type intake struct {
	cfg        Config
	log        zerolog.Logger
	adm        *admission.Stage
	fin        *finish.Finisher
	complete   *jsplumb.Completer
	sealer     *sealer        // a pipeline's progress
	superseded *supersededSet // cancelled tasks, lost attempts
	counters   *Counters
	metrics    *metrics
	redeliver  *redeliveries // result lookups of redelivered tasks
	park       *parking      // nil: never park
}

// taskOrigin is where a task message comes from: its band's stream, or its
// tenant's parked tasks (park.go), which carry the submission in headers.
type taskOrigin struct {
	subject     string // where the producer published it
	submitted   time.Time
	submission  string // its sequence in MLSCHED_TASKS: where it was stored, or parked
	traceparent string
	first       bool // its first delivery
	parked      bool
}

// handleTask is one message of a band of MLSCHED_TASKS.
func (in *intake) handleTask(msg jetstream.Msg) {
	o := taskOrigin{subject: msg.Subject(), first: true, traceparent: protocol.TraceparentOf(msg.Headers())}
	if meta, err := msg.Metadata(); err == nil {
		o.submitted, o.submission = meta.Timestamp, strconv.FormatUint(meta.Sequence.Stream, 10)
		o.first = meta.NumDelivered == 1
	} else {
		o.submitted = time.Now()
	}
	in.take(msg, o)
}

// handleParked is one parked task coming back (park.go).
func (in *intake) handleParked(msg jetstream.Msg) {
	o, err := parkedOrigin(msg)
	if err != nil {
		in.log.Warn().Err(err).Str("subject", msg.Subject()).Msg("task rejected")
		task, _ := protocol.DecodeTask(msg.Data(), in.cfg.Limits())
		a := admission.Attempt{Spec: finish.Spec{Task: task, Data: msg.Data(), Attempt: 1, Submitted: time.Now(), Traceparent: o.traceparent}}
		e := a.Ends(msg, err, protocol.StatusRejected)
		e.Subject = msg.Subject()
		in.fin.End(e)
		return
	}
	in.take(msg, o)
}

// take validates a task and dispatches it (or holds, or parks it).
func (in *intake) take(msg jetstream.Msg, o taskOrigin) {
	data := msg.Data()
	task, err := protocol.DecodeTask(data, in.cfg.Limits())
	if err == nil {
		err = checkTaskSubject(o.subject, &task)
	}
	a := admission.Attempt{Spec: finish.Spec{Task: task, Data: data, Attempt: 1, Submitted: o.submitted, Submission: o.submission,
		Traceparent: o.traceparent, TaskAck: msg.Reply()}}
	if err == nil && (task.Pipeline != nil || len(msg.Headers()[protocol.HdrPipeline]) > 0) {
		err = in.pipelineTake(msg.Headers(), &a) // pipeline.go
	}
	if o.first && !o.parked { // a task waiting for a node is redelivered: count it once
		typ := task.Type
		if err != nil {
			typ = "invalid"
		}
		in.metrics.received.Get(typ).Inc()
	}
	if err != nil {
		in.log.Warn().Err(err).Str("task_id", task.ID).Str("subject", o.subject).Msg("task rejected")
		e := a.Ends(msg, err, protocol.StatusRejected)
		e.Subject = o.subject
		in.fin.End(e)
		return
	}
	if in.superseded.Cancelled(task.ID, o.submission) || a.PipeStep && in.superseded.CancelledAny(task.ID) {
		// cancelled while it waited (a pipeline: at any step): it has its result
		in.fin.End(a.EndsStored(msg))
		return
	}
	if !o.first || o.parked {
		// Delivered before: its result may be stored (the ack of the task
		// was lost, or the replica that would have kept it alive is gone).
		// Looked up off this goroutine (redelivered.go).
		in.redelivered(msg, a, o)
		return
	}
	in.enter(msg, a, o)
}

// enter parks a task of a flooding tenant, or dispatches it.
func (in *intake) enter(msg jetstream.Msg, a admission.Attempt, o taskOrigin) {
	if !o.parked && !a.PipeStep && in.park.shouldPark(topology.BandOf(a.Task.Priority), a.Task.TenantName()) {
		in.park.park(msg, &a.Task, a.Data, o)
		return
	}
	in.adm.Dispatch(a, msg)
}

// checkTaskSubject: a task is published on its type's subject, band 0
// (any priority: a producer of an earlier version), or its priority's band
// (topology.BandTaskSubject).
func checkTaskSubject(subject string, t *protocol.Task) error {
	typ, band, ok := topology.ParseTaskSubject(subject)
	if !ok || typ != t.Type {
		return protocol.Errorf(protocol.CodeTypeMismatch, "task of type %q was published on %s; publish it on %s",
			t.Type, subject, topology.BandTaskSubject(t.Type, t.Priority))
	}
	if band != topology.BandNormal && band != topology.BandOf(t.Priority) {
		return protocol.Errorf(protocol.CodeBandMismatch, "task of priority %d was published on %s, another band's subject; publish it on %s",
			t.Priority, subject, topology.BandTaskSubject(t.Type, t.Priority))
	}
	return nil
}

package intake

import (
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/dispatcher/internal/admission"
	"github.com/mlsched/mlsched/dispatcher/internal/finish"
	"github.com/mlsched/mlsched/shared/jsplumb"
	"github.com/mlsched/mlsched/shared/lifecycle"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
	"github.com/mlsched/mlsched/shared/tracing"
)

// Stage is intake, the stage a task enters by: it reads a task message of
// MLSCHED_TASKS (or a parked one: park.go), validates it, ends it at once
// when it has its result or was cancelled, parks a flooding tenant's task,
// and hands the rest to admission as its first attempt.
type Stage struct {
	Params
	redeliver *redeliveries // result lookups of redelivered tasks
	park      *parking      // nil: never park
}

// Params is what intake needs.
type Params struct {
	// Limits are the task validation limits; MaxAttempts a task's attempts
	// when it sets none; AckWait the consumers' ack wait.
	Limits      protocol.Limits
	MaxAttempts int
	AckWait     time.Duration
	Log         zerolog.Logger
	Admission   *admission.Stage
	Fin         *finish.Finisher
	Complete    *jsplumb.Completer
	Pipelines   finish.Pipelines // a pipeline's sealed progress
	Superseded  Superseded
	Metrics     Metrics
	Tracer      *tracing.Tracer // a new pipeline reserves its spans (pipeline.go)
	// Lost counts the attempts lost with the attempt streams (lost.go),
	// Parked the tasks parked (park.go).
	Lost, Parked *atomic.Int64
	// Parking is where tasks park; ParkAbove zero: never.
	Parking Parking
}

// Parking is what parking needs beyond intake's Params.
type Parking struct {
	// Above: a tenant parks once it holds this many tasks of a band while
	// another tenant sends to it (MLSCHED_PARK_ABOVE; 0: never park).
	Above int
	JS    jetstream.JetStream
	Pub   jsplumb.Sender // where parked tasks are published
	Log   zerolog.Logger
}

// Superseded is what intake asks of the superseded set.
type Superseded interface {
	// Cancelled: the task of this submission was cancelled; CancelledAny:
	// any submission of it (a pipeline's later steps).
	Cancelled(task, submission string) bool
	CancelledAny(task string) bool
	// LostAttempt is the record of an attempt of the task lost with the
	// attempt streams; Mark supersedes that attempt.
	LostAttempt(task, submission string) (admission.Record, bool)
	Mark(task, submission string, attempt int)
}

// Metrics hears of the tasks received, by type ("invalid" for those
// rejected).
type Metrics interface {
	Received(typ string)
}

// New builds the intake stage.
func New(p Params) *Stage {
	in := &Stage{Params: p, redeliver: newRedeliveries()}
	in.park = newParking(parkingParams{above: p.Parking.Above, ackWait: p.AckWait, log: p.Parking.Log, js: p.Parking.JS,
		held: p.Admission, pub: p.Parking.Pub, complete: p.Complete, parked: p.Parked, handle: in.HandleParked})
	return in
}

// RedeliveryService runs the result lookups of redelivered tasks.
func (in *Stage) RedeliveryService() lifecycle.Service { return in.redeliver.service() }

// ParkingService runs the consumers of parked tasks.
func (in *Stage) ParkingService() lifecycle.Service { return in.park.service() }

// Parked lists the parked tasks' consumers running (durables and filters).
func (in *Stage) Parked() (durables, filters []string) { return in.park.running() }

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

// HandleTask is one message of a band of MLSCHED_TASKS.
func (in *Stage) HandleTask(msg jetstream.Msg) {
	o := taskOrigin{subject: msg.Subject(), first: true, traceparent: protocol.TraceparentOf(msg.Headers())}
	if meta, err := msg.Metadata(); err == nil {
		o.submitted, o.submission = meta.Timestamp, strconv.FormatUint(meta.Sequence.Stream, 10)
		o.first = meta.NumDelivered == 1
	} else {
		o.submitted = time.Now()
	}
	in.take(msg, o)
}

// HandleParked is one parked task coming back (park.go).
func (in *Stage) HandleParked(msg jetstream.Msg) {
	o, err := parkedOrigin(msg)
	if err != nil {
		in.Log.Warn().Err(err).Str("subject", msg.Subject()).Msg("task rejected")
		task, _ := protocol.DecodeTask(msg.Data(), in.Limits)
		a := admission.Attempt{Spec: finish.Spec{Task: task, Data: msg.Data(), Attempt: 1, Submitted: time.Now(), Traceparent: o.traceparent}}
		e := a.Ends(msg, err, protocol.StatusRejected)
		e.Subject = msg.Subject()
		in.Fin.End(e)
		return
	}
	in.take(msg, o)
}

// take validates a task and dispatches it (or holds, or parks it).
func (in *Stage) take(msg jetstream.Msg, o taskOrigin) {
	data := msg.Data()
	task, err := protocol.DecodeTask(data, in.Limits)
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
		in.Metrics.Received(typ)
	}
	if err != nil {
		in.Log.Warn().Err(err).Str("task_id", task.ID).Str("subject", o.subject).Msg("task rejected")
		e := a.Ends(msg, err, protocol.StatusRejected)
		e.Subject = o.subject
		in.Fin.End(e)
		return
	}
	if in.Superseded.Cancelled(task.ID, o.submission) || a.PipeStep && in.Superseded.CancelledAny(task.ID) {
		// cancelled while it waited (a pipeline: at any step): it has its result
		in.Fin.End(a.EndsStored(msg))
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
func (in *Stage) enter(msg jetstream.Msg, a admission.Attempt, o taskOrigin) {
	if !o.parked && !a.PipeStep && in.park.shouldPark(topology.BandOf(a.Task.Priority), a.Task.TenantName()) {
		in.park.park(msg, &a.Task, a.Data, o)
		return
	}
	in.Admission.Dispatch(a, msg)
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

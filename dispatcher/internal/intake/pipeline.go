package intake

import (
	"github.com/mlsched/mlsched/dispatcher/internal/admission"
	"github.com/mlsched/mlsched/dispatcher/internal/pipeline"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/nats-io/nats.go"
)

// pipelineTake reads a task message's pipeline: the progress of a later
// step (verified), or a new pipeline task, whose progress starts here. It
// sets a.pipe and the step's constraints on a.task.
func (in *Stage) pipelineTake(h nats.Header, a *admission.Attempt) error {
	var v string
	if vs := h[protocol.HdrPipeline]; len(vs) > 0 {
		v = vs[0]
	}
	if v == "" {
		if a.Task.Pipeline == nil {
			return nil
		}
		t := &a.Task
		p := &pipeline.Progress{Def: *t.Pipeline, Type: t.Type, Priority: t.Priority, Tenant: t.Tenant, Size: t.Size,
			Submitted: a.Submitted.UnixMilli(), Seq: 1}
		if t.DeadlineMs > 0 {
			p.Deadline = p.Submitted + t.DeadlineMs
		}
		if in.Tracer.On() { // the pipeline's span and its first step's, recorded as they end (finish)
			p.Parent = a.Traceparent
			p.Trace = in.Tracer.Reserve(p.Parent)
			p.StepTrace = in.Tracer.Reserve(p.Trace)
		}
		sealed, err := in.Pipelines.Seal(p)
		if err != nil {
			return protocol.Errorf(protocol.CodeInvalidPipeline, "%v", err)
		}
		p.ApplyStep(t)
		a.Pipe = sealed
		if p.StepTrace != "" {
			a.Traceparent = p.StepTrace
		}
		return nil
	}
	p, err := in.Pipelines.Open(v)
	if err != nil {
		return protocol.Errorf(protocol.CodeInvalidPipeline, "%v", err)
	}
	p.ApplyStep(&a.Task)
	a.Pipe, a.PipeStep = v, p.Seq > 1
	if p.StepTrace != "" { // the step's attempts nest under its span
		a.Traceparent = p.StepTrace
	}
	return nil
}

package dispatcher

import (
	"bytes"
	"context"
	"crypto/hmac"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/shared/jsplumb"
	"github.com/mlsched/mlsched/shared/opshttp"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// Pipelines (docs/protocol.md, "Pipelines"). A pipeline task runs its first
// step as a plain task of its type. Each later step is a task message of
// its own, on its step type's subject of MLSCHED_TASKS, with the same id
// and the pipeline's progress (pipeProgress, sealed like a dispatch) in
// the Mlsched-Pipeline header, carried on every dispatch of the step and
// echoed on its outcomes, so that any replica goes on from any outcome.
//
// When a step's attempt succeeds, the finisher's end (results.go, the one
// way a task ends) does not store a result: it stores the next step's
// message (Nats-Msg-Id p:<id>:<submitted>:<seq>, so a redelivered outcome
// stores it once), and only then acks the step's task message with the
// outcome. The previous output is thus stored before the next step starts,
// in the task stream and bounded by its limits, and a crash at any point
// redelivers either the step or its successor. The last step, a failed
// step, a switch that matches no case, or the pipeline's deadline end it
// with its one final result, through the same end.

// pipeProgress is a running pipeline's state, sealed in HdrPipeline.
type pipeProgress struct {
	Def protocol.Pipeline `json:"def"`
	// Type, Priority, Tenant and Size are the pipeline task's.
	Type     string  `json:"type"`
	Priority int     `json:"priority,omitempty"`
	Tenant   string  `json:"tenant,omitempty"`
	Size     float64 `json:"size,omitempty"`
	// Submitted is when the pipeline task entered MLSCHED_TASKS, and
	// Deadline when its deadline_ms runs out (0: none); unix ms.
	Submitted int64 `json:"submitted"`
	Deadline  int64 `json:"deadline,omitempty"`
	// Seq counts the steps started, this one included (1: the first).
	Seq int `json:"seq"`
	// Pos is the running step's index in Def.Steps, Member its member's
	// index when it is an ensemble.
	Pos    int `json:"pos"`
	Member int `json:"member,omitempty"`
	// EnsIn is a running ensemble's input, Merged its members' outputs so
	// far.
	EnsIn  json.RawMessage            `json:"ens_in,omitempty"`
	Merged map[string]json.RawMessage `json:"merged,omitempty"`
	// Steps are the records of the steps that ended.
	Steps []protocol.StepRecord `json:"steps,omitempty"`
}

// step is the running step (an ensemble's running member).
func (p *pipeProgress) step() (st *protocol.PipelineStep, ensemble string) {
	s := &p.Def.Steps[p.Pos]
	if len(s.Ensemble) > 0 {
		return &s.Ensemble[p.Member], s.Name
	}
	return s, ""
}

// valid: the progress points at a step that runs (a sealed one always
// does; checked so that no index can panic).
func (p *pipeProgress) valid() bool {
	if p.Pos < 0 || p.Pos >= len(p.Def.Steps) {
		return false
	}
	s := &p.Def.Steps[p.Pos]
	if len(s.Ensemble) > 0 {
		return p.Member >= 0 && p.Member < len(s.Ensemble)
	}
	return s.Switch == nil && s.Type != ""
}

var errPipelineSeal = errors.New("the pipeline's progress does not carry a dispatcher's seal")

// pipelineDomain separates the progress's MAC from a dispatch's seal.
const pipelineDomain = "mlsched-pipeline\x00"

// sealPipeline encodes p as HdrPipeline's value: base64url(JSON) "."
// hex(HMAC).
func (s *sealer) sealPipeline(p *pipeProgress) (string, error) {
	data, err := json.Marshal(p)
	if err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(data) + "." + hex.EncodeToString(s.pipelineMAC(data)), nil
}

// openPipeline verifies and decodes HdrPipeline's value.
func (s *sealer) openPipeline(v string) (*pipeProgress, error) {
	i := bytes.LastIndexByte([]byte(v), '.')
	if i < 0 {
		return nil, errPipelineSeal
	}
	data, err := base64.RawURLEncoding.DecodeString(v[:i])
	if err != nil {
		return nil, errPipelineSeal
	}
	mac, err := hex.DecodeString(v[i+1:])
	if err != nil || !hmac.Equal(mac, s.pipelineMAC(data)) {
		return nil, errPipelineSeal
	}
	var p pipeProgress
	if err := json.Unmarshal(data, &p); err != nil || !p.valid() {
		return nil, errPipelineSeal
	}
	return &p, nil
}

func (s *sealer) pipelineMAC(data []byte) []byte {
	st := s.pool.Get().(*sealState)
	st.mac.Reset()
	st.mac.Write([]byte(pipelineDomain))
	st.mac.Write(data)
	sum := st.mac.Sum(nil)
	s.pool.Put(st)
	return sum
}

// applyStep makes the task the running step's: its type's constraints.
func (p *pipeProgress) applyStep(t *protocol.Task) {
	st, _ := p.step()
	t.Models, t.TimeoutMs, t.MaxAttempts = st.Models, st.TimeoutMs, st.MaxAttempts
}

// pipelineTake reads a task message's pipeline: the progress of a later
// step (verified), or a new pipeline task, whose progress starts here. It
// sets a.pipe and the step's constraints on a.task.
func (in *intake) pipelineTake(h nats.Header, a *attemptSpec) error {
	var v string
	if vs := h[protocol.HdrPipeline]; len(vs) > 0 {
		v = vs[0]
	}
	if v == "" {
		if a.task.Pipeline == nil {
			return nil
		}
		t := &a.task
		p := &pipeProgress{Def: *t.Pipeline, Type: t.Type, Priority: t.Priority, Tenant: t.Tenant, Size: t.Size,
			Submitted: a.submitted.UnixMilli(), Seq: 1}
		if t.DeadlineMs > 0 {
			p.Deadline = p.Submitted + t.DeadlineMs
		}
		sealed, err := in.sealer.sealPipeline(p)
		if err != nil {
			return protocol.Errorf(protocol.CodeInvalidPipeline, "%v", err)
		}
		p.applyStep(t)
		a.pipe = sealed
		return nil
	}
	p, err := in.sealer.openPipeline(v)
	if err != nil {
		return protocol.Errorf(protocol.CodeInvalidPipeline, "%v", err)
	}
	p.applyStep(&a.task)
	a.pipe, a.pipeStep = v, p.Seq > 1
	return nil
}

// retryStep gives a retry of a pipeline step its step's constraints again
// (the task bytes of a first step are the producer's).
func (oc *outcomes) retryStep(a *attemptSpec) {
	if a.pipe == "" || a.task.ID == "" {
		return
	}
	if p, err := oc.sealer.openPipeline(a.pipe); err == nil {
		p.applyStep(&a.task)
	}
}

// stepRecord is the record of the running step ending with res (or
// failing with status and the error of e).
func (p *pipeProgress) stepRecord(e *ending, res *protocol.Result) protocol.StepRecord {
	st, ens := p.step()
	r := protocol.StepRecord{Name: st.Name, Ensemble: ens, Type: res.Type, Model: res.Model, Node: res.Node,
		Attempts: res.Attempts, LatencyMs: msSince(e.submitted), Status: res.Status, Error: res.Error}
	if r.Type == "" {
		r.Type = st.Type
	}
	if r.Model == "" && len(res.History) > 0 {
		last := res.History[len(res.History)-1]
		r.Model, r.Node = last.Model, last.Node
	}
	if r.Status != protocol.StatusSucceeded {
		r.Status = protocol.StatusFailed
	}
	return r
}

// finalResult turns res into the pipeline's result: its type and latency,
// every step's record, and its attempts over all steps.
func (p *pipeProgress) finalResult(res *protocol.Result, steps []protocol.StepRecord) {
	res.Type = p.Type
	res.Steps = steps
	res.LatencyMs = msSince(time.UnixMilli(p.Submitted))
	res.Attempts = 0
	for _, s := range steps {
		res.Attempts += s.Attempts
	}
}

// pipelineFailed makes res, the failure of the running step, the
// pipeline's result: the step named, pipeline_error unless the pipeline
// was cancelled, expired or refused by flow control (whose codes stay).
func (f *finisher) pipelineFailed(e *ending, res *protocol.Result) {
	p, err := f.sealer.openPipeline(e.pipe)
	if err != nil {
		res.Error, res.ErrorCode = err.Error(), protocol.CodePipelineError
		return
	}
	rec := p.stepRecord(e, res)
	f.metrics.pipeSteps.Get(opshttp.L2{A: rec.Type, B: string(protocol.StatusFailed)}).Inc()
	p.finalResult(res, append(p.Steps, rec))
	res.FailedStep = rec.Name
	code := res.ErrorCode
	switch code {
	case protocol.CodeCancelled, protocol.CodeExpired, protocol.CodeShed, protocol.CodeQuotaExceeded, protocol.CodeBudgetExceeded, protocol.CodeSaturated:
		res.Error = fmt.Sprintf("step %s (%s): %s", rec.Name, rec.Type, res.Error)
	default:
		res.Error = fmt.Sprintf("step %s (%s) failed: %s: %s", rec.Name, rec.Type, code, res.Error)
		res.ErrorCode = protocol.CodePipelineError
	}
	if p.Seq > 1 || res.Attempts > 0 {
		res.Status = protocol.StatusFailed // it ran
	}
}

// pipelineStep ends a pipeline step's attempt that has a result (end):
// a success goes on to the next step, or ends the pipeline with its one
// result; a failure ends it.
func (f *finisher) pipelineStep(msg jsplumb.Msg, e *ending) {
	res := e.result
	if res.Status != protocol.StatusSucceeded {
		f.pipelineFailed(e, res)
		f.finish(msg, res, e.traceparent)
		return
	}
	p, err := f.sealer.openPipeline(e.pipe)
	if err != nil {
		res.Status, res.Error, res.ErrorCode, res.Output = protocol.StatusFailed, err.Error(), protocol.CodePipelineError, nil
		f.finish(msg, res, e.traceparent)
		return
	}
	rec := p.stepRecord(e, res)
	f.metrics.pipeSteps.Get(opshttp.L2{A: rec.Type, B: string(protocol.StatusSucceeded)}).Inc()
	next, payload, final, failedAt, err := p.advance(rec, res.Output)
	fail := func(code protocol.Code, err error, at string) {
		p.finalResult(res, next.Steps)
		res.Status, res.Output, res.FailedStep = protocol.StatusFailed, nil, at
		res.Error, res.ErrorCode = err.Error(), code
		f.finish(msg, res, e.traceparent)
	}
	if err != nil {
		fail(protocol.CodePipelineError, err, failedAt)
		return
	}
	if next == nil { // the end: the pipeline's result
		p.finalResult(res, append(p.Steps, rec))
		res.Output = final
		f.finish(msg, res, e.traceparent)
		return
	}
	nst, _ := next.step()
	var remaining int64
	if p.Deadline > 0 {
		if remaining = p.Deadline - time.Now().UnixMilli(); remaining <= 0 {
			fail(protocol.CodeExpired, fmt.Errorf("step %s (%s): the pipeline's deadline_ms passed before it could start", nst.Name, nst.Type), nst.Name)
			return
		}
	}
	m, err := f.stepMsg(next, res.ID, payload, remaining, e.traceparent)
	if err == nil {
		err = f.complete.Publish(context.Background(), f.resPub, msg, m, "", func(ack *jetstream.PubAck, err error) error {
			if err != nil {
				f.log.Warn().Err(err).Str("task_id", res.ID).Str("step", nst.Name).Msg("pipeline step publish failed, will retry")
			}
			return err
		})
	}
	if err != nil {
		f.complete.Settle(msg, err)
	}
}

// stepMsg is the task message of next's running step.
func (f *finisher) stepMsg(next *pipeProgress, id string, payload json.RawMessage, deadlineMs int64, traceparent string) (*nats.Msg, error) {
	st, _ := next.step()
	t := protocol.Task{ID: id, Type: st.Type, Payload: payload, Models: st.Models, TimeoutMs: st.TimeoutMs,
		MaxAttempts: st.MaxAttempts, Priority: next.Priority, Tenant: next.Tenant, Size: next.Size, DeadlineMs: deadlineMs}
	data, err := json.Marshal(&t)
	if err != nil {
		return nil, err
	}
	sealed, err := f.sealer.sealPipeline(next)
	if err != nil {
		return nil, err
	}
	h := nats.Header{protocol.HdrPipeline: {sealed},
		protocol.HdrMsgID: {"p:" + id + ":" + strconv.FormatInt(next.Submitted, 10) + ":" + strconv.Itoa(next.Seq)}}
	if traceparent != "" {
		h[protocol.HdrTraceparent] = []string{traceparent}
	}
	return &nats.Msg{Subject: topology.BandTaskSubject(st.Type, next.Priority), Data: data, Header: h}, nil
}

// advance: the running step ended with rec and output. It returns the
// progress of the next step to run and its payload, or (next nil) the
// pipeline's final output; an error names the step the pipeline could
// not go on at. next is never nil with an error (its Steps are the
// records so far).
func (p *pipeProgress) advance(rec protocol.StepRecord, output json.RawMessage) (next *pipeProgress, payload, final json.RawMessage, failedAt string, err error) {
	q := *p
	q.Steps = append(slices.Clip(p.Steps), rec)
	q.Seq++
	s := &p.Def.Steps[p.Pos]
	if len(s.Ensemble) > 0 {
		merged := maps.Clone(p.Merged)
		if merged == nil {
			merged = map[string]json.RawMessage{}
		}
		merged[s.Ensemble[p.Member].Name] = output
		if p.Member+1 < len(s.Ensemble) {
			q.Member, q.Merged = p.Member+1, merged
			m := &s.Ensemble[q.Member]
			in, ok := protocol.Lookup(p.EnsIn, m.Input)
			if !ok {
				return &q, nil, nil, m.Name, fmt.Errorf("step %s: input %q is not in the ensemble's input", m.Name, m.Input)
			}
			return &q, in, nil, "", nil
		}
		if output, err = json.Marshal(merged); err != nil {
			return &q, nil, nil, s.Name, err
		}
		q.Member, q.Merged, q.EnsIn = 0, nil, nil
	}
	idx := p.Pos + 1
	for from := s; ; {
		if from.Next == protocol.PipelineEnd {
			idx = len(p.Def.Steps)
		} else if from.Next != "" {
			idx = p.Def.Index(from.Next)
		}
		if idx >= len(p.Def.Steps) {
			return nil, nil, output, "", nil
		}
		ns := &p.Def.Steps[idx]
		switch {
		case ns.Switch != nil:
			target, ok := ns.Switch.Choose(output)
			if !ok {
				v, _ := protocol.Lookup(output, ns.Switch.On)
				return &q, nil, nil, ns.Name, fmt.Errorf("switch %s: no case matches %s at %q", ns.Name, truncateJSON(v), ns.Switch.On)
			}
			from = &protocol.PipelineStep{Next: target}
			continue
		case len(ns.Ensemble) > 0:
			in, ok := protocol.Lookup(output, ns.Input)
			if !ok {
				return &q, nil, nil, ns.Name, fmt.Errorf("step %s: input %q is not in the previous output", ns.Name, ns.Input)
			}
			q.Pos, q.Member, q.EnsIn, q.Merged = idx, 0, in, nil
			m := &ns.Ensemble[0]
			if payload, ok = protocol.Lookup(in, m.Input); !ok {
				return &q, nil, nil, m.Name, fmt.Errorf("step %s: input %q is not in the ensemble's input", m.Name, m.Input)
			}
			return &q, payload, nil, "", nil
		default:
			in, ok := protocol.Lookup(output, ns.Input)
			if !ok {
				return &q, nil, nil, ns.Name, fmt.Errorf("step %s: input %q is not in the previous output", ns.Name, ns.Input)
			}
			q.Pos, q.Member = idx, 0
			return &q, in, nil, "", nil
		}
	}
}

// truncateJSON shortens a JSON value for an error message.
func truncateJSON(v json.RawMessage) string {
	if len(v) == 0 {
		return "nothing"
	}
	if len(v) > 64 {
		return string(v[:64]) + "…"
	}
	return string(v)
}

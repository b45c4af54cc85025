// Package pipeline is a running pipeline's progress (docs/protocol.md,
// "Pipelines"): where it is, the records of the steps that ended, and the
// rule that goes from one step's output to the next step. It is pure: the
// dispatcher seals the progress into a task's Mlsched-Pipeline header
// (trust.go), intake reads it (pipeline.go) and the finish stage advances
// it (internal/finish).
package pipeline

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/mlsched/mlsched/shared/protocol"
)

// Progress is a running pipeline's state, sealed in HdrPipeline.
type Progress struct {
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
	// Fan, in an ensemble whose members run in parallel (Fanout), is the
	// Seq of its first member: member i runs as step Fan+i, and stores
	// its output under MemberKey; 0: not a parallel member (a progress
	// sealed before members ran in parallel goes on one after another).
	Fan int `json:"fan,omitempty"`
	// EnsIn is a running ensemble's input, Merged its members' outputs so
	// far.
	EnsIn  json.RawMessage            `json:"ens_in,omitempty"`
	Merged map[string]json.RawMessage `json:"merged,omitempty"`
	// Steps are the records of the steps that ended.
	Steps []protocol.StepRecord `json:"steps,omitempty"`
	// With tracing on: Parent is the pipeline task's own traceparent (the
	// producer's, "" for none), Trace the pipeline span's and StepTrace the
	// running step's, both reserved (tracing.Reserve) and recorded when
	// they end: a step's decisions and dispatches start from StepTrace, so
	// its attempts nest under its span, and every step's span under the
	// pipeline's.
	Parent    string `json:"parent,omitempty"`
	Trace     string `json:"trace,omitempty"`
	StepTrace string `json:"step_trace,omitempty"`
}

// Step is the running step (an ensemble's running member).
func (p *Progress) Step() (st *protocol.PipelineStep, ensemble string) {
	s := &p.Def.Steps[p.Pos]
	if len(s.Ensemble) > 0 {
		return &s.Ensemble[p.Member], s.Name
	}
	return s, ""
}

// Valid: the progress points at a step that runs (a sealed one always
// does; checked so that no index can panic).
func (p *Progress) Valid() bool {
	if p.Pos < 0 || p.Pos >= len(p.Def.Steps) {
		return false
	}
	s := &p.Def.Steps[p.Pos]
	if len(s.Ensemble) > 0 {
		return p.Member >= 0 && p.Member < len(s.Ensemble)
	}
	return s.Switch == nil && s.Type != ""
}

// ApplyStep makes the task the running step's: its type's constraints.
func (p *Progress) ApplyStep(t *protocol.Task) {
	st, _ := p.Step()
	t.Models, t.TimeoutMs, t.MaxAttempts = st.Models, st.TimeoutMs, st.MaxAttempts
}

// StepRecord is the record of the running step ending with res (or
// failing with status and the error of e).
func (p *Progress) StepRecord(submitted time.Time, res *protocol.Result) protocol.StepRecord {
	st, ens := p.Step()
	r := protocol.StepRecord{Name: st.Name, Ensemble: ens, Type: res.Type, Model: res.Model, Node: res.Node,
		Attempts: res.Attempts, LatencyMs: MsSince(submitted), Status: res.Status, Error: res.Error}
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

// FinalResult turns res into the pipeline's result: its type and latency,
// every step's record, and its attempts over all steps.
func (p *Progress) FinalResult(res *protocol.Result, steps []protocol.StepRecord) {
	res.Type = p.Type
	res.Steps = steps
	res.LatencyMs = MsSince(time.UnixMilli(p.Submitted))
	res.Attempts = 0
	for _, s := range steps {
		res.Attempts += s.Attempts
	}
}

// Advance: the running step ended with rec and output. It returns the
// progress of the next step to run and its payload, or (next nil) the
// pipeline's final output; an error names the step the pipeline could
// not go on at. next is never nil with an error (its Steps are the
// records so far).
func (p *Progress) Advance(rec protocol.StepRecord, output json.RawMessage) (next *Progress, payload, final json.RawMessage, failedAt string, err error) {
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
		q.Member, q.Merged, q.EnsIn, q.Fan = 0, nil, nil, 0
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

// Fanout: q (as Advance returned it) starts an ensemble. It returns the
// progress and payload of every member, all to run at once: member i as
// step q.Seq+i, with Fan q.Seq. failedAt and err name a member whose input
// is not in the ensemble's input.
func (q *Progress) Fanout() (members []*Progress, payloads []json.RawMessage, failedAt string, err error) {
	s := &q.Def.Steps[q.Pos]
	for i := range s.Ensemble {
		m := *q
		m.Member, m.Fan, m.Seq, m.Merged = i, q.Seq, q.Seq+i, nil
		in, ok := protocol.Lookup(q.EnsIn, s.Ensemble[i].Input)
		if !ok {
			return nil, nil, s.Ensemble[i].Name, fmt.Errorf("step %s: input %q is not in the ensemble's input", s.Ensemble[i].Name, s.Ensemble[i].Input)
		}
		members, payloads = append(members, &m), append(payloads, in)
	}
	return members, payloads, "", nil
}

// Starts: q, as Advance returned it, is the first member of an ensemble
// to start, whose members Fanout starts together.
func (q *Progress) Starts() bool {
	return q.Fan == 0 && q.Member == 0 && len(q.Def.Steps[q.Pos].Ensemble) > 0
}

// Members is the number of members of the running step's ensemble.
func (p *Progress) Members() int { return len(p.Def.Steps[p.Pos].Ensemble) }

// MemberOut is what an ensemble member that ran in parallel stored as it
// succeeded: its record and its output.
type MemberOut struct {
	Rec    protocol.StepRecord `json:"rec"`
	Output json.RawMessage     `json:"output"`
}

// MemberKey is the key (in the MLSCHED_PIPELINE bucket) of member of the
// parallel ensemble p runs in, of the pipeline task id: the id in
// base64url (a key's alphabet), the pipeline's submission and the
// ensemble's Fan.
func (p *Progress) MemberKey(id string, member int) string {
	return base64.RawURLEncoding.EncodeToString([]byte(id)) + "." + strconv.FormatInt(p.Submitted, 10) + "." +
		strconv.Itoa(p.Fan) + "." + strconv.Itoa(member)
}

// Join: every member of p's parallel ensemble succeeded, with outs in
// member order. It returns the progress at the last member with the
// others' records and outputs merged, from which Advance(outs[last].Rec,
// outs[last].Output) goes on after the ensemble, as after the last of
// members run one after another.
func (p *Progress) Join(outs []MemberOut) *Progress {
	q := *p
	n := len(outs)
	s := &p.Def.Steps[p.Pos]
	q.Member, q.Seq = n-1, p.Fan+n-1
	q.Steps = slices.Clip(p.Steps)
	q.Merged = make(map[string]json.RawMessage, n)
	for i := range n - 1 {
		q.Steps = append(q.Steps, outs[i].Rec)
		q.Merged[s.Ensemble[i].Name] = outs[i].Output
	}
	q.Steps = slices.Clip(q.Steps)
	return &q
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

// MsSince is the milliseconds since t (0 for a zero t).
func MsSince(t time.Time) float64 {
	if t.IsZero() {
		return 0
	}
	return float64(time.Since(t).Microseconds()) / 1000
}

package executor

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/mlsched/mlsched/worker/model"
)

// RunBatch runs the tasks in as few calls as their tensors allow. In OIP v2
// mode each task's payload is mapped onto its input tensors as for Run;
// the tasks whose tensors agree in every dimension but the first (the
// batch dimension) become one inference request whose inputs are theirs
// stacked along it, and the response's outputs are split back along it,
// each task getting its own rows. A task whose payload does not map fails
// alone (a task error) without being sent; a task whose payload is an
// inference request of its own runs on its own call.
//
// OIP has no per-item errors: a batch the server refuses as bad input
// (400, 413, 422) is run again task by task, so that only the bad task
// fails; any other failure of the call is each task's model error.
// Passthrough mode has no batch form: each task runs on its own call.
func (h *HTTP) RunBatch(ctx context.Context, ts []Task) ([]Result, error) {
	if h.mode != model.HTTPOIP {
		return runEach(ctx, ts, h.Run), nil
	}
	if wait := h.cooling(); wait > 0 {
		return nil, &CooldownError{Wait: wait, Err: fmt.Errorf("%w: not sent: the server asked for no requests until then", ErrModelServer)}
	}
	rs := make([]Result, len(ts))
	type item struct {
		i       int
		tensors []oipTensor
		rows    int64
	}
	groups := map[string][]item{}
	var order []string // groups in the order of their first task
	var alone []int
	for i, t := range ts {
		tensors, err := oipInputs(t, h.inputs)
		switch {
		case err != nil:
			rs[i].Err = err
			continue
		case tensors == nil: // an inference request of its own
			alone = append(alone, i)
			continue
		}
		key, rows, ok := batchKey(tensors)
		if !ok {
			alone = append(alone, i)
			continue
		}
		if _, seen := groups[key]; !seen {
			order = append(order, key)
		}
		groups[key] = append(groups[key], item{i: i, tensors: tensors, rows: rows})
	}
	var calls []func()
	for _, i := range alone {
		calls = append(calls, func() { rs[i].Output, rs[i].Err = h.Run(ctx, ts[i]) })
	}
	for _, key := range order {
		g := groups[key]
		calls = append(calls, func() {
			idx := make([]int, len(g))
			rows := make([]int64, len(g))
			parts := make([][]oipTensor, len(g))
			for j, it := range g {
				idx[j], rows[j], parts[j] = it.i, it.rows, it.tensors
			}
			outs, err := h.callBatch(ctx, ts[idx[0]], parts, rows)
			if err != nil && len(g) > 1 && IsTaskError(err) {
				// Which input is bad the server does not say: each task on
				// its own call, so that only the bad one fails.
				sub := make([]Task, len(idx))
				for j, i := range idx {
					sub[j] = ts[i]
				}
				for j, r := range runEach(ctx, sub, h.Run) {
					rs[idx[j]] = r
				}
				return
			}
			for j, i := range idx {
				if err != nil {
					rs[i].Err = err
				} else {
					rs[i].Output = outs[j]
				}
			}
		})
	}
	if len(calls) == 1 {
		calls[0]()
		return rs, nil
	}
	done := make(chan struct{}, len(calls))
	for _, c := range calls {
		go func() { c(); done <- struct{}{} }()
	}
	for range calls {
		<-done
	}
	return rs, nil
}

// batchKey says which tasks can share a call: the same inputs with the
// same datatypes and the same dimensions after the first. rows is the
// task's extent along the first dimension, the same for every input.
func batchKey(tensors []oipTensor) (key string, rows int64, ok bool) {
	var b strings.Builder
	rows = -1
	for _, t := range tensors {
		if len(t.Shape) == 0 || (rows >= 0 && t.Shape[0] != rows) {
			return "", 0, false
		}
		rows = t.Shape[0]
		b.WriteString(t.Name)
		b.WriteByte(0)
		b.WriteString(t.Datatype)
		for _, d := range t.Shape[1:] {
			b.WriteByte(0)
			b.WriteString(strconv.FormatInt(d, 10))
		}
		b.WriteByte(1)
	}
	return b.String(), rows, rows > 0
}

// callBatch sends one inference request of the tasks' tensors stacked
// along the first dimension and returns each task's output.
func (h *HTTP) callBatch(ctx context.Context, first Task, parts [][]oipTensor, rows []int64) ([]json.RawMessage, error) {
	var total int64
	for _, r := range rows {
		total += r
	}
	inputs := make([]oipTensor, len(parts[0]))
	for k := range inputs {
		proto := parts[0][k]
		var data bytes.Buffer
		data.WriteByte('[')
		for j, p := range parts {
			d := bytes.TrimSpace(p[k].Data)
			if j > 0 {
				data.WriteByte(',')
			}
			data.Write(d[1 : len(d)-1]) // mapTensor's flat JSON array, never empty
		}
		data.WriteByte(']')
		shape := append([]int64{total}, proto.Shape[1:]...)
		inputs[k] = oipTensor{Name: proto.Name, Shape: shape, Datatype: proto.Datatype, Data: data.Bytes()}
	}
	body, err := json.Marshal(struct {
		ID     string      `json:"id,omitempty"`
		Inputs []oipTensor `json:"inputs"`
	}{ID: "batch-" + first.ID, Inputs: inputs})
	if err != nil {
		return nil, fmt.Errorf("%w: encode the batch's inference request: %v", ErrModelServer, err)
	}
	_, data, err := h.post(ctx, body, first.ID, first.Traceparent)
	if err != nil {
		return nil, err
	}
	outs, err := parseOIPOutputs(data)
	if err != nil {
		return nil, fmt.Errorf("%w: malformed inference response: %v: %s", ErrModelServer, err, snippet(data))
	}
	per := make([][]oipOutput, len(rows))
	for _, o := range outs {
		if len(o.shape) == 0 || o.shape[0] != total {
			return nil, fmt.Errorf("%w: malformed inference response: output %s: shape %v has no batch dimension of %d (the batch's rows)",
				ErrModelServer, o.name, o.shape, total)
		}
		each := int64(1)
		for _, d := range o.shape[1:] {
			each *= d
		}
		var off int64
		for j, r := range rows {
			shape := append([]int64{r}, o.shape[1:]...)
			per[j] = append(per[j], oipOutput{name: o.name, shape: shape, flat: o.flat[off*each : (off+r)*each]})
			off += r
		}
	}
	res := make([]json.RawMessage, len(rows))
	for j := range per {
		if res[j], err = encodeOIPOutputs(per[j]); err != nil {
			return nil, fmt.Errorf("%w: encode output: %v", ErrModelServer, err)
		}
	}
	return res, nil
}

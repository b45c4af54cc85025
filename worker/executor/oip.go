package executor

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/mlsched/mlsched/worker/model"
)

// Open Inference Protocol v2 (the REST API of KServe, Triton and MLServer):
// the request a task becomes and the result an inference response becomes.
// docs/models.md describes both.

// oipTensor is an OIP v2 tensor of a request or a response.
type oipTensor struct {
	Name     string          `json:"name"`
	Shape    []int64         `json:"shape"`
	Datatype string          `json:"datatype"`
	Data     json.RawMessage `json:"data"`
}

// oipRequest builds the inference request of a task. A payload that is an
// inference request (an object whose "inputs" is a list of tensors) is sent
// as is. Otherwise the model's input mapping turns the payload's fields into
// tensors. Anything else is a task error: the input does not fit the model.
func oipRequest(t Task, inputs []model.TensorSpec) ([]byte, error) {
	tensors, err := oipInputs(t, inputs)
	if err != nil {
		return nil, err
	}
	if tensors == nil {
		return t.Payload, nil
	}
	req := struct {
		ID     string      `json:"id,omitempty"`
		Inputs []oipTensor `json:"inputs"`
	}{ID: t.ID, Inputs: tensors}
	b, err := json.Marshal(req)
	if err != nil {
		return nil, &TaskError{Msg: "payload cannot be encoded as an inference request", Err: err}
	}
	return b, nil
}

// oipInputs maps a task's payload onto the model's input tensors; nil
// tensors and no error when the payload is an inference request itself.
func oipInputs(t Task, inputs []model.TensorSpec) ([]oipTensor, error) {
	var probe struct {
		Inputs []map[string]json.RawMessage `json:"inputs"`
	}
	if json.Unmarshal(t.Payload, &probe) == nil && len(probe.Inputs) > 0 {
		for i, in := range probe.Inputs {
			for _, k := range []string{"name", "shape", "datatype", "data"} {
				if _, ok := in[k]; !ok {
					return nil, &TaskError{Msg: fmt.Sprintf("payload is an inference request but inputs[%d] has no %q", i, k)}
				}
			}
		}
		return nil, nil
	}
	if len(inputs) == 0 {
		return nil, &TaskError{Msg: `payload is not an inference request (an object with "inputs": [{name, shape, datatype, data}]) and the model maps no input tensors (http.inputs)`}
	}
	dec := json.NewDecoder(bytes.NewReader(t.Payload))
	dec.UseNumber()
	var payload any
	if err := dec.Decode(&payload); err != nil {
		return nil, &TaskError{Msg: "payload is not JSON", Err: err}
	}
	obj, isObj := payload.(map[string]any)
	arr, isArr := payload.([]any)
	if !isObj && !(isArr && len(inputs) == 1) {
		want := "an object with the fields " + fieldList(inputs)
		if len(inputs) == 1 {
			want += ", or the data as a JSON array"
		}
		return nil, &TaskError{Msg: "payload does not fit the model's inputs: want " + want}
	}
	var tensors []oipTensor
	for _, in := range inputs {
		field := in.Field
		if field == "" {
			field = in.Name
		}
		var v any = arr
		if isObj {
			var ok bool
			if v, ok = obj[field]; !ok {
				return nil, &TaskError{Msg: fmt.Sprintf("payload has no field %q (input tensor %q)", field, in.Name)}
			}
		}
		tensor, err := mapTensor(in, v)
		if err != nil {
			return nil, &TaskError{Msg: fmt.Sprintf("payload field %q (input tensor %q): %v", field, in.Name, err)}
		}
		tensors = append(tensors, tensor)
	}
	return tensors, nil
}

func fieldList(inputs []model.TensorSpec) string {
	var f []string
	for _, in := range inputs {
		if in.Field != "" {
			f = append(f, in.Field)
		} else {
			f = append(f, in.Name)
		}
	}
	return strings.Join(f, ", ")
}

// mapTensor flattens v (a value or nested arrays) into the tensor's data,
// checks each element against the datatype and the count against the shape.
func mapTensor(in model.TensorSpec, v any) (oipTensor, error) {
	var flat []any
	flatten(v, &flat)
	for i, e := range flat {
		if err := checkElement(in.Datatype, e); err != nil {
			return oipTensor{}, fmt.Errorf("element %d: %v", i, err)
		}
	}
	shape := slices.Clone(in.Shape)
	known, free := int64(1), -1
	for i, d := range shape {
		if d == -1 {
			free = i
		} else {
			known *= d
		}
	}
	n := int64(len(flat))
	switch {
	case free >= 0 && (n == 0 || n%known != 0):
		return oipTensor{}, fmt.Errorf("%d elements do not fit shape %v", n, in.Shape)
	case free >= 0:
		shape[free] = n / known
	case n != known:
		return oipTensor{}, fmt.Errorf("%d elements, shape %v wants %d", n, in.Shape, known)
	}
	data, err := json.Marshal(flat)
	if err != nil {
		return oipTensor{}, err
	}
	return oipTensor{Name: in.Name, Shape: shape, Datatype: in.Datatype, Data: data}, nil
}

func flatten(v any, out *[]any) {
	if a, ok := v.([]any); ok {
		for _, e := range a {
			flatten(e, out)
		}
		return
	}
	*out = append(*out, v)
}

// checkElement: BOOL wants booleans, BYTES strings, the rest numbers;
// integer types want integers in range.
func checkElement(datatype string, e any) error {
	switch datatype {
	case "BOOL":
		if _, ok := e.(bool); !ok {
			return fmt.Errorf("%s wants true or false, got %s", datatype, jsonKind(e))
		}
		return nil
	case "BYTES":
		if _, ok := e.(string); !ok {
			return fmt.Errorf("%s wants a string, got %s", datatype, jsonKind(e))
		}
		return nil
	}
	num, ok := e.(json.Number)
	if !ok {
		return fmt.Errorf("%s wants a number, got %s", datatype, jsonKind(e))
	}
	if strings.HasPrefix(datatype, "FP") {
		if _, err := num.Float64(); err != nil {
			return fmt.Errorf("%s: %v", datatype, err)
		}
		return nil
	}
	i, err := num.Int64()
	if err != nil {
		return fmt.Errorf("%s wants an integer, got %s", datatype, num)
	}
	var bits uint
	fmt.Sscanf(strings.TrimLeft(datatype, "UINT"), "%d", &bits)
	lo, hi := int64(math.MinInt64), int64(math.MaxInt64)
	if strings.HasPrefix(datatype, "UINT") {
		lo = 0
		if bits < 64 {
			hi = int64(1)<<bits - 1
		}
	} else if bits < 64 {
		lo, hi = -(int64(1) << (bits - 1)), int64(1)<<(bits-1)-1
	}
	if i < lo || i > hi {
		return fmt.Errorf("%s: %d is out of range", datatype, i)
	}
	return nil
}

func jsonKind(e any) string {
	switch e.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", e)
}

// decodeOIPResponse turns an inference response into the result's output:
// an object mapping each output tensor's name to its data, shaped as nested
// arrays by its shape; a leading batch dimension of 1 is dropped, so a
// single prediction of shape [1] is a plain value.
func decodeOIPResponse(data []byte) (json.RawMessage, error) {
	outs, err := parseOIPOutputs(data)
	if err != nil {
		return nil, err
	}
	return encodeOIPOutputs(outs)
}

// oipOutput is a checked output tensor of a response: its data flat.
type oipOutput struct {
	name  string
	shape []int64
	flat  []any
}

// parseOIPOutputs reads and checks a response's outputs.
func parseOIPOutputs(data []byte) ([]oipOutput, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var r struct {
		Outputs *[]struct {
			Name     string  `json:"name"`
			Shape    []int64 `json:"shape"`
			Datatype string  `json:"datatype"`
			Data     any     `json:"data"`
		} `json:"outputs"`
	}
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("not an inference response: %v", err)
	}
	if r.Outputs == nil {
		return nil, errors.New(`no "outputs"`)
	}
	if len(*r.Outputs) == 0 {
		return nil, errors.New(`"outputs" is empty`)
	}
	seen := make(map[string]bool, len(*r.Outputs))
	outs := make([]oipOutput, 0, len(*r.Outputs))
	for i, o := range *r.Outputs {
		if o.Name == "" {
			return nil, fmt.Errorf("outputs[%d] has no name", i)
		}
		if seen[o.Name] {
			return nil, fmt.Errorf("outputs[%d]: duplicate name %q", i, o.Name)
		}
		seen[o.Name] = true
		if o.Datatype != "" && !slices.Contains(model.Datatypes, o.Datatype) {
			return nil, fmt.Errorf("outputs[%d] (%s): unknown datatype %q", i, o.Name, o.Datatype)
		}
		if o.Data == nil {
			return nil, fmt.Errorf("outputs[%d] (%s) has no data", i, o.Name)
		}
		var flat []any
		flatten(o.Data, &flat)
		want := int64(1)
		for _, d := range o.Shape {
			if d < 0 {
				return nil, fmt.Errorf("outputs[%d] (%s): shape %v has a negative dimension", i, o.Name, o.Shape)
			}
			want *= d
		}
		if int64(len(flat)) != want {
			return nil, fmt.Errorf("outputs[%d] (%s): %d elements, shape %v wants %d", i, o.Name, len(flat), o.Shape, want)
		}
		outs = append(outs, oipOutput{name: o.Name, shape: o.Shape, flat: flat})
	}
	return outs, nil
}

// encodeOIPOutputs is the result's output of checked tensors.
func encodeOIPOutputs(outs []oipOutput) (json.RawMessage, error) {
	out := make(map[string]any, len(outs))
	for _, o := range outs {
		shape := o.shape
		if len(shape) > 0 && shape[0] == 1 {
			shape = shape[1:]
		}
		v, _ := reshape(o.flat, shape)
		out[o.name] = v
	}
	return json.Marshal(out)
}

// reshape nests flat (whose length is the product of shape) by shape.
func reshape(flat []any, shape []int64) (any, []any) {
	if len(shape) == 0 {
		return flat[0], flat[1:]
	}
	a := make([]any, shape[0])
	for i := range a {
		a[i], flat = reshape(flat, shape[1:])
	}
	return a, flat
}

package executor

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/mlsched/mlsched/worker/model"
)

// maxResponse bounds a model server's response body.
const maxResponse = 8 << 20

// HTTP posts each task to a model server. A 4xx answer is a task error (the
// server refused the input); 5xx and connection errors are model errors.
type HTTP struct {
	name, url, mode string
	headers         map[string]string
	client          *http.Client
}

func newHTTP(s model.Spec) *HTTP {
	h := &HTTP{name: s.Name, url: strings.TrimRight(s.HTTP.URL, "/"), mode: s.HTTP.Mode,
		headers: s.HTTP.Headers, client: &http.Client{}}
	if h.mode == "" {
		h.mode = model.HTTPPassthrough
	}
	if h.mode == model.HTTPOIP {
		m := s.HTTP.Model
		if m == "" {
			m = s.Name
		}
		h.url += "/v2/models/" + url.PathEscape(m) + "/infer"
	}
	return h
}

// oipTensor is an Open Inference Protocol v2 tensor.
type oipTensor struct {
	Name     string          `json:"name"`
	Shape    []int64         `json:"shape"`
	Datatype string          `json:"datatype"`
	Data     json.RawMessage `json:"data"`
}

type oipRequest struct {
	ID     string      `json:"id,omitempty"`
	Inputs []oipTensor `json:"inputs"`
}

type oipResponse struct {
	ModelName string      `json:"model_name"`
	ID        string      `json:"id,omitempty"`
	Outputs   []oipTensor `json:"outputs"`
}

// oipBody builds the inference request: a payload that already is an OIP
// request (an object with "inputs") is sent as is; any other payload becomes
// one BYTES tensor named "input" holding the payload's JSON text.
func oipBody(t Task) ([]byte, error) {
	var probe struct {
		Inputs json.RawMessage `json:"inputs"`
	}
	if json.Unmarshal(t.Payload, &probe) == nil && len(probe.Inputs) > 0 {
		return t.Payload, nil
	}
	p := string(t.Payload)
	if p == "" {
		p = "null"
	}
	data, _ := json.Marshal([]string{p})
	return json.Marshal(oipRequest{ID: t.ID, Inputs: []oipTensor{{Name: "input", Shape: []int64{1}, Datatype: "BYTES", Data: data}}})
}

// Run posts the task and classifies the answer.
func (h *HTTP) Run(ctx context.Context, t Task) (json.RawMessage, error) {
	body := []byte(t.Payload)
	if h.mode == model.HTTPOIP {
		var err error
		if body, err = oipBody(t); err != nil {
			return nil, &TaskError{Msg: "payload cannot be sent as an inference request", Err: err}
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("model server request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Mlsched-Task-Id", t.ID)
	for k, v := range h.headers {
		req.Header.Set(k, v)
	}
	resp, err := h.client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("model server: %w", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse+1))
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("model server response: %w", err)
	}
	if len(data) > maxResponse {
		return nil, fmt.Errorf("model server response exceeds %d bytes", maxResponse)
	}
	switch {
	case resp.StatusCode >= 500:
		return nil, fmt.Errorf("model server: %s: %s", resp.Status, snippet(data))
	case resp.StatusCode >= 400:
		return nil, &TaskError{Msg: fmt.Sprintf("model server refused the input: %s: %s", resp.Status, snippet(data))}
	case resp.StatusCode < 200 || resp.StatusCode >= 300:
		return nil, fmt.Errorf("model server: unexpected %s", resp.Status)
	}
	if h.mode != model.HTTPOIP {
		return rawOrString(data), nil
	}
	var r oipResponse
	if err := json.Unmarshal(data, &r); err != nil || r.Outputs == nil {
		return nil, fmt.Errorf("model server: not an inference response: %s", snippet(data))
	}
	return data, nil
}

// Close releases idle connections.
func (h *HTTP) Close() error {
	h.client.CloseIdleConnections()
	return nil
}

// snippet shortens a response body for an error message.
func snippet(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 200 {
		s = strings.ToValidUTF8(s[:200], "") + "…"
	}
	return s
}

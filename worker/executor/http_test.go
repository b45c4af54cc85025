package executor

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mlsched/mlsched/worker/model"
)

func httpSpec(url, mode string) model.Spec {
	return model.Spec{Name: "remote", Types: []string{"t"}, Executor: model.ExecutorHTTP,
		HTTP: &model.HTTPSpec{URL: url, Mode: mode, Headers: map[string]string{"Authorization": "Bearer k"}}}
}

func TestHTTPPassthrough(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.Method != http.MethodPost || r.Header.Get("Authorization") != "Bearer k" || r.Header.Get("Mlsched-Task-Id") == "" {
			http.Error(w, "bad request line", http.StatusTeapot)
			return
		}
		switch string(body) {
		case `{"q":"json"}`:
			w.Write([]byte(`{"label":"cat"}`))
		case `"text"`:
			w.Write([]byte("a cat"))
		case `"bad"`:
			http.Error(w, "image too small", http.StatusUnprocessableEntity)
		case `"crash"`:
			http.Error(w, "out of memory", http.StatusInternalServerError)
		case `"hang"`:
			<-r.Context().Done()
		default:
			http.Error(w, "unexpected body "+string(body), http.StatusBadRequest)
		}
	}))
	defer srv.Close()
	ex, err := New(httpSpec(srv.URL, ""), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ex.Close()
	call := func(payload string, d time.Duration) (json.RawMessage, error) {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		return ex.Run(ctx, Task{ID: "t1", Payload: json.RawMessage(payload)})
	}
	if out, err := call(`{"q":"json"}`, 5*time.Second); err != nil || string(out) != `{"label":"cat"}` {
		t.Errorf("json: %s %v", out, err)
	}
	if out, err := call(`"text"`, 5*time.Second); err != nil || string(out) != `"a cat"` {
		t.Errorf("text: %s %v", out, err)
	}
	if _, err := call(`"bad"`, 5*time.Second); !IsTaskError(err) || !strings.Contains(err.Error(), "image too small") {
		t.Errorf("4xx: %v, want a task error", err)
	}
	if _, err := call(`"crash"`, 5*time.Second); err == nil || IsTaskError(err) || !strings.Contains(err.Error(), "500") {
		t.Errorf("5xx: %v, want a model error", err)
	}
	if _, err := call(`"hang"`, 50*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("hang: %v, want a deadline error", err)
	}
}

func TestHTTPConnectionRefusedIsAModelError(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close() // nothing listens there now
	ex, _ := New(httpSpec(url, model.HTTPPassthrough), Options{})
	_, err := ex.Run(context.Background(), Task{ID: "x", Payload: json.RawMessage(`1`)})
	if err == nil || IsTaskError(err) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Run: %v, want a model error", err)
	}
}

func TestHTTPOpenInferenceProtocol(t *testing.T) {
	t.Parallel()
	var gotPath string
	var gotReq map[string]any
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotPath = r.URL.Path
		if err := json.NewDecoder(r.Body).Decode(&gotReq); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			w.Write([]byte(`{"error":"not json"}`))
			return
		}
		if gotReq["id"] == "reject" {
			w.WriteHeader(http.StatusBadRequest)
			w.Write([]byte(`{"error":"wrong shape"}`))
			return
		}
		w.Write([]byte(`{"model_name":"resnet","id":"t1","outputs":[{"name":"label","shape":[1],"datatype":"BYTES","data":["cat"]}]}`))
	}))
	defer srv.Close()
	spec := httpSpec(srv.URL+"/", model.HTTPOIP)
	spec.HTTP.Model = "resnet"
	ex, _ := New(spec, Options{})
	out, err := ex.Run(context.Background(), Task{ID: "t1", Payload: json.RawMessage(`{"pixels":[1,2]}`)})
	if err != nil {
		t.Fatal(err)
	}
	if gotPath != "/v2/models/resnet/infer" {
		t.Errorf("path %q", gotPath)
	}
	inputs, _ := gotReq["inputs"].([]any)
	if gotReq["id"] != "t1" || len(inputs) != 1 {
		t.Fatalf("request %v", gotReq)
	}
	in := inputs[0].(map[string]any)
	if in["name"] != "input" || in["datatype"] != "BYTES" || in["data"].([]any)[0] != `{"pixels":[1,2]}` {
		t.Errorf("input tensor %v", in)
	}
	var resp struct {
		Outputs []struct{ Data []string }
	}
	if json.Unmarshal(out, &resp) != nil || len(resp.Outputs) != 1 || resp.Outputs[0].Data[0] != "cat" {
		t.Errorf("output %s", out)
	}
	// A payload that already is an inference request goes as is.
	native := `{"id":"reject","inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1]}]}`
	_, err = ex.Run(context.Background(), Task{ID: "t2", Payload: json.RawMessage(native)})
	if !IsTaskError(err) || !strings.Contains(err.Error(), "wrong shape") {
		t.Errorf("4xx: %v, want a task error", err)
	}
	if in := gotReq["inputs"].([]any)[0].(map[string]any); in["datatype"] != "FP32" {
		t.Errorf("native request was rewritten: %v", gotReq)
	}
}

func TestHTTPOIPRejectsANonInferenceResponse(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`"ok"`)) }))
	defer srv.Close()
	ex, _ := New(httpSpec(srv.URL, model.HTTPOIP), Options{})
	if _, err := ex.Run(context.Background(), Task{ID: "x", Payload: json.RawMessage(`1`)}); err == nil || IsTaskError(err) {
		t.Fatalf("Run: %v, want a model error", err)
	}
}

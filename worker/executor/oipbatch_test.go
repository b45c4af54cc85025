package executor

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mlsched/mlsched/worker/model"
)

// rowServer is an OIP v2 server of a model that labels each row of its
// [N, 2] input with the row's sum, and refuses a batch (400) holding a
// negative element, as a real server refuses bad input without saying
// which row. It records each request's row count.
func rowServer(t *testing.T) (*httptest.Server, func() []int64) {
	var mu sync.Mutex
	var calls []int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Inputs []struct {
				Shape []int64   `json:"shape"`
				Data  []float64 `json:"data"`
			} `json:"inputs"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.Inputs) != 1 {
			http.Error(w, `{"error":"bad request"}`, http.StatusBadRequest)
			return
		}
		in := req.Inputs[0]
		mu.Lock()
		calls = append(calls, in.Shape[0])
		mu.Unlock()
		labels := make([]float64, in.Shape[0])
		for i, v := range in.Data {
			if v < 0 {
				w.WriteHeader(http.StatusBadRequest)
				fmt.Fprint(w, `{"error":"negative pixel"}`)
				return
			}
			labels[i/2] += v
		}
		json.NewEncoder(w).Encode(map[string]any{"outputs": []map[string]any{
			{"name": "label", "shape": []int64{in.Shape[0]}, "datatype": "FP32", "data": labels},
			{"name": "echo", "shape": in.Shape, "datatype": "FP32", "data": in.Data}}})
	}))
	t.Cleanup(srv.Close)
	return srv, func() []int64 { mu.Lock(); defer mu.Unlock(); return append([]int64(nil), calls...) }
}

// A batch is one inference request of the tasks' rows stacked along the
// first dimension; each task gets its own rows of every output. A task
// whose payload does not map fails alone without being sent; a batch the
// server refuses as bad input is re-run task by task, so that only the bad
// task fails.
func TestHTTPOIPBatch(t *testing.T) {
	t.Parallel()
	srv, calls := rowServer(t)
	spec := httpSpec(srv.URL, model.HTTPOIP)
	spec.HTTP.Inputs = []model.TensorSpec{{Name: "x", Datatype: "FP32", Shape: []int64{1, 2}}}
	ex := newHTTPModel(t, spec, Options{})
	task := func(i int, payload string) Task {
		return Task{ID: fmt.Sprintf("t%d", i), Type: "t", Model: "remote", Attempt: 1, Payload: json.RawMessage(payload)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ts := []Task{task(0, `{"x":[1,2]}`), task(1, `{"x":[3,4]}`), task(2, `{"x":["a",1]}`), task(3, `{"x":[5,6]}`)}
	rs, err := RunBatch(ctx, ex, ts)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{`{"echo":[1,2],"label":3}`, `{"echo":[3,4],"label":7}`, "", `{"echo":[5,6],"label":11}`}
	for i, r := range rs {
		if i == 2 {
			if !IsTaskError(r.Err) || !strings.Contains(r.Err.Error(), "FP32 wants a number") {
				t.Errorf("t2: %v, want its own task error", r.Err)
			}
			continue
		}
		if r.Err != nil || string(r.Output) != want[i] {
			t.Errorf("t%d: %s %v, want %s", i, r.Output, r.Err, want[i])
		}
	}
	if c := calls(); len(c) != 1 || c[0] != 3 {
		t.Fatalf("calls of %v rows, want one call of 3", c)
	}

	// One bad input in a batch of 32: the server refuses the batch; the 31
	// others succeed, the bad one fails alone as a task error.
	ts = nil
	for i := range 32 {
		p := fmt.Sprintf(`{"x":[%d,1]}`, i)
		if i == 9 {
			p = `{"x":[-1,1]}`
		}
		ts = append(ts, task(i, p))
	}
	rs, err = RunBatch(ctx, ex, ts)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range rs {
		switch {
		case i == 9:
			if !IsTaskError(r.Err) || !strings.Contains(r.Err.Error(), "negative pixel") {
				t.Errorf("t9: %v, want its own task error", r.Err)
			}
		case r.Err != nil || !strings.Contains(string(r.Output), fmt.Sprintf(`"label":%d`, i+1)):
			t.Errorf("t%d: %s %v, want success with label %d", i, r.Output, r.Err, i+1)
		}
	}
	if c := calls(); len(c) != 1+1+32 {
		t.Errorf("%d calls, want the refused batch and then one per task", len(c)-1)
	}
}

// An output without the batch's rows in its first dimension makes the
// whole call a model error of each task.
func TestHTTPOIPBatchMalformedOutput(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"outputs":[{"name":"label","shape":[1],"datatype":"INT64","data":[7]}]}`)
	}))
	t.Cleanup(srv.Close)
	spec := httpSpec(srv.URL, model.HTTPOIP)
	spec.HTTP.Inputs = []model.TensorSpec{{Name: "x", Datatype: "FP32", Shape: []int64{1, 2}}}
	ex := newHTTPModel(t, spec, Options{})
	ts := []Task{{ID: "a", Payload: json.RawMessage(`{"x":[1,2]}`)}, {ID: "b", Payload: json.RawMessage(`{"x":[1,2]}`)}}
	rs, err := RunBatch(context.Background(), ex, ts)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if r.Err == nil || IsTaskError(r.Err) || !strings.Contains(r.Err.Error(), "no batch dimension of 2") {
			t.Errorf("%v, want a model error naming the missing batch dimension", r.Err)
		}
	}
}

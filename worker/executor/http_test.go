package executor

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mlsched/mlsched/worker/model"
)

func httpSpec(url, mode string) model.Spec {
	return model.Spec{Name: "remote", Types: []string{"t"}, Executor: model.ExecutorHTTP,
		HTTP: &model.HTTPSpec{URL: url, Mode: mode, Headers: map[string]string{"Authorization": "Bearer k"}}}
}

func newHTTPModel(t *testing.T, s model.Spec, o Options) *HTTP {
	t.Helper()
	ex, err := New(s, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ex.Close() })
	return ex.(*HTTP)
}

func runFor(ex Executor, payload string, d time.Duration) (json.RawMessage, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return ex.Run(ctx, Task{ID: "t1", Payload: json.RawMessage(payload)})
}

type errClass int

const (
	classOK errClass = iota
	classTask
	classModel
	classTimeout
)

func classOf(err error) errClass {
	switch {
	case err == nil:
		return classOK
	case errors.Is(err, context.DeadlineExceeded):
		return classTimeout
	case IsTaskError(err):
		return classTask
	}
	return classModel
}

func (c errClass) String() string {
	return [...]string{"success", "task error", "model error", "timeout"}[c]
}

// The error table of docs/models.md, one row per case, against a real HTTP
// server: 400/413/422 are task errors; 404, 408, 429, 5xx, a refused or
// reset connection, a redirect, an unparseable or oversized response are
// model errors; a server that hangs or drips its body is cut at the deadline.
func TestHTTPErrorTable(t *testing.T) {
	t.Parallel()
	status := func(code int) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			w.Write([]byte(`{"error":"status ` + http.StatusText(code) + `"}`))
		}
	}
	var redirected atomic.Bool
	rows := []struct {
		name    string
		handler http.HandlerFunc
		mode    string
		want    errClass
		msg     string // the error names this
		closed  bool   // nothing listens
	}{
		{name: "200 JSON", handler: func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`{"label":"cat"}`)) }, want: classOK},
		{name: "204 No Content", handler: func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) }, want: classOK},
		{name: "200 empty body", handler: func(w http.ResponseWriter, r *http.Request) {}, want: classModel, msg: "empty response"},
		{name: "400", handler: status(400), want: classTask, msg: "refused the input: 400 Bad Request"},
		{name: "413", handler: status(413), want: classTask, msg: "413 Request Entity Too Large"},
		{name: "422", handler: status(422), want: classTask, msg: "422 Unprocessable Entity"},
		{name: "404 model not loaded", handler: status(404), want: classModel, msg: "404 Not Found"},
		{name: "408", handler: status(408), want: classModel, msg: "408 Request Timeout"},
		{name: "429 without Retry-After", handler: status(429), want: classModel, msg: "429 Too Many Requests"},
		{name: "401", handler: status(401), want: classModel, msg: "401 Unauthorized"},
		{name: "500", handler: status(500), want: classModel, msg: "500 Internal Server Error"},
		{name: "502", handler: status(502), want: classModel, msg: "502 Bad Gateway"},
		{name: "503", handler: status(503), want: classModel, msg: "503 Service Unavailable"},
		{name: "504", handler: status(504), want: classModel, msg: "504 Gateway Timeout"},
		{name: "connection refused", closed: true, want: classModel, msg: "unreachable"},
		{name: "connection reset", handler: func(w http.ResponseWriter, r *http.Request) {
			c, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				panic(err)
			}
			c.(*net.TCPConn).SetLinger(0) // RST instead of FIN
			c.Close()
		}, want: classModel, msg: "unreachable"},
		{name: "hang", handler: func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body) // else the server does not notice the client leave
			<-r.Context().Done()
		}, want: classTimeout},
		{name: "endless body", handler: func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			chunk := []byte(strings.Repeat("[1,", 1024))
			for r.Context().Err() == nil {
				if _, err := w.Write(chunk); err != nil {
					return
				}
			}
		}, want: classModel, msg: "response exceeds 65536 bytes"},
		{name: "dripping body", handler: func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			for r.Context().Err() == nil {
				w.Write([]byte(" "))
				http.NewResponseController(w).Flush()
				time.Sleep(10 * time.Millisecond)
			}
		}, want: classTimeout},
		{name: "redirect", handler: func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/elsewhere" {
				redirected.Store(true)
				w.Write([]byte(`"followed"`))
				return
			}
			http.Redirect(w, r, "/elsewhere", http.StatusFound)
		}, want: classModel, msg: `redirected (302 Found) to "/elsewhere"`},
		{name: "unparseable response", handler: func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`{"label": "cat"`))
		}, want: classModel, msg: "unparseable response"},
		{name: "unparseable OIP response", mode: model.HTTPOIP, handler: func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte(`<html>oops</html>`))
		}, want: classModel, msg: "malformed inference response"},
		{name: "OIP 400", mode: model.HTTPOIP, handler: status(400), want: classTask, msg: "400 Bad Request"},
		{name: "OIP 404", mode: model.HTTPOIP, handler: status(404), want: classModel, msg: "404 Not Found"},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			t.Parallel()
			h := row.handler
			if h == nil {
				h = func(http.ResponseWriter, *http.Request) {}
			}
			srv := httptest.NewServer(h)
			defer srv.Close()
			if row.closed {
				srv.Close()
			}
			spec := httpSpec(srv.URL, row.mode)
			spec.HTTP.MaxResponseBytes = 64 << 10
			ex := newHTTPModel(t, spec, Options{})
			payload := `{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1]}]}`
			d := 5 * time.Second
			if row.want == classTimeout {
				d = 200 * time.Millisecond
			}
			out, err := runFor(ex, payload, d)
			if got := classOf(err); got != row.want {
				t.Fatalf("got %v (%v, output %s), want %v", got, err, out, row.want)
			}
			if row.msg != "" && !strings.Contains(err.Error(), row.msg) {
				t.Fatalf("error %q does not name %q", err, row.msg)
			}
			if row.want == classModel {
				var ce *CooldownError
				if errors.As(err, &ce) {
					t.Fatalf("cooldown without Retry-After: %v", err)
				}
			}
		})
	}
	if redirected.Load() {
		t.Error("a redirect was followed")
	}
}

// 429 with Retry-After is a model error and starts a cooldown of the model
// on this node: Ready fails and tasks fail at once without reaching the
// server, until the time has passed.
func TestHTTP429RetryAfterCoolsDown(t *testing.T) {
	t.Parallel()
	for _, ra := range []string{"2", "HTTP-date"} {
		t.Run(ra, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
			var calls atomic.Int64
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method == http.MethodGet { // readiness
					return
				}
				if calls.Add(1) == 1 {
					v := ra
					if ra == "HTTP-date" {
						v = clock().Add(2 * time.Second).Format(http.TimeFormat)
					}
					w.Header().Set("Retry-After", v)
					http.Error(w, "slow down", http.StatusTooManyRequests)
					return
				}
				w.Write([]byte(`"ok"`))
			}))
			defer srv.Close()
			spec := httpSpec(srv.URL, "")
			spec.HTTP.ReadyURL = srv.URL + "/ready"
			ex := newHTTPModel(t, spec, Options{Now: clock})
			_, err := runFor(ex, `1`, 5*time.Second)
			var ce *CooldownError
			if !errors.As(err, &ce) || IsTaskError(err) || ce.Wait != 2*time.Second || !strings.Contains(err.Error(), "429") {
				t.Fatalf("429 + Retry-After: %v, want a model error with a 2s cooldown", err)
			}
			if err := ex.Ready(context.Background()); err == nil || !strings.Contains(err.Error(), "cooling down") {
				t.Fatalf("Ready while cooling down: %v", err)
			}
			if _, err := runFor(ex, `1`, 5*time.Second); !errors.As(err, &ce) || IsTaskError(err) {
				t.Fatalf("task while cooling down: %v, want a model error", err)
			}
			if n := calls.Load(); n != 1 {
				t.Fatalf("%d requests reached the server during the cooldown", n)
			}
			mu.Lock()
			now = now.Add(2 * time.Second)
			mu.Unlock()
			if err := ex.Ready(context.Background()); err != nil {
				t.Fatalf("Ready after the cooldown: %v", err)
			}
			if out, err := runFor(ex, `1`, 5*time.Second); err != nil || string(out) != `"ok"` {
				t.Fatalf("after the cooldown: %s %v", out, err)
			}
		})
	}
}

func TestRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Duration{
		"": 0, "0": 0, "-3": 0, "junk": 0, "1.5": 1500 * time.Millisecond, "3600": MaxCooldown,
		now.Add(5 * time.Second).Format(http.TimeFormat):  5 * time.Second,
		now.Add(-5 * time.Second).Format(http.TimeFormat): 0,
	} {
		if got := retryAfter(in, now); got != want {
			t.Errorf("retryAfter(%q) = %v, want %v", in, got, want)
		}
	}
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
		default:
			http.Error(w, "unexpected body "+string(body), http.StatusBadRequest)
		}
	}))
	defer srv.Close()
	ex := newHTTPModel(t, httpSpec(srv.URL, ""), Options{})
	if out, err := runFor(ex, `{"q":"json"}`, 5*time.Second); err != nil || string(out) != `{"label":"cat"}` {
		t.Errorf("json: %s %v", out, err)
	}
	if out, err := runFor(ex, `"text"`, 5*time.Second); err != nil || string(out) != `"a cat"` {
		t.Errorf("text: %s %v", out, err)
	}
	if err := ex.Ready(context.Background()); err != nil {
		t.Errorf("a passthrough model without ready_url is ready: %v", err)
	}
}

// oipServer is a small OIP v2 server: a model "digits" (version 3) whose
// output depends on the request, with readiness switches.
type oipServer struct {
	*httptest.Server
	healthy, modelReady atomic.Bool
	mu                  sync.Mutex
	lastPath            string
	lastReq             map[string]any
	respond             func(req map[string]any) string
}

func newOIPServer(t *testing.T) *oipServer {
	s := &oipServer{}
	s.healthy.Store(true)
	s.modelReady.Store(true)
	s.respond = func(map[string]any) string {
		return `{"model_name":"digits","model_version":"3","outputs":[` +
			`{"name":"label","shape":[1],"datatype":"INT64","data":[7]},` +
			`{"name":"probabilities","shape":[1,2,2],"datatype":"FP32","data":[0.1,0.2,0.3,0.4]}]}`
	}
	ready := func(b *atomic.Bool) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if !b.Load() {
				w.WriteHeader(http.StatusServiceUnavailable)
			}
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v2/health/ready", ready(&s.healthy))
	mux.HandleFunc("GET /v2/models/digits/versions/3/ready", ready(&s.modelReady))
	mux.HandleFunc("POST /v2/models/{name}/versions/{v}/infer", s.infer)
	mux.HandleFunc("POST /v2/models/{name}/infer", s.infer)
	s.Server = httptest.NewServer(mux)
	t.Cleanup(s.Close)
	return s
}

func (s *oipServer) infer(w http.ResponseWriter, r *http.Request) {
	var req map[string]any
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		w.WriteHeader(http.StatusBadRequest)
		w.Write([]byte(`{"error":"not json"}`))
		return
	}
	s.mu.Lock()
	s.lastPath, s.lastReq = r.URL.Path, req
	respond := s.respond
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.Write([]byte(respond(req)))
}

func (s *oipServer) last() (string, map[string]any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastPath, s.lastReq
}

func oipSpec(url string) model.Spec {
	s := httpSpec(url, model.HTTPOIP)
	s.HTTP.Model, s.HTTP.Version = "digits", "3"
	s.HTTP.Inputs = []model.TensorSpec{
		{Name: "pixels", Datatype: "FP32", Shape: []int64{1, -1}, Field: "image"},
		{Name: "scale", Datatype: "INT32", Shape: []int64{1}},
	}
	return s
}

// The models file's input mapping turns a plain payload into named tensors,
// the versioned endpoint is used, and outputs are decoded into the result.
func TestHTTPOIPInputMappingAndOutputs(t *testing.T) {
	t.Parallel()
	srv := newOIPServer(t)
	ex := newHTTPModel(t, oipSpec(srv.URL+"/"), Options{})
	out, err := runFor(ex, `{"image":[[0,1.5],[16,3]],"scale":2}`, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != `{"label":7,"probabilities":[[0.1,0.2],[0.3,0.4]]}` {
		t.Errorf("decoded output %s", out)
	}
	path, req := srv.last()
	if path != "/v2/models/digits/versions/3/infer" {
		t.Errorf("path %q", path)
	}
	b, _ := json.Marshal(req)
	want := `{"id":"t1","inputs":[{"data":[0,1.5,16,3],"datatype":"FP32","name":"pixels","shape":[1,4]},` +
		`{"data":[2],"datatype":"INT32","name":"scale","shape":[1]}]}`
	if string(b) != want {
		t.Errorf("request\n got %s\nwant %s", b, want)
	}

	// A payload that already is an inference request goes as is.
	native := `{"inputs":[{"name":"x","shape":[2],"datatype":"BYTES","data":["a","b"]}]}`
	if _, err := runFor(ex, native, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, req := srv.last(); req["inputs"].([]any)[0].(map[string]any)["name"] != "x" {
		t.Errorf("native request was rewritten: %v", req)
	}

	// Payloads that do not fit the mapping are task errors naming why.
	for payload, msg := range map[string]string{
		`{"scale":2}`:                         `no field "image" (input tensor "pixels")`,
		`{"image":[1,"x"],"scale":2}`:         `element 1: FP32 wants a number, got a string`,
		`{"image":[1,2],"scale":2.5}`:         `INT32 wants an integer`,
		`{"image":[1,2],"scale":[1,2]}`:       `2 elements, shape [1] wants 1`,
		`{"image":[],"scale":1}`:              `0 elements do not fit shape [1 -1]`,
		`{"image":[1],"scale":3000000000}`:    `out of range`,
		`[1,2,3]`:                             `want an object with the fields image, scale`,
		`{"inputs":[{"name":"x","data":[]}]}`: `inputs[0] has no "shape"`,
	} {
		_, err := runFor(ex, payload, 5*time.Second)
		if !IsTaskError(err) || !strings.Contains(err.Error(), msg) {
			t.Errorf("payload %s: %v, want a task error naming %q", payload, err, msg)
		}
	}
}

// One input: a JSON array payload is its data; without a mapping a payload
// that is not an inference request is a task error.
func TestHTTPOIPSingleInputAndNoMapping(t *testing.T) {
	t.Parallel()
	srv := newOIPServer(t)
	spec := httpSpec(srv.URL, model.HTTPOIP)
	spec.HTTP.Model = "digits"
	spec.HTTP.Inputs = []model.TensorSpec{{Name: "pixels", Datatype: "UINT8", Shape: []int64{-1, 2}}}
	ex := newHTTPModel(t, spec, Options{})
	if _, err := runFor(ex, `[1,2,3,4]`, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	path, req := srv.last()
	if in := req["inputs"].([]any)[0].(map[string]any); path != "/v2/models/digits/infer" || in["shape"].([]any)[0] != 2.0 {
		t.Errorf("path %s request %v", path, req)
	}
	if _, err := runFor(ex, `[1,256]`, 5*time.Second); !IsTaskError(err) || !strings.Contains(err.Error(), "UINT8: 256 is out of range") {
		t.Errorf("UINT8 256: %v", err)
	}

	spec.HTTP.Inputs = nil
	bare := newHTTPModel(t, spec, Options{})
	if _, err := runFor(bare, `{"pixels":[1]}`, 5*time.Second); !IsTaskError(err) || !strings.Contains(err.Error(), "maps no input tensors") {
		t.Errorf("no mapping: %v", err)
	}
}

// A malformed inference response is a model error whose message says what
// is wrong.
func TestHTTPOIPMalformedResponses(t *testing.T) {
	t.Parallel()
	srv := newOIPServer(t)
	ex := newHTTPModel(t, oipSpec(srv.URL), Options{})
	for body, msg := range map[string]string{
		`not json`:           "not an inference response",
		`{"model_name":"m"}`: `no "outputs"`,
		`{"outputs":[]}`:     `"outputs" is empty`,
		`{"outputs":[{"shape":[1],"datatype":"FP32","data":[1]}]}`:                              "outputs[0] has no name",
		`{"outputs":[{"name":"a","shape":[1,3],"datatype":"FP32","data":[1,2]}]}`:               "outputs[0] (a): 2 elements, shape [1 3] wants 3",
		`{"outputs":[{"name":"a","shape":[1],"datatype":"FLOAT","data":[1]}]}`:                  `unknown datatype "FLOAT"`,
		`{"outputs":[{"name":"a","shape":[1],"datatype":"FP32"}]}`:                              "outputs[0] (a) has no data",
		`{"outputs":[{"name":"a","shape":[-1],"datatype":"FP32","data":[1]}]}`:                  "negative dimension",
		`{"outputs":[{"name":"a","shape":[1],"data":[1]},{"name":"a","shape":[1],"data":[1]}]}`: `duplicate name "a"`,
	} {
		srv.mu.Lock()
		srv.respond = func(map[string]any) string { return body }
		srv.mu.Unlock()
		_, err := runFor(ex, `{"image":[1],"scale":1}`, 5*time.Second)
		if err == nil || IsTaskError(err) || !strings.Contains(err.Error(), "malformed inference response: ") || !strings.Contains(err.Error(), msg) {
			t.Errorf("response %s: %v, want a model error naming %q", body, err, msg)
		}
	}
}

// Ready needs both /v2/health/ready and the model's versioned ready
// endpoint to answer 200.
func TestHTTPOIPReadiness(t *testing.T) {
	t.Parallel()
	srv := newOIPServer(t)
	ex := newHTTPModel(t, oipSpec(srv.URL), Options{})
	ctx := context.Background()
	if err := ex.Ready(ctx); err != nil {
		t.Fatalf("ready server: %v", err)
	}
	srv.modelReady.Store(false)
	if err := ex.Ready(ctx); err == nil || !strings.Contains(err.Error(), "/v2/models/digits/versions/3/ready: 503") {
		t.Fatalf("model unready: %v", err)
	}
	srv.modelReady.Store(true)
	srv.healthy.Store(false)
	if err := ex.Ready(ctx); err == nil || !strings.Contains(err.Error(), "/v2/health/ready: 503") {
		t.Fatalf("server unready: %v", err)
	}
	srv.healthy.Store(true)
	if err := ex.Ready(ctx); err != nil {
		t.Fatalf("ready again: %v", err)
	}
	srv.Close()
	if err := ex.Ready(ctx); err == nil {
		t.Fatal("a stopped server is ready")
	}
}

// With the node's concurrency in flight, wave after wave, the executor
// reuses its connections instead of opening new ones (the default transport
// keeps only 2 idle connections per host).
func TestHTTPConnectionPoolSizedToConcurrency(t *testing.T) {
	t.Parallel()
	const concurrency = 8
	var conns atomic.Int64
	var release atomic.Pointer[chan struct{}]
	var arrived sync.WaitGroup
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rel := *release.Load()
		arrived.Done()
		<-rel
		w.Write([]byte(`1`))
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	ex := newHTTPModel(t, httpSpec(srv.URL, ""), Options{Concurrency: concurrency})
	for wave := range 3 {
		arrived.Add(concurrency)
		rel := make(chan struct{})
		release.Store(&rel)
		var wg sync.WaitGroup
		for range concurrency {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := runFor(ex, `1`, 10*time.Second); err != nil {
					t.Errorf("wave %d: %v", wave, err)
				}
			}()
		}
		arrived.Wait() // all in flight at once
		close(rel)
		wg.Wait()
	}
	if n := conns.Load(); n > concurrency {
		t.Fatalf("%d connections opened for 3 waves of %d concurrent tasks, want at most %d", n, concurrency, concurrency)
	}
	// A model with a lower max_concurrency keeps that many.
	limited := httpSpec(srv.URL, "")
	limited.MaxConcurrency = new(int)
	*limited.MaxConcurrency = 2
	if tr := newHTTPModel(t, limited, Options{Concurrency: concurrency}).client.Transport.(*http.Transport); tr.MaxIdleConnsPerHost != 3 {
		t.Fatalf("max_concurrency 2: %d idle connections kept, want 3", tr.MaxIdleConnsPerHost)
	}
}

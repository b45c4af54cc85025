package executor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/mlsched/mlsched/worker/model"
)

// MaxCooldown caps the cooldown a model server's Retry-After asks for: a
// cooldown takes the model off this node's heartbeat, and a long one would
// hide the node from every dispatcher for that long.
const MaxCooldown = 30 * time.Second

// ErrModelServer is wrapped by every model error of an http model that comes
// from the server's answer (a status, a body that cannot be used) rather
// than from the connection.
var ErrModelServer = errors.New("model server")

// StatusError is a model server's answer with a status that is not a
// success. Statuses 400, 413 and 422 are task errors (IsTaskError reports
// true): the server refused the input. Every other status is a model error.
type StatusError struct {
	Code int
	// Status is the status line's text, e.g. "503 Service Unavailable".
	Status string
	// Body is the start of the response body, or the redirect's Location.
	Body string
}

func (e *StatusError) Error() string {
	switch {
	case e.Code >= 300 && e.Code < 400:
		return fmt.Sprintf("model server redirected (%s) to %q: redirects are not followed", e.Status, e.Body)
	case isTaskStatus(e.Code):
		return fmt.Sprintf("model server refused the input: %s: %s", e.Status, e.Body)
	}
	return fmt.Sprintf("model server: %s: %s", e.Status, e.Body)
}

// Is makes errors.Is(err, ErrTaskError) hold for 400, 413 and 422, and
// errors.Is(err, ErrModelServer) for the rest.
func (e *StatusError) Is(target error) bool {
	if isTaskStatus(e.Code) {
		return target == ErrTaskError
	}
	return target == ErrModelServer
}

// isTaskStatus: the statuses that say the input is bad. 404 is not one: an
// inference server answers it for a model it has not loaded.
func isTaskStatus(code int) bool {
	return code == http.StatusBadRequest || code == http.StatusRequestEntityTooLarge || code == http.StatusUnprocessableEntity
}

// CooldownError is a model error after which this model should get no tasks
// on this node for Wait: the server answered 429 (or 503) with Retry-After.
// The node withdraws the model from its heartbeat meanwhile.
type CooldownError struct {
	Wait time.Duration
	Err  error
}

func (e *CooldownError) Error() string {
	return fmt.Sprintf("%v (cooling down for %v)", e.Err, e.Wait.Round(time.Millisecond))
}

// Unwrap returns the cause.
func (e *CooldownError) Unwrap() error { return e.Err }

// HTTP posts each task to a model server, in passthrough or OIP v2 mode
// (docs/models.md), and classifies the answer: see StatusError.
type HTTP struct {
	name, mode string
	url        string   // where tasks are posted
	readyURLs  []string // GET, each must answer 2xx for the model to be ready
	inputs     []model.TensorSpec
	headers    map[string]string
	maxResp    int64
	client     *http.Client
	now        func() time.Time
	coolUntil  atomic.Int64 // Unix ns; 0 when not cooling down
}

func newHTTP(s model.Spec, o Options) *HTTP {
	h := &HTTP{name: s.Name, url: strings.TrimRight(s.HTTP.URL, "/"), mode: s.HTTP.Mode, inputs: s.HTTP.Inputs,
		headers: s.HTTP.Headers, maxResp: s.HTTP.MaxResponseBytes, now: o.Now}
	if h.mode == "" {
		h.mode = model.HTTPPassthrough
	}
	if h.maxResp <= 0 {
		h.maxResp = model.DefaultMaxResponseBytes
	}
	if h.now == nil {
		h.now = time.Now
	}
	if h.mode == model.HTTPOIP {
		m := s.HTTP.Model
		if m == "" {
			m = s.Name
		}
		base := h.url
		path := "/v2/models/" + url.PathEscape(m)
		if s.HTTP.Version != "" {
			path += "/versions/" + url.PathEscape(s.HTTP.Version)
		}
		h.url = base + path + "/infer"
		h.readyURLs = []string{base + "/v2/health/ready", base + path + "/ready"}
	} else if s.HTTP.ReadyURL != "" {
		h.readyURLs = []string{s.HTTP.ReadyURL}
	}
	// One idle connection per task slot the model can use (the node's, or
	// its max_concurrency when lower) plus the readiness probe, so a busy
	// node reuses its connections instead of opening new ones.
	slots := max(o.Concurrency, 1)
	if l := s.Limit(); l > 0 && l < slots {
		slots = l
	}
	conns := slots + 1
	tr := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          conns,
		MaxIdleConnsPerHost:   conns,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
	h.client = &http.Client{Transport: tr,
		// A redirect is answered as an error: following it would send the
		// task somewhere the models file does not name.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return h
}

// Run posts the task and classifies the answer.
func (h *HTTP) Run(ctx context.Context, t Task) (json.RawMessage, error) {
	if wait := h.cooling(); wait > 0 {
		return nil, &CooldownError{Wait: wait, Err: fmt.Errorf("%w: not sent: the server asked for no requests until then", ErrModelServer)}
	}
	body := []byte(t.Payload)
	if h.mode == model.HTTPOIP {
		var err error
		if body, err = oipRequest(t, h.inputs); err != nil {
			return nil, err
		}
	}
	resp, data, err := h.post(ctx, body, t.ID, t.Traceparent)
	if err != nil {
		return nil, err
	}
	if h.mode == model.HTTPOIP {
		out, err := decodeOIPResponse(data)
		if err != nil {
			return nil, fmt.Errorf("%w: malformed inference response: %v: %s", ErrModelServer, err, snippet(data))
		}
		return out, nil
	}
	return passthroughOutput(resp, data)
}

// post sends one request and returns the response and its body once the
// answer is a success; otherwise the classified error (StatusError,
// CooldownError, unreachable, ctx's).
func (h *HTTP) post(ctx context.Context, body []byte, taskID, traceparent string) (*http.Response, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url, bytes.NewReader(body))
	if err != nil {
		return nil, nil, fmt.Errorf("model server request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	req.Header.Set("Mlsched-Task-Id", taskID)
	if traceparent != "" {
		req.Header["Traceparent"] = []string{traceparent}
	}
	for k, v := range h.headers {
		req.Header.Set(k, v)
	}
	resp, err := h.client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
		return nil, nil, fmt.Errorf("model server unreachable: %w", err)
	}
	defer resp.Body.Close()
	data, err := h.readBody(ctx, resp)
	if err != nil {
		return nil, nil, err
	}
	if err := h.classify(resp, data); err != nil {
		return nil, nil, err
	}
	return resp, data, nil
}

// readBody reads at most maxResp bytes; a longer body is a model error.
func (h *HTTP) readBody(ctx context.Context, resp *http.Response) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(resp.Body, h.maxResp+1))
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("%w: reading the response: %v", ErrModelServer, err)
	}
	if int64(len(data)) > h.maxResp {
		return nil, fmt.Errorf("%w: response exceeds %d bytes (http.max_response_bytes): cut off", ErrModelServer, h.maxResp)
	}
	return data, nil
}

// classify turns a status that is not a success into an error.
func (h *HTTP) classify(resp *http.Response, data []byte) error {
	code := resp.StatusCode
	if code >= 200 && code < 300 {
		return nil
	}
	se := &StatusError{Code: code, Status: resp.Status, Body: snippet(data)}
	if code >= 300 && code < 400 {
		se.Body = resp.Header.Get("Location")
	}
	if code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable {
		if wait := retryAfter(resp.Header.Get("Retry-After"), h.now()); wait > 0 {
			h.coolUntil.Store(h.now().Add(wait).UnixNano())
			return &CooldownError{Wait: wait, Err: se}
		}
	}
	return se
}

func (h *HTTP) cooling() time.Duration {
	until := h.coolUntil.Load()
	if until == 0 {
		return 0
	}
	return time.Duration(until - h.now().UnixNano())
}

// retryAfter parses a Retry-After value (seconds or an HTTP date), capped at
// MaxCooldown; 0 when absent or unusable.
func retryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	var d time.Duration
	if n, err := strconv.ParseFloat(v, 64); err == nil {
		if n <= 0 || n != n {
			return 0
		}
		d = time.Duration(min(n, MaxCooldown.Seconds()) * float64(time.Second))
	} else if t, err := http.ParseTime(v); err == nil {
		d = t.Sub(now)
	}
	return min(max(d, 0), MaxCooldown)
}

// passthroughOutput is the body as the result's output: JSON as is, text as
// a JSON string, 204 No Content as null; anything else cannot be used and is
// a model error.
func passthroughOutput(resp *http.Response, data []byte) (json.RawMessage, error) {
	if resp.StatusCode == http.StatusNoContent {
		return json.RawMessage("null"), nil
	}
	if json.Valid(data) {
		return append(json.RawMessage(nil), data...), nil
	}
	ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if strings.HasPrefix(ct, "text/") && ct != "text/json" {
		return rawOrString(data), nil
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, fmt.Errorf("%w: empty response (%s)", ErrModelServer, resp.Status)
	}
	return nil, fmt.Errorf("%w: unparseable response (Content-Type %q, not JSON): %s", ErrModelServer,
		resp.Header.Get("Content-Type"), snippet(data))
}

// Ready reports whether the model can take tasks: not cooling down, and its
// readiness endpoints (OIP: /v2/health/ready and the model's ready; else
// http.ready_url when set) answer 2xx.
func (h *HTTP) Ready(ctx context.Context) error {
	if wait := h.cooling(); wait > 0 {
		return fmt.Errorf("cooling down for %v after the server's Retry-After", wait.Round(time.Millisecond))
	}
	for _, u := range h.readyURLs {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return err
		}
		for k, v := range h.headers {
			req.Header.Set(k, v)
		}
		resp, err := h.client.Do(req)
		if err != nil {
			return fmt.Errorf("GET %s: %w", u, err)
		}
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		resp.Body.Close()
		if resp.StatusCode < 200 || resp.StatusCode >= 300 {
			return fmt.Errorf("GET %s: %s: %s", u, resp.Status, snippet(data))
		}
	}
	return nil
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

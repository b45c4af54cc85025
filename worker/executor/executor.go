// Package executor runs one task on one model. A worker node builds one
// Executor per hosted model from its model.Spec: an in-process Go handler,
// a long-lived subprocess, an HTTP model server, or a simulated model.
//
// Executors report bad input by returning an error that wraps ErrTaskError
// (or a *TaskError); any other error counts against the model. Timeouts are
// the caller's context: an executor returns ctx.Err() when it gives up.
// docs/models.md has the error table of each executor.
package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/worker/digits"
	"github.com/mlsched/mlsched/worker/model"
)

// Task is what an executor receives.
type Task struct {
	ID      string
	Type    string
	Model   string
	Attempt int
	Payload json.RawMessage
	// Size is the task's size, when it declares one (protocol.Task.Size:
	// tokens, pixels); a sim model's latency may grow with it.
	Size float64
	// Traceparent is the W3C trace context of the attempt ("" when the task
	// has none); the http executor sends it to the model server.
	Traceparent string
}

// Handler is an in-process model. It returns any JSON-marshalable value, a
// json.RawMessage, or []byte (used as is when it is JSON, else as a string).
// Return an error wrapping ErrTaskError for bad input; honour ctx.
type Handler func(ctx context.Context, t Task) (output any, err error)

// Executor runs tasks on one model. Safe for concurrent use.
type Executor interface {
	// Run returns the model's output as JSON.
	Run(ctx context.Context, t Task) (json.RawMessage, error)
	// Close releases the executor's resources (e.g. stops a subprocess).
	Close() error
}

// Readier is implemented by executors whose model may be unable to take
// tasks for a while: loading, restarting, its server unready, or cooling
// down after a 429. A node announces such a model in its heartbeat only
// while Ready returns nil.
type Readier interface {
	// Ready reports whether the model can take tasks now; the error says
	// why not. It may do I/O bounded by ctx.
	Ready(ctx context.Context) error
}

// ErrNotReady is wrapped by the error of a task given to a model that is
// not ready (loading, restarting, unready, cooling down): a model error, so
// the task is retried elsewhere at once.
var ErrNotReady = errors.New("model not ready")

// ErrTaskError marks an error caused by the task's input: it never counts
// against the model and is never retried.
var ErrTaskError = errors.New("task error")

// TaskError is a task (bad input) error with a message for the result.
type TaskError struct {
	Msg string
	Err error // optional cause
}

func (e *TaskError) Error() string {
	if e.Err != nil {
		return e.Msg + ": " + e.Err.Error()
	}
	return e.Msg
}

// Unwrap returns the cause.
func (e *TaskError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrTaskError) hold.
func (e *TaskError) Is(target error) bool { return target == ErrTaskError }

// IsTaskError reports whether err is a task (bad input) error.
func IsTaskError(err error) bool {
	var te *TaskError
	return errors.Is(err, ErrTaskError) || errors.As(err, &te)
}

// Options are what executors may need from the node.
type Options struct {
	// Handlers are the registered Go handlers by name.
	Handlers map[string]Handler
	// BatchHandlers are the batch variants of Go handlers, by the same
	// names: a batching go model whose handler has one runs its batches on
	// it (without one, each task of a batch runs on the handler).
	BatchHandlers map[string]BatchHandler
	// Seed seeds sim executors; 0 means a time-based seed.
	Seed int64
	// Log receives executor diagnostics (e.g. a subprocess's stderr).
	Log zerolog.Logger
	// Now is the clock of sim schedules and http cooldowns (default time.Now).
	Now func() time.Time
	// Concurrency is how many tasks the node runs at once; an http model
	// keeps that many idle connections (default 1).
	Concurrency int
	// ReadinessChanged, when set, is called when a Readier's readiness may
	// have changed on its own (an exec process turned ready or exited), so
	// the node can re-check and announce it at once.
	ReadinessChanged func()
}

// New builds the executor of a validated spec.
func New(s model.Spec, o Options) (Executor, error) {
	if o.Now == nil {
		o.Now = time.Now
	}
	switch s.Executor {
	case model.ExecutorGo:
		h, ok := o.Handlers[s.Go.Handler]
		if !ok {
			return nil, fmt.Errorf("model %q: go.handler: %q is not registered", s.Name, s.Go.Handler)
		}
		if s.Go.Handler == "digits" {
			go func() { _, _ = digits.Default() }() // train now, not on the first task
		}
		return goExecutor{h: h, bh: o.BatchHandlers[s.Go.Handler]}, nil
	case model.ExecutorExec:
		return newExec(s, o.Log, o.ReadinessChanged), nil
	case model.ExecutorHTTP:
		return newHTTP(s, o), nil
	case model.ExecutorSim:
		var sim model.SimSpec
		if s.Sim != nil {
			sim = *s.Sim
		}
		return NewSim(s.Name, sim, o.Seed, o.Now), nil
	default:
		return nil, fmt.Errorf("model %q: executor: unknown %q", s.Name, s.Executor)
	}
}

// BatchBuiltins are the batch variants of the built-in handlers.
func BatchBuiltins() map[string]BatchHandler {
	out := map[string]BatchHandler{}
	for name, h := range Builtins() {
		out[name] = BatchOf(h)
	}
	return out
}

// Builtins are the Go handlers every worker has: echo returns the payload,
// noop returns null at once, digits classifies an 8x8 handwritten digit
// (see DigitsHandler).
func Builtins() map[string]Handler {
	return map[string]Handler{
		"digits": DigitsHandler,
		"echo": func(_ context.Context, t Task) (any, error) {
			if len(t.Payload) == 0 {
				return nil, nil
			}
			return t.Payload, nil
		},
		"noop": func(context.Context, Task) (any, error) { return nil, nil },
	}
}

// EncodeOutput turns a handler's return value into JSON: RawMessage and
// []byte are used as is when valid JSON and encoded as a JSON string
// otherwise; other values are marshalled.
func EncodeOutput(v any) (json.RawMessage, error) {
	switch o := v.(type) {
	case nil:
		return json.RawMessage("null"), nil
	case json.RawMessage:
		return rawOrString(o), nil
	case []byte:
		return rawOrString(o), nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("output is not JSON-encodable: %w", err)
	}
	return b, nil
}

func rawOrString(b []byte) json.RawMessage {
	if len(b) == 0 {
		return json.RawMessage(`""`)
	}
	if json.Valid(b) {
		return append(json.RawMessage(nil), b...)
	}
	s, _ := json.Marshal(string(b)) // invalid UTF-8 becomes U+FFFD
	return s
}

type goExecutor struct {
	h  Handler
	bh BatchHandler // nil: none registered
}

func (g goExecutor) Run(ctx context.Context, t Task) (json.RawMessage, error) {
	out, err := g.h(ctx, t)
	if err != nil {
		return nil, err
	}
	return EncodeOutput(out)
}

func (goExecutor) Close() error { return nil }

// DigitsHandler is the built-in "digits" model: a softmax regression in Go
// trained at first use on the embedded digits dataset (package digits). The
// payload is {"pixels": [64 numbers 0..16]} or the 64 numbers; the output is
// {"label": n, "probabilities": [10 numbers]}, as the Python digits models'.
func DigitsHandler(ctx context.Context, t Task) (any, error) {
	var px []float64
	var obj struct {
		Pixels []float64 `json:"pixels"`
	}
	if err := json.Unmarshal(t.Payload, &px); err != nil {
		if err := json.Unmarshal(t.Payload, &obj); err != nil || obj.Pixels == nil {
			return nil, &TaskError{Msg: `digits: want {"pixels": [64 numbers 0..16]} or the 64 numbers`}
		}
		px = obj.Pixels
	}
	if len(px) != digits.Pixels {
		return nil, &TaskError{Msg: fmt.Sprintf("digits: want %d pixel values (an 8x8 image), got %d", digits.Pixels, len(px))}
	}
	var img [digits.Pixels]float64
	for i, v := range px {
		if v < 0 || v > 16 {
			return nil, &TaskError{Msg: fmt.Sprintf("digits: pixel %d is %g, outside 0..16", i, v)}
		}
		img[i] = v
	}
	m, err := digits.Default()
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	label, p := m.Predict(img)
	probs := make([]float64, len(p))
	for i, v := range p {
		probs[i] = math.Round(v*1e6) / 1e6
	}
	return map[string]any{"label": label, "probabilities": probs}, nil
}

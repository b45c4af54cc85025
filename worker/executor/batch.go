package executor

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime/debug"
	"sync"
)

// Dynamic batching (docs/models.md, "Batching"): a worker node that gathers
// the tasks waiting for one model runs them in one call. Each task keeps
// its own outcome: an executor that can tell which input was bad reports
// a Result per task, and an error for the whole call only when the call
// itself failed (a model error for every task in it).

// Result is one task's answer in a batch: its output, or why it failed
// (an error wrapping ErrTaskError for its own bad input).
type Result struct {
	Output json.RawMessage
	Err    error
}

// BatchHandler is an in-process model run on many tasks in one call. It
// returns one Result per task, in the tasks' order; an error fails the
// whole call (every task a model error, unless it wraps ErrTaskError).
type BatchHandler func(ctx context.Context, ts []Task) ([]Result, error)

// Batcher is implemented by executors that run many tasks in one call
// (go with a batch handler, exec whose process declares batches, OIP v2,
// sim). RunBatch returns one Result per task, in order.
type Batcher interface {
	RunBatch(ctx context.Context, ts []Task) ([]Result, error)
}

// RunBatch runs ts on ex in one call when ex is a Batcher, else each task
// on its own call, at once: a batching model whose executor cannot batch
// (a passthrough http server, an exec process that does not declare
// batches) still gets every task run, only without the saving. A panic
// or a malformed answer (not one result per task) fails the whole call
// as a model error.
func RunBatch(ctx context.Context, ex Executor, ts []Task) (rs []Result, err error) {
	defer func() {
		if p := recover(); p != nil {
			rs, err = nil, fmt.Errorf("model panicked: %v\n%s", p, debug.Stack())
		}
	}()
	if b, ok := ex.(Batcher); ok {
		rs, err := b.RunBatch(ctx, ts)
		if err == nil && len(rs) != len(ts) {
			return nil, fmt.Errorf("batch of %d tasks answered with %d results", len(ts), len(rs))
		}
		return rs, err
	}
	return runEach(ctx, ts, ex.Run), nil
}

// runEach runs every task on its own call, concurrently.
func runEach(ctx context.Context, ts []Task, run func(context.Context, Task) (json.RawMessage, error)) []Result {
	rs := make([]Result, len(ts))
	if len(ts) == 1 {
		rs[0].Output, rs[0].Err = run(ctx, ts[0])
		return rs
	}
	var wg sync.WaitGroup
	for i := range ts {
		wg.Go(func() {
			defer func() {
				if p := recover(); p != nil {
					rs[i].Err = fmt.Errorf("model panicked: %v", p)
				}
			}()
			rs[i].Output, rs[i].Err = run(ctx, ts[i])
		})
	}
	wg.Wait()
	return rs
}

// BatchOf is a BatchHandler that runs h on each task in turn, in one call:
// a handler whose work has no fixed cost per call to share.
func BatchOf(h Handler) BatchHandler {
	return func(ctx context.Context, ts []Task) ([]Result, error) {
		rs := make([]Result, len(ts))
		for i, t := range ts {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			out, err := h(ctx, t)
			if err == nil {
				rs[i].Output, err = EncodeOutput(out)
			}
			rs[i].Err = err
		}
		return rs, nil
	}
}

// RunBatch runs the batch handler when the model has one, else the
// handler on each task.
func (g goExecutor) RunBatch(ctx context.Context, ts []Task) ([]Result, error) {
	if g.bh == nil {
		return runEach(ctx, ts, g.Run), nil
	}
	rs, err := g.bh(ctx, ts)
	if err != nil {
		return nil, err
	}
	for i := range rs {
		if rs[i].Err == nil && rs[i].Output == nil {
			rs[i].Output = json.RawMessage("null")
		}
	}
	return rs, nil
}

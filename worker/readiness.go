package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/worker/executor"
)

// readyProbeTimeout bounds one readiness check of a model.
const readyProbeTimeout = 2 * time.Second

// gate is the readiness of a model whose executor can be unready (an
// executor.Readier). The node announces the model only while it is ready;
// a task given to it meanwhile (dispatched before the withdrawal reached the
// dispatchers) fails at once as a model error, to be retried elsewhere.
type gate struct {
	executor.Executor
	readier executor.Readier
	ready   atomic.Bool
	why     atomic.Pointer[string]
	// checked: the first check is done (an unready model is logged then,
	// not only when it later changes).
	checked atomic.Bool
	// changed is called when a task's error says readiness has changed (a
	// 429 cooldown, a crashed process), to check and announce it at once.
	changed func()
}

func newGate(ex executor.Executor, changed func()) executor.Executor {
	r, ok := ex.(executor.Readier)
	if !ok {
		return ex
	}
	g := &gate{Executor: ex, readier: r, changed: changed}
	why := "not checked yet"
	g.why.Store(&why)
	return g
}

func (g *gate) Run(ctx context.Context, t executor.Task) (json.RawMessage, error) {
	if !g.ready.Load() {
		return nil, fmt.Errorf("%w: %s", executor.ErrNotReady, *g.why.Load())
	}
	out, err := g.Executor.Run(ctx, t)
	var ce *executor.CooldownError
	if errors.As(err, &ce) || errors.Is(err, executor.ErrProcessExited) || errors.Is(err, executor.ErrNotReady) {
		g.changed()
	}
	return out, err
}

// RunBatch is Run for a batch: refused at once while unready, and a
// failure that says readiness changed (for the whole call or any task)
// checks it at once.
func (g *gate) RunBatch(ctx context.Context, ts []executor.Task) ([]executor.Result, error) {
	if !g.ready.Load() {
		return nil, fmt.Errorf("%w: %s", executor.ErrNotReady, *g.why.Load())
	}
	rs, err := executor.RunBatch(ctx, g.Executor, ts)
	signal := func(err error) bool {
		var ce *executor.CooldownError
		return errors.As(err, &ce) || errors.Is(err, executor.ErrProcessExited) || errors.Is(err, executor.ErrNotReady)
	}
	changed := signal(err)
	for _, r := range rs {
		changed = changed || signal(r.Err)
	}
	if changed {
		g.changed()
	}
	return rs, err
}

// check probes the model and reports whether its readiness changed.
func (g *gate) check(ctx context.Context, log zerolog.Logger) bool {
	ctx, cancel := context.WithTimeout(ctx, readyProbeTimeout)
	defer cancel()
	err := g.readier.Ready(ctx)
	was := g.ready.Load()
	if err != nil {
		why := strings.TrimPrefix(err.Error(), executor.ErrNotReady.Error()+": ")
		g.why.Store(&why)
	}
	g.ready.Store(err == nil)
	first := !g.checked.Swap(true)
	switch {
	case err == nil && !was:
		log.Info().Msg("model ready: announced")
	case err != nil && was:
		log.Warn().Err(err).Msg("model not ready: withdrawn from the heartbeat")
	case err != nil && first:
		log.Warn().Err(err).Msg("model not ready at start: not announced until it is (tasks of its types go to other models or wait)")
	}
	return (err == nil) != was
}

// announced returns the models the node announces now: those ready.
func (w *Worker) announced() []protocol.ModelInfo {
	out := make([]protocol.ModelInfo, 0, len(w.specs))
	for _, s := range w.specs {
		if h := w.models[s.Name]; h != nil {
			if g, ok := h.exec.(*gate); ok && !g.ready.Load() {
				continue
			}
		}
		mi := s.Info(0) // no model timeout: the dispatcher applies its MLSCHED_TASK_TIMEOUT
		if h := w.models[s.Name]; h != nil {
			mi.InFlight = int(h.inFlight.Load())
		}
		out = append(out, mi)
	}
	return out
}

// unready returns the hosted models not announced now, and why.
func (w *Worker) unready() []protocol.UnreadyModel {
	var out []protocol.UnreadyModel
	for _, s := range w.specs {
		if h := w.models[s.Name]; h != nil {
			if g, ok := h.exec.(*gate); ok && !g.ready.Load() {
				why := *g.why.Load()
				out = append(out, protocol.UnreadyModel{Name: s.Name, Reason: why, Types: s.Types,
					Transient: strings.HasPrefix(why, "cooling down")}) // executor.HTTP.Ready's cooldown text
			}
		}
	}
	return out
}

// checkReadiness probes every gated model at once and reports whether any
// changed.
func (w *Worker) checkReadiness(ctx context.Context) bool {
	var changed atomic.Bool
	var wg sync.WaitGroup
	for name, h := range w.models {
		if g, ok := h.exec.(*gate); ok {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if g.check(ctx, w.log.With().Str("model", name).Logger()) {
					changed.Store(true)
				}
			}()
		}
	}
	wg.Wait()
	return changed.Load()
}

// watchReadiness re-checks the models every ReadyInterval, or at once when
// poked, and makes the heartbeat announce a change at once.
func (w *Worker) watchReadiness(ctx context.Context, poke <-chan struct{}, hb *heartbeat) {
	t := time.NewTicker(w.cfg.ReadyInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-poke:
		}
		if w.checkReadiness(ctx) {
			hb.Kick()
		}
	}
}

// Package lifecycle gives every background component of mlsched the same
// shape, in the spirit of River's startstop.Service: Start(ctx) starts it
// and returns once it is started (or could not start), Stop stops it, waits
// for it and reports what went wrong, and Started is closed once it runs,
// so tests wait on it instead of polling. Group starts components in order
// and stops them in reverse order.
package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// Service is a component with a lifecycle.
type Service interface {
	// Start starts the service. The service runs until Stop, not until ctx
	// ends: ctx bounds the start and carries values.
	Start(ctx context.Context) error
	// Stop stops the service, waits for it, and returns the error it ended
	// with (nil after a clean stop). Stopping a service that is not running
	// is a no-op.
	Stop() error
	// Started is closed once the service runs.
	Started() <-chan struct{}
}

// ErrRunning is returned by Start on a service that is already running.
var ErrRunning = errors.New("already running")

// Loop runs one goroutine as a Service; embed it and call Go from Start.
// The zero value is ready to use; a stopped Loop can be started again.
type Loop struct {
	mu      sync.Mutex
	cancel  context.CancelFunc
	done    chan struct{}
	started chan struct{}
	err     error
}

// Go starts run on its own goroutine with a context that ends at Stop (and
// keeps ctx's values). run calls ready once it serves; it returns when its
// context ends, or earlier with an error, which Stop returns (Done tells a
// supervisor it ended). Go waits for ready, or for run to return, or for ctx
// to end.
func (l *Loop) Go(ctx context.Context, run func(ctx context.Context, ready func()) error) error {
	l.mu.Lock()
	if l.done != nil {
		select {
		case <-l.done: // ended on its own: may start again
		default:
			l.mu.Unlock()
			return ErrRunning
		}
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done, started := make(chan struct{}), l.startedLocked()
	l.cancel, l.done, l.err = cancel, done, nil
	l.mu.Unlock()

	var once sync.Once
	ready := func() { once.Do(func() { close(started) }) }
	go func() {
		defer close(done)
		err := run(rctx, ready)
		if errors.Is(err, context.Canceled) && rctx.Err() != nil {
			err = nil // stopped
		}
		l.mu.Lock()
		l.err = err
		l.mu.Unlock()
	}()
	select {
	case <-started:
		return nil
	case <-done:
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.err != nil {
			return l.err
		}
		return fmt.Errorf("stopped before it started")
	case <-ctx.Done():
		_ = l.Stop()
		return ctx.Err()
	}
}

func (l *Loop) startedLocked() chan struct{} {
	if l.started == nil {
		l.started = make(chan struct{})
		return l.started
	}
	select {
	case <-l.started: // a previous run: a fresh signal for this one
		l.started = make(chan struct{})
	default:
	}
	return l.started
}

// Started is closed once the running loop has called ready.
func (l *Loop) Started() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.started == nil {
		l.started = make(chan struct{})
	}
	return l.started
}

// Done is closed when the loop has returned (nil before it starts).
func (l *Loop) Done() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.done
}

// Stop cancels the loop's context, waits for it and returns its error.
func (l *Loop) Stop() error {
	l.mu.Lock()
	cancel, done := l.cancel, l.done
	l.mu.Unlock()
	if done == nil {
		return nil
	}
	cancel()
	<-done
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Run returns a Service whose Start runs run on its own goroutine, as
// Loop.Go does.
func Run(run func(ctx context.Context, ready func()) error) Service { return &runService{run: run} }

type runService struct {
	Loop
	run func(ctx context.Context, ready func()) error
}

func (s *runService) Start(ctx context.Context) error { return s.Go(ctx, s.run) }

// Func is a Service made of a start and a stop function, for a component
// whose work runs on goroutines it does not own (a subscription, a batcher).
type Func struct {
	Name    string
	OnStart func(ctx context.Context) error
	OnStop  func() error

	mu      sync.Mutex
	running bool
	started chan struct{}
}

// Start calls OnStart.
func (f *Func) Start(ctx context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.running {
		return ErrRunning
	}
	if f.OnStart != nil {
		if err := f.OnStart(ctx); err != nil {
			return err
		}
	}
	f.running = true
	if f.started == nil {
		f.started = make(chan struct{})
	}
	close(f.started)
	return nil
}

// Stop calls OnStop once per Start.
func (f *Func) Stop() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.running {
		return nil
	}
	f.running, f.started = false, nil
	if f.OnStop == nil {
		return nil
	}
	return f.OnStop()
}

// Started is closed once Start has succeeded.
func (f *Func) Started() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.started == nil {
		f.started = make(chan struct{})
	}
	return f.started
}

// Group runs services as one: Start starts them in order, Stop stops them in
// reverse order and joins their errors, each named.
type Group struct {
	mu      sync.Mutex
	names   []string
	started []Service
}

// Start starts one more service. When it fails the error names it; the
// services already started keep running until Stop.
func (g *Group) Start(ctx context.Context, name string, s Service) error {
	if err := s.Start(ctx); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	g.mu.Lock()
	g.names, g.started = append(g.names, name), append(g.started, s)
	g.mu.Unlock()
	return nil
}

// Stop stops every started service, last started first, and returns their
// errors joined (nil when all stopped cleanly).
func (g *Group) Stop() error {
	g.mu.Lock()
	names, started := g.names, g.started
	g.names, g.started = nil, nil
	g.mu.Unlock()
	var errs []error
	for i := len(started) - 1; i >= 0; i-- {
		if err := started[i].Stop(); err != nil {
			errs = append(errs, fmt.Errorf("stop %s: %w", names[i], err))
		}
	}
	return errors.Join(errs...)
}

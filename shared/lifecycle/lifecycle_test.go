package lifecycle_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/mlsched/mlsched/shared/lifecycle"
)

type loopSvc struct {
	lifecycle.Loop
	run func(ctx context.Context, ready func()) error
}

func (s *loopSvc) Start(ctx context.Context) error { return s.Go(ctx, s.run) }

func waitClosed(t *testing.T, c <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s not closed", what)
	}
}

func TestLoopStartsStopsAndRestarts(t *testing.T) {
	runs := 0
	s := &loopSvc{run: func(ctx context.Context, ready func()) error {
		runs++
		ready()
		<-ctx.Done()
		return ctx.Err() // a clean stop: not an error
	}}
	if err := s.Stop(); err != nil {
		t.Fatalf("stop before start: %v", err)
	}
	started := s.Started()
	ctx, cancel := context.WithCancel(context.Background())
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, started, "Started")
	if err := s.Start(ctx); !errors.Is(err, lifecycle.ErrRunning) {
		t.Fatalf("second start: %v", err)
	}
	cancel() // the start context does not stop the loop
	select {
	case <-s.Done():
		t.Fatal("the loop ended with its start context")
	default:
	}
	if err := s.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatalf("restart: %v", err)
	}
	if err := s.Stop(); err != nil || runs != 2 {
		t.Fatalf("stop: %v, runs %d", err, runs)
	}
}

func TestLoopReportsItsError(t *testing.T) {
	boom := errors.New("boom")
	early := &loopSvc{run: func(context.Context, func()) error { return boom }}
	if err := early.Start(context.Background()); !errors.Is(err, boom) {
		t.Fatalf("start of a loop that fails at once: %v", err)
	}
	late := &loopSvc{run: func(ctx context.Context, ready func()) error {
		ready()
		<-ctx.Done()
		return boom // e.g. a final flush that failed
	}}
	if err := late.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := late.Stop(); !errors.Is(err, boom) {
		t.Fatalf("stop: %v, want boom", err)
	}
}

func TestLoopStartGivesUpWithItsContext(t *testing.T) {
	stopped := make(chan struct{})
	s := &loopSvc{run: func(ctx context.Context, ready func()) error {
		<-ctx.Done() // never ready
		close(stopped)
		return nil
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if err := s.Start(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("start: %v", err)
	}
	waitClosed(t, stopped, "the loop's context")
}

func TestGroupStopsInReverseAndJoinsErrors(t *testing.T) {
	var order []string
	svc := func(name string, stopErr error) *lifecycle.Func {
		return &lifecycle.Func{
			OnStart: func(context.Context) error { order = append(order, "start "+name); return nil },
			OnStop:  func() error { order = append(order, "stop "+name); return stopErr },
		}
	}
	var g lifecycle.Group
	ctx := context.Background()
	a, b := svc("a", errors.New("flush failed")), svc("b", nil)
	for _, s := range []struct {
		name string
		s    lifecycle.Service
	}{{"a", a}, {"b", b}} {
		if err := g.Start(ctx, s.name, s.s); err != nil {
			t.Fatal(err)
		}
		waitClosed(t, s.s.Started(), s.name)
	}
	bad := &lifecycle.Func{OnStart: func(context.Context) error { return errors.New("no bucket") }}
	if err := g.Start(ctx, "c", bad); err == nil || !strings.Contains(err.Error(), "start c: no bucket") {
		t.Fatalf("start c: %v", err)
	}
	err := g.Stop()
	if err == nil || err.Error() != "stop a: flush failed" {
		t.Fatalf("stop: %v", err)
	}
	if got := strings.Join(order, ","); got != "start a,start b,stop b,stop a" {
		t.Fatalf("order %s", got)
	}
	if err := g.Stop(); err != nil {
		t.Fatalf("second stop: %v", err)
	}
}

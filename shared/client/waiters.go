package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// waitIdle is how long the shared results consumer outlives its last
// waiter: a producer that waits in bursts keeps one consumer, not one per
// burst.
const waitIdle = 30 * time.Second

// replayMargin is how many of the results stored before the shared consumer
// starts it delivers again (see hub.start): more than a healthy follower
// lags behind its leader.
const replayMargin = 8192

// hub delivers results to every Wait and WaitAll of a client through ONE
// ordered consumer over mlsched.results.> (from the last replayMargin
// results on), started with the
// first waiter and stopped waitIdle after the last. A waiter registers
// before it looks the result up in the stream, so a result published
// before the consumer began is found by the look-up and one published after
// is delivered: none is missed, and a wait costs a map entry and a direct
// get, never a JetStream API request of its own (consumer creation is per
// client). Every waiting client receives every new result: the price of
// not depending on one consumer per task.
type hub struct {
	c *Client

	mu      sync.Mutex
	waiting map[string][]*waiter
	run     *hubRun     // the consumer, nil when none
	idle    *time.Timer // stops run once nobody waits
}

// hubRun is one life of the shared consumer; ready is closed once it runs
// (or failed to start: err).
type hubRun struct {
	ready chan struct{}
	err   error
	s     jetstream.Stream
	cons  jetstream.Consumer
	cc    jetstream.ConsumeContext
}

// stop ends the consumer and deletes it on the server rather than leave it
// for its InactiveThreshold (best effort: it goes away then anyway).
func (r *hubRun) stop() {
	<-r.ready
	if r.cc == nil {
		return
	}
	r.cc.Stop()
	if info := r.cons.CachedInfo(); info != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = r.s.DeleteConsumer(ctx, info.Name)
		cancel()
	}
}

// waiter is one id awaited; ch is shared by the ids of a WaitAll and has
// room for two deliveries per id (the consumer's and the look-up's), so
// the consumer never blocks on it.
type waiter struct {
	id string
	ch chan delivery
}

type delivery struct {
	id  string
	r   *protocol.Result
	err error
}

// hub returns the client's hub, made on first use.
func (c *Client) hub() *hub {
	c.hubOnce.Do(func() { c.waits = &hub{c: c, waiting: map[string][]*waiter{}} })
	return c.waits
}

// register adds waiters and makes sure the shared consumer runs, returning
// once it does (or with its start error, the waiters removed again).
func (h *hub) register(ctx context.Context, ws []*waiter) error {
	h.mu.Lock()
	for _, w := range ws {
		h.waiting[w.id] = append(h.waiting[w.id], w)
	}
	if h.idle != nil {
		h.idle.Stop()
		h.idle = nil
	}
	run, starter := h.run, false
	if run == nil {
		run, starter = &hubRun{ready: make(chan struct{})}, true
		h.run = run
	}
	h.mu.Unlock()
	if starter {
		run.err = h.start(ctx, run)
		if run.err != nil {
			h.mu.Lock()
			if h.run == run {
				h.run = nil
			}
			h.mu.Unlock()
		}
		close(run.ready)
	}
	select {
	case <-run.ready:
	case <-ctx.Done():
		h.unregister(ws)
		return ctx.Err()
	}
	if run.err != nil {
		h.unregister(ws)
		return run.err
	}
	return nil
}

func (h *hub) start(ctx context.Context, run *hubRun) error {
	s, err := h.c.resultsStream(ctx)
	if err != nil {
		return err
	}
	// The consumer starts replayMargin results back, not at the next one:
	// on a replicated stream a look-up is a direct get that any replica
	// answers, and a follower a little behind the leader can miss a result
	// stored just before the consumer began (an R3 run lost sight of four
	// early results so). Replayed results nobody waits for cost a map
	// look-up each.
	cfg := jetstream.OrderedConsumerConfig{
		FilterSubjects:    []string{topology.SubjectResultsAll},
		DeliverPolicy:     jetstream.DeliverNewPolicy,
		InactiveThreshold: 30 * time.Second,
	}
	if info, err := s.Info(ctx); err == nil && info.State.LastSeq > 0 {
		cfg.DeliverPolicy = jetstream.DeliverByStartSequencePolicy
		cfg.OptStartSeq = max(info.State.FirstSeq, info.State.LastSeq-min(info.State.LastSeq, replayMargin)+1)
	}
	cons, err := s.OrderedConsumer(ctx, cfg)
	if err != nil {
		return fmt.Errorf("results consumer: %w", err)
	}
	prefix := len(topology.ResultSubject(""))
	cc, err := cons.Consume(func(m jetstream.Msg) {
		subj := m.Subject()
		if len(subj) <= prefix {
			return
		}
		id := subj[prefix:]
		h.mu.Lock()
		ws := h.waiting[id]
		if ws != nil {
			delete(h.waiting, id)
			h.armIdleLocked()
		}
		h.mu.Unlock()
		if ws == nil {
			return // nobody here waits for it
		}
		r, err := decodeResult(id, m.Data())
		for _, w := range ws {
			w.send(delivery{id: id, r: r, err: err})
		}
	})
	if err != nil {
		return fmt.Errorf("results consumer: %w", err)
	}
	run.s, run.cons, run.cc = s, cons, cc
	return nil
}

func (w *waiter) send(d delivery) {
	select {
	case w.ch <- d:
	default: // cannot happen (room for two per id); never block the consumer
	}
}

// unregister removes waiters that are done (delivered or given up).
func (h *hub) unregister(ws []*waiter) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, w := range ws {
		list := h.waiting[w.id]
		for i, x := range list {
			if x == w {
				list = append(list[:i], list[i+1:]...)
				break
			}
		}
		if len(list) == 0 {
			delete(h.waiting, w.id)
		} else {
			h.waiting[w.id] = list
		}
	}
	h.armIdleLocked()
}

// armIdleLocked starts the idle timer once nobody waits.
func (h *hub) armIdleLocked() {
	if len(h.waiting) > 0 || h.run == nil || h.idle != nil {
		return
	}
	run := h.run
	h.idle = time.AfterFunc(waitIdle, func() {
		h.mu.Lock()
		if h.run != run || len(h.waiting) > 0 {
			h.mu.Unlock()
			return
		}
		h.run, h.idle = nil, nil
		h.mu.Unlock()
		run.stop()
	})
}

// close stops the consumer (Client.Close).
func (h *hub) close() {
	h.mu.Lock()
	run := h.run
	h.run = nil
	if h.idle != nil {
		h.idle.Stop()
		h.idle = nil
	}
	h.mu.Unlock()
	if run != nil {
		run.stop()
	}
}

// lookup reads id's stored result: a delivery, or ok=false when there is
// none yet.
func (c *Client) lookup(ctx context.Context, id string) (d delivery, ok bool) {
	r, err := c.Result(ctx, id)
	if errors.Is(err, ErrNoResult) {
		return delivery{}, false
	}
	return delivery{id: id, r: r, err: err}, true
}

// ResultsWindow describes how long the results stream keeps results: the
// window within which Result, Wait and `mlsched result` can answer.
type ResultsWindow struct {
	// MaxAge, MaxMsgs and MaxBytes are the stream's bounds (0: none).
	MaxAge   time.Duration
	MaxMsgs  int64
	MaxBytes int64
	// Msgs and Bytes are what it holds; Oldest is its oldest result's time
	// (zero when empty): a task finished before Oldest has no result any
	// more.
	Msgs   uint64
	Bytes  uint64
	Oldest time.Time
}

// String says the window in words, for error messages.
func (w ResultsWindow) String() string {
	s := fmt.Sprintf("results are kept for at most %v", w.MaxAge)
	if w.MaxMsgs > 0 {
		s += fmt.Sprintf(" and the last %d", w.MaxMsgs)
	}
	if !w.Oldest.IsZero() {
		s += fmt.Sprintf("; the oldest kept finished at %s (%v ago)", w.Oldest.UTC().Format(time.RFC3339), time.Since(w.Oldest).Round(time.Second))
	}
	return s
}

// Window reads the results stream's bounds and state (one stream-info
// request).
func (c *Client) Window(ctx context.Context) (ResultsWindow, error) {
	s, err := c.resultsStream(ctx)
	if err != nil {
		return ResultsWindow{}, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return ResultsWindow{}, fmt.Errorf("results stream: %w", err)
	}
	w := ResultsWindow{MaxAge: info.Config.MaxAge, MaxMsgs: max(0, info.Config.MaxMsgs), MaxBytes: max(0, info.Config.MaxBytes),
		Msgs: info.State.Msgs, Bytes: info.State.Bytes}
	if info.State.Msgs > 0 {
		w.Oldest = info.State.FirstTime
	}
	return w, nil
}

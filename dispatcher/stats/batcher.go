package stats

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// ErrStopped is returned by Add after Stop: the event is counted as dropped.
var ErrStopped = errors.New("stats batcher stopped")

// BatcherConfig configures a Batcher. Zero fields take the defaults shown.
type BatcherConfig struct {
	// FlushInterval is how often buffered events are written (default 50ms).
	FlushInterval time.Duration
	// MaxBatch is the most events per Record call; that many waiting events
	// trigger a flush before the interval (default 1000).
	MaxBatch int
	// MaxBuffer is the most events kept while the store fails; beyond it the
	// oldest are dropped and counted (default 100000).
	MaxBuffer int
	// RetryMin is the first wait after a failed Record, doubled on each
	// further failure (default 100ms).
	RetryMin time.Duration
	// RetryMax caps the wait between retries (default 5s).
	RetryMax time.Duration
	// RecordTimeout bounds one Record call (default 5s).
	RecordTimeout time.Duration
	// OnError, if set, is called from the flush loop with each failed
	// Record's error, for logging (default none).
	OnError func(error)
}

func (c BatcherConfig) withDefaults() BatcherConfig {
	if c.FlushInterval <= 0 {
		c.FlushInterval = 50 * time.Millisecond
	}
	if c.MaxBatch <= 0 {
		c.MaxBatch = 1000
	}
	if c.MaxBuffer <= 0 {
		c.MaxBuffer = 100_000
	}
	if c.RetryMin <= 0 {
		c.RetryMin = 100 * time.Millisecond
	}
	if c.RetryMax < c.RetryMin {
		c.RetryMax = max(5*time.Second, c.RetryMin)
	}
	if c.RecordTimeout <= 0 {
		c.RecordTimeout = 5 * time.Second
	}
	return c
}

// BatcherStats tells how the write path is doing.
type BatcherStats struct {
	// Buffered events wait to be written.
	Buffered int64 `json:"buffered"`
	// Dropped events were discarded: the oldest ones beyond MaxBuffer, and
	// events added after Stop.
	Dropped int64 `json:"dropped"`
	// Flushed events were written to the store.
	Flushed int64 `json:"flushed"`
	// Rejected events were invalid (Add returned ErrInvalidEvent).
	Rejected int64 `json:"rejected"`
	// Degraded is true from a failed Record until the next successful one.
	Degraded bool `json:"degraded"`
	// LastError is the error of the last failed Record ("" if none yet).
	LastError string `json:"last_error,omitempty"`
}

// Batcher is the dispatcher's write path to a Store: Add only appends to a
// buffer, and a background loop writes the buffer in batches, so no task
// waits for a Redis round trip. While the store fails the loop keeps the
// events and retries with capped backoff; past MaxBuffer it drops the
// oldest, because fresh statistics matter more to routing than old ones.
//
// Delivery is at least once: a Record that failed on the way back (applied
// by Redis, reply lost) is retried and counted twice.
type Batcher struct {
	store Store
	cfg   BatcherConfig

	mu       sync.Mutex
	buf      []Event // buf[head:] are the buffered events, oldest first
	head     int
	firstSeq int64 // sequence number of buf[head]
	// inflightEnd is the sequence number after the batch being written;
	// events below it dropped meanwhile count as dropped only if that
	// write fails (inflightDrops).
	inflightEnd   int64
	inflightDrops int64
	stopped       bool
	st            BatcherStats

	flushMu sync.Mutex // one flush at a time
	out     []Event    // batch being written, owned under flushMu

	full     chan struct{}
	stop     chan struct{}
	done     chan struct{}
	startMu  sync.Mutex
	started  bool
	stopOnce sync.Once
}

// NewBatcher returns a batcher writing to store; call Start to run it.
func NewBatcher(store Store, cfg BatcherConfig) *Batcher {
	return &Batcher{
		store: store,
		cfg:   cfg.withDefaults(),
		full:  make(chan struct{}, 1),
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
	}
}

// Add buffers one event; it never blocks on the store. An invalid event is
// refused with ErrInvalidEvent (and counted as rejected) so that it cannot
// poison a batch.
func (b *Batcher) Add(ev Event) error {
	if err := ev.Validate(); err != nil {
		b.mu.Lock()
		b.st.Rejected++
		b.mu.Unlock()
		return err
	}
	b.mu.Lock()
	if b.stopped {
		b.st.Dropped++
		b.mu.Unlock()
		return ErrStopped
	}
	if len(b.buf)-b.head >= b.cfg.MaxBuffer {
		if b.firstSeq < b.inflightEnd {
			b.inflightDrops++
		} else {
			b.st.Dropped++
		}
		b.buf[b.head] = Event{}
		b.head++
		b.firstSeq++
	}
	if len(b.buf) == cap(b.buf) && b.head > 0 && b.head >= len(b.buf)/2 {
		n := copy(b.buf, b.buf[b.head:])
		clear(b.buf[n:])
		b.buf, b.head = b.buf[:n], 0
	}
	b.buf = append(b.buf, ev)
	full := len(b.buf)-b.head >= b.cfg.MaxBatch
	b.mu.Unlock()
	if full {
		select {
		case b.full <- struct{}{}:
		default:
		}
	}
	return nil
}

// Stats returns the current counters.
func (b *Batcher) Stats() BatcherStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.st
	s.Buffered = int64(len(b.buf) - b.head)
	return s
}

// Start runs the flush loop until ctx ends or Stop is called. Records are
// not cancelled with ctx (each has RecordTimeout): call Stop to write what
// is left.
func (b *Batcher) Start(ctx context.Context) {
	b.startMu.Lock()
	defer b.startMu.Unlock()
	if b.started {
		return
	}
	b.started = true
	go b.run(ctx)
}

func (b *Batcher) run(ctx context.Context) {
	defer close(b.done)
	recordCtx := context.WithoutCancel(ctx)
	tick := time.NewTicker(b.cfg.FlushInterval)
	defer tick.Stop()
	var retry <-chan time.Time
	backoff := time.Duration(0)
	for {
		select {
		case <-ctx.Done():
			return
		case <-b.stop:
			return
		case <-tick.C:
		case <-b.full:
		case <-retry:
			retry = nil
		}
		if retry != nil {
			continue // backing off
		}
		if err := b.Flush(recordCtx); err != nil {
			if b.cfg.OnError != nil {
				b.cfg.OnError(err)
			}
			backoff = min(max(2*backoff, b.cfg.RetryMin), b.cfg.RetryMax)
			retry = time.After(backoff)
			continue
		}
		backoff = 0
	}
}

// Flush writes the events buffered when it is called, in batches of at
// most MaxBatch, and returns the first error (the unwritten events stay
// buffered).
func (b *Batcher) Flush(ctx context.Context) error {
	b.flushMu.Lock()
	defer b.flushMu.Unlock()
	b.mu.Lock()
	end := b.firstSeq + int64(len(b.buf)-b.head)
	b.mu.Unlock()
	for {
		seq, n := b.take(end)
		if n == 0 {
			return nil
		}
		rctx, cancel := context.WithTimeout(ctx, b.cfg.RecordTimeout)
		err := b.store.Record(rctx, b.out[:n])
		cancel()
		clear(b.out[:n]) // do not pin model names
		if err != nil && !errors.Is(err, ErrInvalidEvent) {
			b.mu.Lock()
			b.st.Degraded, b.st.LastError = true, err.Error()
			b.st.Dropped += b.inflightDrops
			b.inflightDrops, b.inflightEnd = 0, 0
			b.mu.Unlock()
			return fmt.Errorf("stats batcher: %w", err)
		}
		b.commit(seq, n, err != nil)
	}
}

// take copies up to MaxBatch buffered events with sequence numbers below
// end into b.out.
func (b *Batcher) take(end int64) (seq int64, n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n = min(int(end-b.firstSeq), len(b.buf)-b.head, b.cfg.MaxBatch)
	if n <= 0 {
		return b.firstSeq, 0
	}
	if cap(b.out) < n {
		b.out = make([]Event, n)
	}
	copy(b.out[:n], b.buf[b.head:b.head+n])
	b.inflightEnd = b.firstSeq + int64(n)
	return b.firstSeq, n
}

// commit removes a written batch from the buffer, minus whatever was
// dropped from it meanwhile.
func (b *Batcher) commit(seq int64, n int, rejected bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.inflightDrops, b.inflightEnd = 0, 0
	if rejected {
		b.st.Rejected += int64(n)
	} else {
		b.st.Flushed += int64(n)
		b.st.Degraded = false
	}
	if gone := seq + int64(n) - b.firstSeq; gone > 0 {
		clear(b.buf[b.head : b.head+int(gone)])
		b.head += int(gone)
		b.firstSeq += gone
	}
	if b.head == len(b.buf) {
		b.buf, b.head = b.buf[:0], 0
	}
}

// Stop ends the loop, refuses further events, and writes what is left,
// retrying until ctx ends. It returns an error naming how many events could
// not be written.
func (b *Batcher) Stop(ctx context.Context) error {
	b.stopOnce.Do(func() {
		b.mu.Lock()
		b.stopped = true
		b.mu.Unlock()
		close(b.stop)
	})
	b.startMu.Lock()
	started := b.started
	b.startMu.Unlock()
	if started {
		select {
		case <-b.done:
		case <-ctx.Done():
		}
	}
	backoff := b.cfg.RetryMin
	for {
		err := b.Flush(ctx)
		left := b.Stats().Buffered
		if err == nil && left == 0 {
			return nil
		}
		if err == nil {
			continue
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("stats batcher: %d events not written: %w", left, err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, b.cfg.RetryMax)
	}
}

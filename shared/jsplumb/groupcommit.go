package jsplumb

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
)

// Sender publishes m (with Nats-Msg-Id msgID when not empty) and calls cb
// once with its outcome; an error means cb will not be called. Publisher
// and GroupCommit are Senders, so that the Completer settles through
// either.
type Sender interface {
	Publish(ctx context.Context, m *nats.Msg, msgID string, cb Callback) error
}

// GroupCommitConfig configures a GroupCommit.
type GroupCommitConfig struct {
	// Solo is how many messages may be in flight on their own; the next
	// ones wait and go together as one atomic batch (default 8). At a rate
	// the solo publishes keep up with, nothing waits and nothing changes.
	Solo int
	// MinBatch is the fewest waiting messages worth a batch (default 16):
	// a batch costs the server about as much as 10-15 single stores (it
	// stages the batch in a store of its own), so fewer go on their own.
	MinBatch int
	// MaxBatch bounds one batch (default 256; nats-server allows 1000).
	MaxBatch int
	// MaxWaiting bounds the messages waiting or in flight; Publish waits
	// for room until its ctx ends (default 4096).
	MaxWaiting int
}

func (c GroupCommitConfig) withDefaults() GroupCommitConfig {
	if c.Solo <= 0 {
		c.Solo = 8
	}
	if c.MinBatch <= 1 {
		c.MinBatch = 16
	}
	if c.MaxBatch < c.MinBatch {
		c.MaxBatch = max(256, c.MinBatch)
	}
	c.MaxBatch = min(c.MaxBatch, 1000)
	if c.MaxWaiting <= 0 {
		c.MaxWaiting = 4096
	}
	return c
}

// GroupCommit is group commit for one stream on one nats-server: the
// messages published while the stream is busy are stored together, as one
// atomic batch (nats-server 2.12+, a stream with AllowAtomicPublish), which
// a single server with sync_interval always writes with one fsync for the
// whole batch, instead of one per message (docs/benchmarks.md, "Group
// commit"). Postgres does the same for concurrent transactions.
//
// Each message keeps its own outcome, as if published alone: its callback
// gets an acknowledgement with its own sequence once the batch is stored
// and synced. A batch the stream refuses is stored not at all (it is
// atomic), so its messages are then published one by one and each gets
// the verdict it would have had alone: a duplicate Nats-Msg-Id, a refused
// expected sequence (a task's second result) or a full stream concerns
// that message only. A timeout or a dropped connection reaches every
// message of the batch, as it would a single publish: message ids and
// expected sequences make the caller's retry harmless.
//
// Every message must be for the same stream. Start before publishing; Stop
// before stopping the Publisher.
type GroupCommit struct {
	pub  *Publisher
	cfg  GroupCommitConfig
	room chan struct{} // one unit per message waiting or in flight

	mu       sync.Mutex
	waiting  []queued
	again    []queued // of a refused batch: each goes alone, first
	solo     int      // messages in flight on their own
	batching bool     // a batch in flight
	stopping bool
	idle     chan struct{} // closed when stopping and nothing waits or flies
	prefix   string        // batch ids: prefix + counter
	next     uint64

	kick chan struct{}
	done chan struct{}
	loop sync.WaitGroup

	disabled atomic.Bool // the stream refused atomic publishes: all go alone

	batches, batched atomic.Int64
}

type queued struct {
	m     *nats.Msg
	msgID string
	cb    Callback
}

// NewGroupCommit returns a group commit over pub, whose reply subscription
// carries the batches' acknowledgements.
func NewGroupCommit(pub *Publisher, cfg GroupCommitConfig) *GroupCommit {
	cfg = cfg.withDefaults()
	return &GroupCommit{pub: pub, cfg: cfg, room: make(chan struct{}, cfg.MaxWaiting), prefix: nuid.Next() + ".",
		kick: make(chan struct{}, 1)}
}

// Start starts the goroutine that sends what waits (messages published
// before Start wait for it). Messages are sent from it only, never from a
// reply callback, which must not block.
func (g *GroupCommit) Start(context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.done != nil {
		return errors.New("jsplumb: group commit already started")
	}
	g.done = make(chan struct{})
	g.loop.Add(1)
	go g.run(g.done)
	g.wake()
	return nil
}

// Stats returns the batches sent and the messages they carried.
func (g *GroupCommit) Stats() (batches, messages int64) { return g.batches.Load(), g.batched.Load() }

// Publish queues m and calls cb once with its outcome. It waits while
// MaxWaiting messages wait or fly, until ctx ends. An error means cb will
// not be called.
func (g *GroupCommit) Publish(ctx context.Context, m *nats.Msg, msgID string, cb Callback) error {
	if err := takeRoom(ctx, m, g.room, "messages waiting or in flight"); err != nil {
		return err
	}
	g.mu.Lock()
	if g.stopping {
		g.releaseLocked(1)
		g.mu.Unlock()
		return ErrStopped
	}
	g.waiting = append(g.waiting, queued{m: m, msgID: msgID, cb: cb})
	g.mu.Unlock()
	g.wake()
	return nil
}

func (g *GroupCommit) wake() {
	select {
	case g.kick <- struct{}{}:
	default:
	}
}

func (g *GroupCommit) run(done chan struct{}) {
	defer g.loop.Done()
	for {
		select {
		case <-done:
			return
		case <-g.kick:
		}
		g.send()
	}
}

// send sends what the rules allow now: a batch when none is in flight and
// enough wait, else single messages while there is solo room.
func (g *GroupCommit) send() {
	for {
		g.mu.Lock()
		var batch, alone []queued
		switch {
		case len(g.again) > 0:
			alone, g.again = g.again, nil
			g.solo += len(alone)
		case !g.batching && len(g.waiting) >= g.cfg.MinBatch && !g.disabled.Load():
			n := min(len(g.waiting), g.cfg.MaxBatch)
			batch = append([]queued(nil), g.waiting[:n]...)
			g.waiting = append(g.waiting[:0], g.waiting[n:]...)
			g.batching = true
		case len(g.waiting) > 0 && (g.solo < g.cfg.Solo || g.disabled.Load()):
			n := len(g.waiting)
			if !g.disabled.Load() {
				n = min(n, g.cfg.Solo-g.solo)
			}
			alone = append([]queued(nil), g.waiting[:n]...)
			g.waiting = append(g.waiting[:0], g.waiting[n:]...)
			g.solo += n
		}
		g.mu.Unlock()
		switch {
		case batch != nil:
			g.sendBatch(batch)
		case alone != nil:
			for _, q := range alone {
				g.sendAlone(q)
			}
		default:
			return
		}
	}
}

// sendAlone publishes one message on its own.
func (g *GroupCommit) sendAlone(q queued) {
	err := g.pub.Publish(context.Background(), q.m, q.msgID, func(ack *jetstream.PubAck, err error) {
		g.finished(1, false)
		q.cb(ack, err)
	})
	if err != nil {
		g.finished(1, false)
		q.cb(nil, err)
	}
}

// Nats-Batch-* are the headers of nats-server's atomic batch publish.
const (
	hdrBatchID     = "Nats-Batch-Id"
	hdrBatchSeq    = "Nats-Batch-Sequence"
	hdrBatchCommit = "Nats-Batch-Commit"
)

// sendBatch publishes the batch: every message but the last with no reply
// (the server stages it), the last as the commit, whose acknowledgement
// comes once the whole batch is stored and synced.
func (g *GroupCommit) sendBatch(batch []queued) {
	g.mu.Lock()
	g.next++
	id := g.prefix + strconv.FormatUint(g.next, 10)
	g.mu.Unlock()
	g.batches.Add(1)
	g.batched.Add(int64(len(batch)))
	msgs := make([]*nats.Msg, len(batch))
	for i, q := range batch {
		m := &nats.Msg{Subject: q.m.Subject, Data: q.m.Data, Header: make(nats.Header, len(q.m.Header)+3)}
		for k, v := range q.m.Header {
			m.Header[k] = v
		}
		if q.msgID != "" {
			m.Header[jetstream.MsgIDHeader] = []string{q.msgID}
		}
		m.Header[hdrBatchID] = []string{id}
		m.Header[hdrBatchSeq] = []string{strconv.Itoa(i + 1)}
		msgs[i] = m
	}
	last := msgs[len(msgs)-1]
	last.Header[hdrBatchCommit] = []string{"1"}
	for _, m := range msgs[:len(msgs)-1] {
		// A staged message that does not arrive (the connection dropped)
		// leaves a gap: the server then refuses the commit as incomplete.
		_ = g.pub.nc.PublishMsg(m)
	}
	err := g.pub.Request(context.Background(), last, "", func(reply *nats.Msg, err error) {
		g.committed(batch, reply, err)
	})
	if err != nil {
		g.committed(batch, nil, err)
	}
}

// errNotBatched: the commit's acknowledgement did not count the batch (a
// server that ignores batch headers): whether the others were stored is
// unknown, so every message gets an error, and grouping stops.
var errNotBatched = errors.New("jsplumb: the stream did not store the messages as one batch")

// committed hands every message of a batch its outcome.
func (g *GroupCommit) committed(batch []queued, reply *nats.Msg, err error) {
	var ack batchAck
	if err == nil {
		err = ack.read(reply)
	}
	if err == nil && ack.Count != len(batch) {
		g.disabled.Store(true)
		err = errNotBatched
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		// Refused as a whole, so nothing of it is stored: each message
		// goes again alone, for the verdict it would have had alone.
		if apiErr.ErrorCode == jsErrCodeAtomicPublishDisabled {
			g.disabled.Store(true)
		}
		g.mu.Lock()
		g.batching = false
		g.again = append(g.again, batch...)
		g.mu.Unlock()
		g.wake()
		return
	}
	first := ack.Sequence - uint64(len(batch)) + 1
	for i, q := range batch {
		if err != nil {
			q.cb(nil, err)
			continue
		}
		q.cb(&jetstream.PubAck{Stream: ack.Stream, Sequence: first + uint64(i), Domain: ack.Domain}, nil)
	}
	g.finished(len(batch), true)
}

// jsErrCodeAtomicPublishDisabled is nats-server's error code for an atomic
// publish into a stream without AllowAtomicPublish.
const jsErrCodeAtomicPublishDisabled = 10174

type batchAck struct {
	Error *jetstream.APIError `json:"error"`
	jetstream.PubAck
	Batch string `json:"batch"`
	Count int    `json:"count"`
}

func (a *batchAck) read(m *nats.Msg) error {
	if len(m.Data) == 0 {
		if m.Header.Get("Status") == "503" {
			return ErrNoResponders
		}
		return ErrInvalidAck
	}
	if err := json.Unmarshal(m.Data, a); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidAck, err)
	}
	if a.Error != nil {
		return a.Error
	}
	if a.Stream == "" {
		return ErrInvalidAck
	}
	return nil
}

// finished releases n messages' room once their outcome is known (batch:
// the batch in flight ended) and sends what waits.
func (g *GroupCommit) finished(n int, batch bool) {
	g.mu.Lock()
	if batch {
		g.batching = false
	} else {
		g.solo -= n
	}
	g.releaseLocked(n)
	g.mu.Unlock()
	g.wake()
}

// releaseLocked frees n units of room and, once stopping and nothing waits
// or flies, tells Stop.
func (g *GroupCommit) releaseLocked(n int) {
	for range n {
		<-g.room
	}
	if g.idle != nil && len(g.room) == 0 {
		close(g.idle)
		g.idle = nil
	}
}

// Stop refuses new publishes and waits until every message waiting or in
// flight has its outcome (at most timeout), then stops the sending
// goroutine. Messages still waiting then get ErrStopped.
func (g *GroupCommit) Stop() error {
	g.mu.Lock()
	if g.stopping {
		g.mu.Unlock()
		return nil
	}
	g.stopping = true
	if g.done == nil { // never started: what waits fails
		left := g.waiting
		g.waiting = nil
		g.releaseLocked(len(left))
		g.mu.Unlock()
		for _, q := range left {
			q.cb(nil, ErrStopped)
		}
		return nil
	}
	idle := make(chan struct{})
	if len(g.room) == 0 {
		close(idle)
	} else {
		g.idle = idle
	}
	g.mu.Unlock()
	g.wake()
	select {
	case <-idle:
	case <-time.After(g.pub.cfg.Timeout + time.Second):
	}
	close(g.done)
	g.loop.Wait()
	g.mu.Lock()
	left := append(g.again, g.waiting...)
	g.again, g.waiting = nil, nil
	g.mu.Unlock()
	g.mu.Lock()
	g.releaseLocked(len(left))
	g.mu.Unlock()
	for _, q := range left {
		q.cb(nil, ErrStopped)
	}
	return nil
}

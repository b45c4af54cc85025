// The publisher publishes to JetStream asynchronously and hands each
// publish's acknowledgement to a callback, for publish-then-ack on a hot
// path: the callback acks the consumed message that caused the publish, on
// the goroutine that read the acknowledgement, with no future, channel,
// timer or settling goroutine per publish.
//
// It does what jetstream.PublishMsgAsync does for mlsched, cheaper (see
// BenchmarkPublish): one reply subscription on the connection's inbox
// prefix, reply subjects numbered from a counter, one timer for every
// publish in flight instead of one per publish, and a bounded number in
// flight (Publish waits for room).
//
// Guarantee: a callback is called exactly once per accepted publish: with
// the acknowledgement, or with an error when JetStream refused the message,
// nobody answered in time (ErrTimeout), the connection dropped
// (nats.ErrDisconnected: a publish buffered while reconnecting may still be
// stored; use message ids), or the publisher stopped (ErrStopped).

package jsplumb

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	fastjson "github.com/segmentio/encoding/json"
)

// Callback receives a publish's outcome: the acknowledgement (nil on error)
// or the error. It runs on the publisher's reply goroutine (or its timeout
// loop) and must not block: it may publish or ack, but not wait for a reply.
type Callback func(ack *jetstream.PubAck, err error)

var (
	// ErrTimeout: no acknowledgement came within PublisherConfig.Timeout.
	ErrTimeout = errors.New("jsplumb: no acknowledgement in time")
	// ErrStopped: the publisher stopped before the acknowledgement came, or
	// Publish was called on a stopped publisher.
	ErrStopped = errors.New("jsplumb: publisher stopped")
	// ErrInvalidAck: the acknowledgement could not be read.
	ErrInvalidAck = errors.New("jsplumb: invalid acknowledgement")
	// ErrNoResponders: nothing stores the subject (no stream, or JetStream
	// unavailable).
	ErrNoResponders = errors.New("jsplumb: no stream answered (no responders)")
)

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	// MaxPending bounds publishes awaiting acknowledgement; Publish waits
	// for room (default 1024).
	MaxPending int
	// Timeout fails a publish not acknowledged within it (default 10s);
	// it is checked every Timeout/10, so a publish fails at most 10% late.
	Timeout time.Duration
}

// Publisher is an asynchronous JetStream publisher on one connection. Start
// subscribes; Stop waits (bounded by Timeout) for the publishes in flight.
type Publisher struct {
	nc  *nats.Conn
	cfg PublisherConfig

	prefix string // reply subject prefix, "<inbox>."
	room   chan struct{}

	mu      sync.Mutex
	pending map[uint64]entry
	next    uint64
	sub     *nats.Subscription
	stopped bool
	drained chan struct{} // closed when pending empties after Stop
	done    chan struct{} // ends the timeout loop
	loop    sync.WaitGroup
	status  chan nats.Status
}

type entry struct {
	cb      Callback      // a publish: the reply is read as an acknowledgement
	raw     ReplyCallback // a request: the reply is the caller's to read
	expires int64         // unix nanoseconds
}

// call hands the entry its reply or error.
func (e *entry) call(m *nats.Msg, err error) {
	if e.raw != nil {
		if err == nil && len(m.Data) == 0 && m.Header.Get("Status") == "503" {
			m, err = nil, ErrNoResponders
		}
		e.raw(m, err)
		return
	}
	if err != nil {
		e.cb(nil, err)
		return
	}
	e.cb(parseReply(m))
}

// ReplyCallback receives a request's reply (nil on error) or the error,
// under the same rules as Callback.
type ReplyCallback func(reply *nats.Msg, err error)

// NewPublisher returns a publisher on nc; Start it before publishing.
func NewPublisher(nc *nats.Conn, cfg PublisherConfig) *Publisher {
	if cfg.MaxPending <= 0 {
		cfg.MaxPending = 1024
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	return &Publisher{nc: nc, cfg: cfg, room: make(chan struct{}, cfg.MaxPending)}
}

// Start subscribes to the reply subjects (under the connection's inbox
// prefix, so permissions written for it apply) and starts the timeout loop.
func (p *Publisher) Start(context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sub != nil {
		return errors.New("jsplumb: already started")
	}
	p.prefix = p.nc.NewInbox() + "."
	sub, err := p.nc.Subscribe(p.prefix+"*", p.onReply)
	if err != nil {
		return fmt.Errorf("jsplumb: subscribe to acknowledgements: %w", err)
	}
	// Acknowledgements must never be dropped as a slow consumer's: the
	// number in flight is bounded by MaxPending anyway.
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		_ = sub.Unsubscribe()
		return fmt.Errorf("jsplumb: %w", err)
	}
	p.sub = sub
	p.pending = make(map[uint64]entry, p.cfg.MaxPending)
	p.stopped, p.drained, p.done = false, nil, make(chan struct{})
	p.status = p.nc.StatusChanged(nats.RECONNECTING, nats.CLOSED)
	p.loop.Add(1)
	go p.run(p.done, p.status)
	return nil
}

// Pending is the number of publishes awaiting acknowledgement.
func (p *Publisher) Pending() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.pending)
}

// Publish sends m (whose Reply must be empty) with Nats-Msg-Id msgID when
// not empty, and calls cb once with its outcome. It waits while MaxPending
// publishes are in flight, until ctx ends. An error means cb will not be
// called.
func (p *Publisher) Publish(ctx context.Context, m *nats.Msg, msgID string, cb Callback) error {
	return p.send(ctx, m, msgID, entry{cb: cb})
}

// Request sends m, a core-NATS request (a direct report) that is not a
// JetStream publish, and calls cb once with its reply, which the caller
// reads, or with an error (ErrNoResponders when nobody listens, ErrTimeout,
// ...) under Publish's rules: the same room, timeout and reply
// subscription.
func (p *Publisher) Request(ctx context.Context, m *nats.Msg, msgID string, cb ReplyCallback) error {
	return p.send(ctx, m, msgID, entry{raw: cb})
}

func (p *Publisher) send(ctx context.Context, m *nats.Msg, msgID string, e entry) error {
	if err := takeRoom(ctx, m, p.room, "publishes in flight"); err != nil {
		return err
	}
	if msgID != "" {
		if m.Header == nil {
			m.Header = make(nats.Header, 1)
		}
		m.Header[jetstream.MsgIDHeader] = []string{msgID}
	}
	p.mu.Lock()
	if p.stopped || p.sub == nil {
		p.mu.Unlock()
		<-p.room
		return ErrStopped
	}
	p.next++
	id := p.next
	e.expires = time.Now().Add(p.cfg.Timeout).UnixNano()
	p.pending[id] = e
	p.mu.Unlock()

	var buf [20]byte
	m.Reply = p.prefix + string(strconv.AppendUint(buf[:0], id, 10))
	if err := p.nc.PublishMsg(m); err != nil {
		if _, ok := p.take(id); ok {
			return fmt.Errorf("jsplumb: publish: %w", err)
		}
		// The timeout loop or a disconnect took it first and called cb.
	}
	return nil
}

// takeRoom checks that m has no reply subject of its own and takes a unit
// of room, waiting until ctx ends; what names the units in the error.
func takeRoom(ctx context.Context, m *nats.Msg, room chan struct{}, what string) error {
	if m.Reply != "" {
		return errors.New("jsplumb: the message has a reply subject")
	}
	select {
	case room <- struct{}{}:
		return nil
	default:
	}
	select {
	case room <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("jsplumb: waiting for room (%d %s): %w", cap(room), what, ctx.Err())
	}
}

// take removes and returns the entry of id, releasing its room (false when
// it was taken already).
func (p *Publisher) take(id uint64) (entry, bool) {
	p.mu.Lock()
	e, ok := p.pending[id]
	if ok {
		delete(p.pending, id)
		p.releaseLocked()
	}
	p.mu.Unlock()
	return e, ok
}

// releaseLocked frees one unit of room and, once stopping and nothing is
// pending, tells Stop.
func (p *Publisher) releaseLocked() {
	<-p.room
	if p.drained != nil && len(p.pending) == 0 {
		close(p.drained)
		p.drained = nil
	}
}

func (p *Publisher) onReply(m *nats.Msg) {
	if len(m.Subject) <= len(p.prefix) {
		return // not ours
	}
	id, err := strconv.ParseUint(m.Subject[len(p.prefix):], 10, 64)
	if err != nil {
		return // not ours
	}
	e, ok := p.take(id)
	if !ok {
		return // timed out, or failed on a disconnect, earlier
	}
	e.call(m, nil)
}

// parseReply reads a JetStream publish acknowledgement. The server writes
// a success in one canonical form, which canonicalAck reads in place; any
// other body (an error, a domain, a batch, spaces) goes to segmentio/encoding,
// the protocol codec's library.
//
// Why a fast path: the dispatcher reads two acknowledgements per task. The
// library alone missed issue 18's CPU budget by about 2 us per task, and
// profiles put the library's acknowledgement reading at 2.8% of the
// dispatcher's CPU, and this scan at 1.3% (BenchmarkParseAck: 140 against
// 580 ns). FuzzParseReply holds the scan to encoding/json's reading.
func parseReply(m *nats.Msg) (*jetstream.PubAck, error) {
	if len(m.Data) == 0 {
		if m.Header.Get("Status") == "503" {
			return nil, ErrNoResponders
		}
		return nil, ErrInvalidAck
	}
	if ack, ok := canonicalAck(m.Data); ok {
		return ack, nil
	}
	var r struct {
		Error *jetstream.APIError `json:"error"`
		jetstream.PubAck
	}
	// The server writes these bodies, so encoding/json's stricter corners
	// (protocol/codec.go) do not matter.
	if err := fastjson.Unmarshal(m.Data, &r); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidAck, err)
	}
	if r.Error != nil {
		return nil, r.Error
	}
	if r.Stream == "" {
		return nil, ErrInvalidAck
	}
	return &r.PubAck, nil
}

// canonicalAck reads exactly what nats-server (2.15, stream.go) writes for
// a stored message: {"stream":"NAME","seq":N}, with ,"duplicate": true
// before the brace for a duplicate. NAME is printable ASCII without quote
// or backslash, N at most 19 digits without a leading zero. Anything else
// (a domain, a counter, a group commit's batch, which GroupCommit reads
// itself) is not ok, and goes to the library.
func canonicalAck(b []byte) (*jetstream.PubAck, bool) {
	const head, seq = `{"stream":"`, `","seq":`
	name, b, ok := cutQuoted(b, head, seq)
	if !ok {
		return nil, false
	}
	ack := &jetstream.PubAck{Stream: string(name)}
	if ack.Sequence, b, ok = cutNumber(b); !ok {
		return nil, false
	}
	switch string(b) {
	case "}":
	case `,"duplicate": true}`:
		ack.Duplicate = true
	default:
		return nil, false
	}
	return ack, true
}

// cutQuoted reads prefix, a non-empty run of printable ASCII without quote
// or backslash, and suffix from the start of b.
func cutQuoted(b []byte, prefix, suffix string) (s, rest []byte, ok bool) {
	if len(b) < len(prefix) || string(b[:len(prefix)]) != prefix {
		return nil, b, false
	}
	b = b[len(prefix):]
	n := 0
	for n < len(b) && b[n] >= 0x20 && b[n] < 0x7f && b[n] != '"' && b[n] != '\\' {
		n++
	}
	if n == 0 || len(b)-n < len(suffix) || string(b[n:n+len(suffix)]) != suffix {
		return nil, b, false
	}
	return b[:n], b[n+len(suffix):], true
}

// cutNumber reads an unsigned integer of 1-19 digits without a leading
// zero from the start of b.
func cutNumber(b []byte) (v uint64, rest []byte, ok bool) {
	d := 0
	for d < len(b) && d < 20 && b[d] >= '0' && b[d] <= '9' {
		v = v*10 + uint64(b[d]-'0')
		d++
	}
	if d == 0 || d > 19 || b[0] == '0' {
		return 0, b, false
	}
	return v, b[d:], true
}

// run fails publishes past their deadline, and every publish in flight when
// the connection drops (their acknowledgements would go to a subscription
// the server no longer has, or never come).
func (p *Publisher) run(done chan struct{}, status chan nats.Status) {
	defer p.loop.Done()
	t := time.NewTicker(max(p.cfg.Timeout/10, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case now := <-t.C:
			p.fail(func(e *entry) bool { return e.expires <= now.UnixNano() }, ErrTimeout)
		case _, ok := <-status:
			if !ok {
				status = nil
				continue
			}
			p.fail(func(*entry) bool { return true }, nats.ErrDisconnected)
		}
	}
}

// fail removes the entries match selects and calls their callbacks with err.
func (p *Publisher) fail(match func(*entry) bool, err error) {
	var failed []entry
	p.mu.Lock()
	for id, e := range p.pending {
		if match(&e) {
			delete(p.pending, id)
			p.releaseLocked()
			failed = append(failed, e)
		}
	}
	p.mu.Unlock()
	for _, e := range failed {
		e.call(nil, err)
	}
}

// Stop refuses new publishes, waits until every publish in flight is
// acknowledged or failed (at most Timeout, then fails the rest with
// ErrStopped), and unsubscribes.
func (p *Publisher) Stop() error {
	p.mu.Lock()
	if p.sub == nil || p.stopped {
		p.mu.Unlock()
		return nil
	}
	p.stopped = true
	drained := make(chan struct{})
	if len(p.pending) == 0 {
		close(drained)
	} else {
		p.drained = drained
	}
	p.mu.Unlock()
	select {
	case <-drained:
	case <-time.After(p.cfg.Timeout):
		p.fail(func(*entry) bool { return true }, ErrStopped)
	}
	close(p.done)
	p.loop.Wait()
	p.nc.RemoveStatusListener(p.status)
	p.mu.Lock()
	sub := p.sub
	p.sub, p.drained = nil, nil
	p.mu.Unlock()
	return sub.Unsubscribe()
}

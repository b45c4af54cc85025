// Package client is the Go SDK for mlsched producers: it submits tasks to the
// task stream and reads their final results from the results stream.
//
// A producer in another language needs nothing from this package: the wire
// protocol is plain JSON over NATS JetStream (docs/protocol.md). The SDK adds
// local validation (the same verdict the dispatcher would give), publishing
// with deduplication, and race-free waiting for one or many results.
package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/shared/natsconn"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// ErrNoResult is returned by Result when the task has no final result: not
// finished yet, unknown, or expired (finished before the results window,
// see Window); Wait and WaitAll wrap it with ctx's error when they give up.
var ErrNoResult = errors.New("no result yet")

// ErrBadResult wraps a message on a result subject that is not a Result.
var ErrBadResult = errors.New("malformed result")

// SubmitAck is the task stream's acknowledgement of a submission.
type SubmitAck struct {
	// Seq is the task's sequence in MLSCHED_TASKS (of the first copy when
	// Duplicate is set).
	Seq uint64
	// Duplicate is set when a task with the same Nats-Msg-Id was already
	// accepted within the stream's duplicate window: nothing new was queued.
	Duplicate bool
}

// Client submits tasks and reads results. It is safe for concurrent use.
type Client struct {
	js     jetstream.JetStream
	limits protocol.Limits
	topo   topology.Config

	nc *nats.Conn // set by Dial, closed by Close

	mu      sync.Mutex
	results jetstream.Stream // cached MLSCHED_RESULTS handle

	hubOnce sync.Once
	waits   *hub // Wait and WaitAll's shared results consumer (waiters.go)

	grouped bool        // WithGroupCommit
	gc      groupCommit // group.go
}

// Option configures a Client.
type Option func(*Client)

// WithLimits sets the limits Submit validates against (default
// protocol.DefaultLimits). Use the dispatcher's limits so that a task the
// SDK accepts is not rejected later.
func WithLimits(l protocol.Limits) Option { return func(c *Client) { c.limits = l } }

// WithTopology sets the stream configuration used when the client has to
// create missing streams (default topology.Config{}: file storage, one
// replica). It must match what the dispatcher uses, or the dispatcher will
// find the streams incompatible.
func WithTopology(tc topology.Config) Option { return func(c *Client) { c.topo = tc } }

// New returns a client publishing and reading through js.
func New(js jetstream.JetStream, opts ...Option) *Client {
	c := &Client{js: js}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Dial connects to NATS as a producer, with the credentials, TLS and
// servers of cfg and the producer role's inbox prefix unless cfg names one,
// and returns a client that Close disconnects. Every field cfg leaves empty
// is read from its MLSCHED_NATS_* variable, as the binaries do: with
// MLSCHED_NATS_URL set, Dial(natsconn.Config{}) dials it.
func Dial(cfg natsconn.Config, opts ...Option) (*Client, error) {
	cfg, err := cfg.WithEnv()
	if err != nil {
		return nil, err
	}
	nc, err := natsconn.Connect(cfg, natsconn.Conn{Name: "mlsched-producer", Inbox: natsconn.InboxProducer})
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	c := New(js, opts...)
	c.nc = nc
	return c, nil
}

// Close closes the connection Dial made, after flushing what is buffered;
// it does nothing for a client made with New.
func (c *Client) Close() {
	c.hub().close()
	c.gc.stop()
	if c.nc != nil {
		_ = c.nc.Drain()
	}
}

// Submit validates t locally, so a bad task fails here with the same
// *protocol.Error the dispatcher would put in a rejected result, then
// publishes it to topology.BandTaskSubject(t.Type, t.Priority) (its priority band) with Nats-Msg-Id t.ID: a
// re-submission within the duplicate window is acknowledged as Duplicate
// and not queued twice.
func (c *Client) Submit(ctx context.Context, t protocol.Task, opts ...SubmitOption) (SubmitAck, error) {
	data, err := c.encode(t)
	if err != nil {
		return SubmitAck{}, err
	}
	var so submitOptions
	for _, o := range opts {
		o(&so)
	}
	if so.traceparent != "" && !protocol.ValidTraceparent(so.traceparent) {
		return SubmitAck{}, fmt.Errorf("task %s: traceparent %q is not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)", t.ID, so.traceparent)
	}
	return c.publishMsg(ctx, topology.BandTaskSubject(t.Type, t.Priority), data, t.ID, so.traceparent)
}

// SubmitOption configures one Submit.
type SubmitOption func(*submitOptions)

type submitOptions struct{ traceparent string }

// WithTraceparent submits the task in the W3C trace context tp (the
// producer's current span, "00-<trace id>-<span id>-<flags>"). It travels in
// the task's Traceparent header through the dispatch and the outcome into
// the result's headers, and on to HTTP model servers; with
// MLSCHED_OTEL_ENDPOINT set, mlsched's spans are children of it.
func WithTraceparent(tp string) SubmitOption {
	return func(o *submitOptions) { o.traceparent = tp }
}

// encode validates and marshals a task, with the dispatcher's verdict.
func (c *Client) encode(t protocol.Task) ([]byte, error) {
	v := t // Validate clears an invalid ID; keep the caller's copy intact
	if err := v.Validate(c.limits); err != nil {
		return nil, err
	}
	data, err := json.Marshal(t)
	if err != nil {
		// The only way Marshal fails here is a Payload that is not JSON.
		return nil, protocol.Errorf(protocol.CodeMalformedJSON, "payload is not valid JSON: %v", err)
	}
	lim := c.limits
	if lim.MaxPayloadBytes <= 0 {
		lim.MaxPayloadBytes = protocol.DefaultLimits.MaxPayloadBytes
	}
	if len(data) > lim.MaxPayloadBytes {
		return nil, protocol.Errorf(protocol.CodePayloadTooLarge, "task is %d bytes, the limit is %d", len(data), lim.MaxPayloadBytes)
	}
	return data, nil
}

// SubmitRaw publishes data as a task of taskType without validating it, with
// Nats-Msg-Id msgID when msgID is not empty. It exists for tests and for
// bytes produced elsewhere; the dispatcher judges them.
func (c *Client) SubmitRaw(ctx context.Context, taskType string, data []byte, msgID string) (SubmitAck, error) {
	if err := protocol.ValidToken(taskType, 64); err != nil {
		return SubmitAck{}, protocol.Errorf(protocol.CodeInvalidType, "type %q: %v", taskType, err)
	}
	return c.publish(ctx, topology.TaskSubject(taskType), data, msgID)
}

func (c *Client) publish(ctx context.Context, subject string, data []byte, msgID string) (SubmitAck, error) {
	return c.publishMsg(ctx, subject, data, msgID, "")
}

func (c *Client) publishMsg(ctx context.Context, subject string, data []byte, msgID, traceparent string) (SubmitAck, error) {
	g, err := c.group(ctx)
	if err != nil {
		return SubmitAck{}, fmt.Errorf("submit to %s: %w", subject, err)
	}
	if g != nil {
		return publishGrouped(ctx, g, taskMsg(subject, data, traceparent), msgID)
	}
	opts := []jetstream.PublishOpt{jetstream.WithExpectStream(topology.StreamTasks)}
	if msgID != "" {
		opts = append(opts, jetstream.WithMsgID(msgID))
	}
	m := &nats.Msg{Subject: subject, Data: data}
	if traceparent != "" {
		m.Header = nats.Header{protocol.HdrTraceparent: {traceparent}}
	}
	ack, err := c.js.PublishMsg(ctx, m, opts...)
	if errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) {
		// Nobody created the streams yet: do it (idempotent) and retry once.
		if eerr := topology.Ensure(ctx, c.js, c.topo); eerr != nil {
			return SubmitAck{}, fmt.Errorf("submit to %s: %w (creating streams: %w)", subject, err, eerr)
		}
		ack, err = c.js.PublishMsg(ctx, m, opts...)
	}
	if err != nil {
		return SubmitAck{}, fmt.Errorf("submit to %s: %w", subject, err)
	}
	return SubmitAck{Seq: ack.Sequence, Duplicate: ack.Duplicate}, nil
}

// Result returns the task's final result, or ErrNoResult when there is none
// yet. It never blocks on the task.
func (c *Client) Result(ctx context.Context, id string) (*protocol.Result, error) {
	if err := c.checkID(id); err != nil {
		return nil, err
	}
	s, err := c.resultsStream(ctx)
	if err != nil {
		return nil, err
	}
	m, err := s.GetLastMsgForSubject(ctx, topology.ResultSubject(id))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, fmt.Errorf("task %s: %w", id, ErrNoResult)
	}
	if err != nil {
		return nil, fmt.Errorf("task %s: read result: %w", id, err)
	}
	return decodeResult(id, m.Data)
}

// Wait blocks until the task's final result exists and returns it, or
// returns ctx's error. A result published at any moment, before or during
// the call, is seen: the wait registers with the client's one shared
// results consumer (see hub) before it looks the result up in the stream.
// 10 000 concurrent Waits cost 10 000 map entries and direct gets, one
// consumer, and no JetStream API request each.
//
// A result is kept for the results window (MLSCHED_RESULTS_MAX_AGE and
// MLSCHED_RESULTS_MAX_MSGS, docs/operations.md): a task whose result
// expired before Wait began cannot be told from one not finished yet, so
// bound ctx; its error then wraps ErrNoResult and says so.
func (c *Client) Wait(ctx context.Context, id string) (*protocol.Result, error) {
	if err := c.checkID(id); err != nil {
		return nil, err
	}
	if d, ok := c.lookup(ctx, id); ok {
		return d.r, d.err // fast path: already there (or a real error)
	}
	h := c.hub()
	w := &waiter{id: id, ch: make(chan delivery, 2)}
	if err := h.register(ctx, []*waiter{w}); err != nil {
		return nil, fmt.Errorf("wait for %s: %w", id, err)
	}
	defer h.unregister([]*waiter{w})
	if d, ok := c.lookup(ctx, id); ok { // stored before the consumer began
		return d.r, d.err
	}
	select {
	case d := <-w.ch:
		return d.r, d.err
	case <-ctx.Done():
		return nil, fmt.Errorf("wait for %s: %w (%w: not finished, unknown, or expired before the wait began)", id, ctx.Err(), ErrNoResult)
	}
}

// WaitAll waits for the final result of every id and calls each once per id,
// in arrival order, from the calling goroutine. The ids register with the
// client's one shared results consumer (as Wait), then the results already
// stored are read by direct get, a few at a time: no consumer of its own.
// It returns nil once every id has been seen, or ctx's error (wrapped) with
// each already called for the results that arrived.
func (c *Client) WaitAll(ctx context.Context, ids []string, each func(*protocol.Result)) error {
	pending := make(map[string]struct{}, len(ids))
	for _, id := range ids {
		if err := c.checkID(id); err != nil {
			return err
		}
		pending[id] = struct{}{}
	}
	if len(pending) == 0 {
		return nil
	}
	ch := make(chan delivery, 2*len(pending))
	ws := make([]*waiter, 0, len(pending))
	for id := range pending {
		ws = append(ws, &waiter{id: id, ch: ch})
	}
	h := c.hub()
	if err := h.register(ctx, ws); err != nil {
		return fmt.Errorf("waiting for %d results: %w", len(pending), err)
	}
	defer h.unregister(ws)
	lctx, stopLookups := context.WithCancel(ctx)
	defer stopLookups()
	go func() { // the results stored before the consumer began
		jobs := make(chan string)
		var wg sync.WaitGroup
		for range min(lookupWorkers, len(ws)) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for id := range jobs {
					if d, ok := c.lookup(lctx, id); ok && lctx.Err() == nil {
						ch <- d
					}
				}
			}()
		}
		for _, w := range ws {
			select {
			case jobs <- w.id:
			case <-lctx.Done():
			}
		}
		close(jobs)
		wg.Wait()
	}()
	for len(pending) > 0 {
		select {
		case d := <-ch:
			if _, ok := pending[d.id]; !ok {
				continue // seen twice: delivered and looked up
			}
			if d.err != nil {
				return fmt.Errorf("waiting for %d of %d results: %w", len(pending), len(ids), d.err)
			}
			delete(pending, d.id)
			each(d.r)
		case <-ctx.Done():
			return fmt.Errorf("waiting for %d of %d results: %w (%w: not finished, unknown, or expired before the wait began)", len(pending), len(ids), ctx.Err(), ErrNoResult)
		}
	}
	return nil
}

// lookupWorkers is how many direct gets WaitAll has in flight at once.
const lookupWorkers = 8

// resultsStream returns the cached MLSCHED_RESULTS handle, creating the
// streams when they do not exist yet.
func (c *Client) resultsStream(ctx context.Context) (jetstream.Stream, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.results != nil {
		return c.results, nil
	}
	s, err := c.js.Stream(ctx, topology.StreamResults)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		if err = topology.Ensure(ctx, c.js, c.topo); err == nil {
			s, err = c.js.Stream(ctx, topology.StreamResults)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("results stream: %w", err)
	}
	c.results = s
	return s, nil
}

// checkID refuses ids that can never name a result subject.
func (c *Client) checkID(id string) error {
	maxLen := c.limits.MaxIDLen
	if maxLen <= 0 {
		maxLen = protocol.DefaultLimits.MaxIDLen
	}
	if err := protocol.ValidToken(id, maxLen); err != nil {
		return protocol.Errorf(protocol.CodeInvalidID, "id %q cannot have a result: %v", id, err)
	}
	return nil
}

// decodeResult decodes as json.Unmarshal would, in one pass
// (protocol.DecodeResult); r.Output shares data, the message's own bytes.
func decodeResult(id string, data []byte) (*protocol.Result, error) {
	r, err := protocol.DecodeResult(data)
	if err != nil {
		return nil, fmt.Errorf("result of %s: %w: %w", id, ErrBadResult, err)
	}
	return &r, nil
}

package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/shared/jsplumb"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// WithGroupCommit makes Submit and SubmitMany store the tasks submitted
// while the task stream is busy together, as one atomic batch written with
// one fsync (jsplumb.GroupCommit), when that stream is on disk and takes
// atomic batches (nats-server 2.12+). It pays for a producer submitting
// from many goroutines, or with SubmitMany, to a nats-server that fsyncs
// every write (sync_interval always, the production setting): there one
// server stores a few thousand messages a second one by one, and tens of
// thousands in batches. With a lazy sync_interval leave it off. Each task
// keeps its own acknowledgement, Nats-Msg-Id and Duplicate flag.
func WithGroupCommit(on bool) Option { return func(c *Client) { c.grouped = on } }

// groupCommit is the client's group commit, started on first use; nil when
// off or when the task stream cannot take batches.
type groupCommit struct {
	mu   sync.Mutex
	done bool // decided: g is what to use
	pub  *jsplumb.Publisher
	g    *jsplumb.GroupCommit
}

func (c *Client) group(ctx context.Context) (*jsplumb.GroupCommit, error) {
	if !c.grouped {
		return nil, nil
	}
	gc := &c.gc
	gc.mu.Lock()
	defer gc.mu.Unlock()
	if gc.done {
		return gc.g, nil
	}
	s, err := c.js.Stream(ctx, topology.StreamTasks)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		if err = topology.Ensure(ctx, c.js, c.topo); err == nil {
			s, err = c.js.Stream(ctx, topology.StreamTasks)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("task stream: %w", err)
	}
	gc.done = true
	if !topology.GroupCommits(s.CachedInfo()) {
		return nil, nil
	}
	gc.pub = jsplumb.NewPublisher(c.js.Conn(), jsplumb.PublisherConfig{MaxPending: 1024, Timeout: 10 * time.Second})
	if err := gc.pub.Start(ctx); err != nil {
		gc.done = false
		return nil, err
	}
	gc.g = jsplumb.NewGroupCommit(gc.pub, jsplumb.GroupCommitConfig{})
	if err := gc.g.Start(ctx); err != nil {
		_ = gc.pub.Stop()
		gc.done, gc.g = false, nil
		return nil, err
	}
	return gc.g, nil
}

// stop stops the group commit, once every task in it has its answer.
func (gc *groupCommit) stop() {
	gc.mu.Lock()
	defer gc.mu.Unlock()
	if gc.g != nil {
		_ = gc.g.Stop()
		_ = gc.pub.Stop()
		gc.g, gc.pub = nil, nil
	}
}

// taskMsg is a task's message as Submit publishes it: to the task stream
// only (Nats-Expected-Stream), with its traceparent.
func taskMsg(subject string, data []byte, traceparent string) *nats.Msg {
	m := &nats.Msg{Subject: subject, Data: data, Header: nats.Header{jetstream.ExpectedStreamHeader: {topology.StreamTasks}}}
	if traceparent != "" {
		m.Header[protocol.HdrTraceparent] = []string{traceparent}
	}
	return m
}

// publishGrouped publishes m through g and waits for its acknowledgement.
func publishGrouped(ctx context.Context, g *jsplumb.GroupCommit, m *nats.Msg, msgID string) (SubmitAck, error) {
	type answer struct {
		ack *jetstream.PubAck
		err error
	}
	ch := make(chan answer, 1)
	if err := g.Publish(ctx, m, msgID, func(ack *jetstream.PubAck, err error) { ch <- answer{ack, err} }); err != nil {
		return SubmitAck{}, fmt.Errorf("submit to %s: %w", m.Subject, err)
	}
	select {
	case a := <-ch:
		if a.err != nil {
			return SubmitAck{}, fmt.Errorf("submit to %s: %w", m.Subject, a.err)
		}
		return SubmitAck{Seq: a.ack.Sequence, Duplicate: a.ack.Duplicate}, nil
	case <-ctx.Done():
		return SubmitAck{}, fmt.Errorf("submit to %s: %w", m.Subject, ctx.Err())
	}
}

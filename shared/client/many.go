package client

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/shared/jsplumb"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// DefaultWindow is how many submissions SubmitMany keeps unacknowledged.
const DefaultWindow = 256

// SubmitMany submits tasks like Submit, but pipelined: up to window publishes
// (DefaultWindow when window <= 0) await their acknowledgement at once, so a
// batch of thousands costs little more than its bytes. It returns one ack
// and one error per task, in order: errs[i] is nil when tasks[i] was
// accepted (possibly as a duplicate). Invalid tasks fail locally and do not
// stop the others. When ctx ends, the tasks not yet acknowledged get ctx's
// error; they may or may not have been queued, and re-submitting them is
// safe (Nats-Msg-Id).
func (c *Client) SubmitMany(ctx context.Context, tasks []protocol.Task, window int) ([]SubmitAck, []error) {
	if window <= 0 {
		window = DefaultWindow
	}
	acks := make([]SubmitAck, len(tasks))
	errs := make([]error, len(tasks))
	if len(tasks) == 0 {
		return acks, errs
	}
	if err := c.ensureTasksStream(ctx); err != nil {
		for i := range errs {
			errs[i] = err
		}
		return acks, errs
	}
	if g, err := c.group(ctx); err != nil || g != nil {
		for i := range errs {
			errs[i] = err
		}
		if g != nil {
			c.submitGrouped(ctx, g, tasks, window, acks, errs)
		}
		return acks, errs
	}
	type inflight struct {
		i   int
		fut jetstream.PubAckFuture
	}
	queue := make([]inflight, 0, window)
	settle := func(f inflight) {
		subj := topology.BandTaskSubject(tasks[f.i].Type, tasks[f.i].Priority)
		select {
		case ack := <-f.fut.Ok():
			acks[f.i] = SubmitAck{Seq: ack.Sequence, Duplicate: ack.Duplicate}
		case err := <-f.fut.Err():
			errs[f.i] = fmt.Errorf("submit to %s: %w", subj, err)
		case <-ctx.Done():
			errs[f.i] = fmt.Errorf("submit to %s: %w", subj, ctx.Err())
		}
	}
	for i, t := range tasks {
		if len(queue) == window {
			settle(queue[0])
			queue = queue[1:]
		}
		if ctx.Err() != nil {
			errs[i] = ctx.Err()
			continue
		}
		data, err := c.encode(t)
		if err != nil {
			errs[i] = err
			continue
		}
		m := &nats.Msg{Subject: topology.BandTaskSubject(t.Type, t.Priority), Data: data, Header: nats.Header{}}
		fut, err := c.js.PublishMsgAsync(m, jetstream.WithMsgID(t.ID), jetstream.WithExpectStream(topology.StreamTasks))
		if err != nil {
			errs[i] = fmt.Errorf("submit to %s: %w", m.Subject, err)
			continue
		}
		queue = append(queue, inflight{i, fut})
	}
	for _, f := range queue {
		settle(f)
	}
	return acks, errs
}

// submitGrouped is SubmitMany through the group commit: up to window tasks
// await their acknowledgement at once, as one or a few batches.
func (c *Client) submitGrouped(ctx context.Context, g *jsplumb.GroupCommit, tasks []protocol.Task, window int, acks []SubmitAck, errs []error) {
	var wg sync.WaitGroup
	room := make(chan struct{}, window)
	for i, t := range tasks {
		select {
		case room <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			errs[i] = ctx.Err()
			continue
		}
		data, err := c.encode(t)
		if err != nil {
			errs[i] = err
			<-room
			continue
		}
		m := taskMsg(topology.BandTaskSubject(t.Type, t.Priority), data, "")
		wg.Add(1)
		err = g.Publish(ctx, m, t.ID, func(ack *jetstream.PubAck, err error) {
			if err != nil {
				errs[i] = fmt.Errorf("submit to %s: %w", m.Subject, err)
			} else {
				acks[i] = SubmitAck{Seq: ack.Sequence, Duplicate: ack.Duplicate}
			}
			<-room
			wg.Done()
		})
		if err != nil {
			errs[i] = fmt.Errorf("submit to %s: %w", m.Subject, err)
			<-room
			wg.Done()
		}
	}
	wg.Wait() // every callback comes, at the latest at the publisher's timeout
}

// ensureTasksStream creates the streams when the task stream is missing, so
// that asynchronous publishes do not fail one by one.
func (c *Client) ensureTasksStream(ctx context.Context) error {
	_, err := c.js.Stream(ctx, topology.StreamTasks)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		err = topology.Ensure(ctx, c.js, c.topo)
	}
	if err != nil {
		return fmt.Errorf("task stream: %w", err)
	}
	return nil
}

package bench

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/shared/jsplumb"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// taskType is the type of every benchmark task.
const taskType = "bench"

// publisher submits a phase's tasks the way the producer SDK does (one
// message on mlsched.tasks.<type> with Nats-Msg-Id = id) but with
// asynchronous publishes, so that one goroutine can offer tens of thousands
// of tasks per second.
type publisher struct {
	js      jetstream.JetStream
	payload string // a JSON value of the requested size
	// group, when set, publishes the tasks instead: what is published while
	// the task stream is busy is stored as one atomic batch, one fsync
	// (jsplumb.GroupCommit), as the SDK's SubmitMany does.
	group *jsplumb.GroupCommit
	// at, when set, is each task's offset from the start of the phase
	// (a trace replay), instead of a fixed rate; sizes their sizes.
	at    []time.Duration
	sizes []float64
	// deadlineLo and deadlineHi, when hi > 0, give each task a deadline_ms
	// drawn in that range (Options.Deadlines).
	deadlineLo, deadlineHi int
}

// groupCommit makes p publish through a group commit on nc when the task
// stream is on disk and takes atomic batches, until the returned stop.
func (p *publisher) groupCommit(ctx context.Context, nc *nats.Conn) (stop func(), err error) {
	s, err := p.js.Stream(ctx, topology.StreamTasks)
	if err != nil {
		return nil, err
	}
	if !topology.GroupCommits(s.CachedInfo()) {
		return func() {}, nil
	}
	pub := jsplumb.NewPublisher(nc, jsplumb.PublisherConfig{MaxPending: 4096, Timeout: time.Minute})
	if err := pub.Start(ctx); err != nil {
		return nil, err
	}
	p.group = jsplumb.NewGroupCommit(pub, jsplumb.GroupCommitConfig{MaxWaiting: 4096})
	if err := p.group.Start(ctx); err != nil {
		_ = pub.Stop()
		return nil, err
	}
	return func() { _ = p.group.Stop(); _ = pub.Stop(); p.group = nil }, nil
}

func newPublisher(js jetstream.JetStream, payloadBytes int) *publisher {
	n := max(payloadBytes-2, 0) // the quotes of a JSON string count
	return &publisher{js: js, payload: `"` + strings.Repeat("x", n) + `"`}
}

func (p *publisher) body(id string) []byte {
	if p.deadlineHi > 0 {
		// uniform in [lo, hi] ms, drawn from the id: the same task has the
		// same deadline in every scenario of a run
		ms := deadlineOf(id, p.deadlineLo, p.deadlineHi)
		return []byte(`{"id":"` + id + `","type":"` + taskType + `","deadline_ms":` + strconv.Itoa(ms) + `,"payload":` + p.payload + `}`)
	}
	return []byte(`{"id":"` + id + `","type":"` + taskType + `","payload":` + p.payload + `}`)
}

// deadlineOf is the deadline_ms task id gets, uniform in [lo, hi].
func deadlineOf(id string, lo, hi int) int {
	h := fnv.New64a()
	h.Write([]byte(id))
	return lo + int(h.Sum64()%uint64(hi-lo+1))
}

type inflight struct {
	fut jetstream.PubAckFuture
	msg *nats.Msg
}

// run publishes every task of tr, at rate tasks/s when rate > 0 and as fast
// as JetStream acknowledges otherwise, and returns once every publish is
// acknowledged. A publish that fails is retried synchronously (the
// Nats-Msg-Id makes that safe).
func (p *publisher) run(ctx context.Context, tr *tracker, rate int) error {
	if p.group != nil {
		return p.runGrouped(ctx, tr, rate)
	}
	futs := make(chan inflight, 4096)
	var (
		wg      sync.WaitGroup
		failMu  sync.Mutex
		failErr error
	)
	// settle waits until every future seen so far is resolved; it is called
	// once, on every return path.
	var settleOnce sync.Once
	settle := func() { settleOnce.Do(func() { close(futs); wg.Wait() }) }
	defer settle()
	wg.Add(1)
	go func() {
		defer wg.Done()
		for f := range futs {
			select {
			case <-f.fut.Ok():
				continue
			case err := <-f.fut.Err():
				if err = p.retry(ctx, f.msg, err); err != nil {
					failMu.Lock()
					failErr = errors.Join(failErr, err)
					failMu.Unlock()
				}
			}
		}
	}()

	start := time.Now()
	for i := range tr.sent {
		p.pace(start, i, rate)
		msg := p.message(tr, i)
		for {
			fut, err := p.js.PublishMsgAsync(msg)
			if err == nil {
				futs <- inflight{fut: fut, msg: msg}
				break
			}
			if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
				return fmt.Errorf("publish %s: %w", tr.id(i), err)
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
		}
	}
	select {
	case <-p.js.PublishAsyncComplete():
	case <-ctx.Done():
		return ctx.Err()
	}
	settle()
	failMu.Lock()
	defer failMu.Unlock()
	return failErr
}

// runGrouped is run through the group commit: every task's callback is
// awaited, and a failed publish is retried synchronously.
func (p *publisher) runGrouped(ctx context.Context, tr *tracker, rate int) error {
	var (
		wg      sync.WaitGroup
		failMu  sync.Mutex
		failErr error
	)
	start := time.Now()
	for i := range tr.sent {
		p.pace(start, i, rate)
		msg := p.message(tr, i)
		id := tr.id(i)
		wg.Add(1)
		err := p.group.Publish(ctx, msg, "", func(_ *jetstream.PubAck, err error) {
			if err == nil {
				wg.Done()
				return
			}
			go func() { // never block the reply goroutine
				defer wg.Done()
				again := &nats.Msg{Subject: msg.Subject, Data: msg.Data, Header: nats.Header{protocol.HdrMsgID: []string{id}}}
				if err := p.retry(ctx, again, err); err != nil {
					failMu.Lock()
					failErr = errors.Join(failErr, err)
					failMu.Unlock()
				}
			}()
		})
		if err != nil {
			wg.Done()
			wg.Wait()
			return fmt.Errorf("publish %s: %w", id, err)
		}
	}
	wg.Wait()
	failMu.Lock()
	defer failMu.Unlock()
	return failErr
}

// pace sleeps until task i is due: at its offset in a trace replay, else
// at rate.
func (p *publisher) pace(start time.Time, i, rate int) {
	if p.at != nil {
		if ahead := time.Until(start.Add(p.at[i])); ahead >= time.Millisecond {
			time.Sleep(ahead)
		}
		return
	}
	pace(start, i, rate)
}

// pace sleeps until task i is due at rate tasks/s from start (rate 0: at
// once), only when ahead by a millisecond or more.
func pace(start time.Time, i, rate int) {
	if rate <= 0 {
		return
	}
	target := start.Add(time.Duration(int64(i) * int64(time.Second) / int64(rate)))
	if ahead := time.Until(target); ahead >= time.Millisecond {
		time.Sleep(ahead)
	}
}

// message is task i's message (Nats-Msg-Id = its id), its send time noted.
func (p *publisher) message(tr *tracker, i int) *nats.Msg {
	id := tr.id(i)
	tr.sent[i].Store(time.Now().UnixNano())
	data := p.body(id)
	if p.sizes != nil && p.sizes[i] > 0 {
		data = []byte(`{"id":"` + id + `","type":"` + taskType + `","size":` + strconv.FormatFloat(p.sizes[i], 'g', -1, 64) + `,"payload":` + p.payload + `}`)
	}
	return &nats.Msg{Subject: topology.TaskSubject(taskType), Data: data, Header: nats.Header{protocol.HdrMsgID: []string{id}}}
}

func (p *publisher) retry(ctx context.Context, msg *nats.Msg, first error) error {
	err := first
	for try := 0; try < 3 && ctx.Err() == nil; try++ {
		if _, err = p.js.PublishMsg(ctx, msg); err == nil {
			return nil
		}
	}
	return fmt.Errorf("publish %s: %w (first: %v)", msg.Header.Get(protocol.HdrMsgID), err, first)
}

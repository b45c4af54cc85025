package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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
}

func newPublisher(js jetstream.JetStream, payloadBytes int) *publisher {
	n := max(payloadBytes-2, 0) // the quotes of a JSON string count
	return &publisher{js: js, payload: `"` + strings.Repeat("x", n) + `"`}
}

func (p *publisher) body(id string) []byte {
	return []byte(`{"id":"` + id + `","type":"` + taskType + `","payload":` + p.payload + `}`)
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
	subject := topology.TaskSubject(taskType)
	for i := range tr.sent {
		if rate > 0 { // pace: sleep only when ahead by a millisecond or more
			target := start.Add(time.Duration(int64(i) * int64(time.Second) / int64(rate)))
			if ahead := time.Until(target); ahead >= time.Millisecond {
				time.Sleep(ahead)
			}
		}
		id := tr.id(i)
		msg := &nats.Msg{Subject: subject, Data: p.body(id), Header: nats.Header{protocol.HdrMsgID: []string{id}}}
		tr.sent[i].Store(time.Now().UnixNano())
		for {
			fut, err := p.js.PublishMsgAsync(msg)
			if err == nil {
				futs <- inflight{fut: fut, msg: msg}
				break
			}
			if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
				return fmt.Errorf("publish %s: %w", id, err)
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

func (p *publisher) retry(ctx context.Context, msg *nats.Msg, first error) error {
	err := first
	for try := 0; try < 3 && ctx.Err() == nil; try++ {
		if _, err = p.js.PublishMsg(ctx, msg); err == nil {
			return nil
		}
	}
	return fmt.Errorf("publish %s: %w (first: %v)", msg.Header.Get(protocol.HdrMsgID), err, first)
}

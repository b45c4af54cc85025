package intake

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/dispatcher/internal/admission"
	"github.com/mlsched/mlsched/shared/lifecycle"
)

// Redelivered tasks. A task delivered again (its replica died, the server
// restarted, its ack was lost) may already have its result: the ack of the
// task was lost with the replica that stored it. Intake looks it up in
// MLSCHED_RESULTS before dispatching it again. That lookup is a round trip
// to the server, up to lookupTimeout when the server is slow, and after a
// crash every message a band's consumer had in flight comes back at once.
// Done on the consumer's callback goroutine, the band's new tasks would
// wait behind them one lookup at a time (issue 39: a redelivery storm
// stalls its band). So the lookups run here, off that goroutine, at most
// redeliveryLookups at once; the callback returns at once and the band's
// next message, redelivered or new, is taken without waiting. How many
// checks wait is bounded by the band consumers' MaxAckPending: each holds
// an unacknowledged message.

// redeliveryLookups bounds the concurrent result lookups of one replica.
const redeliveryLookups = 32

// lookupTimeout bounds one result lookup.
const lookupTimeout = 5 * time.Second

// redeliveries runs the result lookups of redelivered tasks.
type redeliveries struct {
	slots chan struct{}
	wg    sync.WaitGroup

	mu      sync.Mutex
	ctx     context.Context // the service's: cancelled when it stops
	stopped bool
}

func newRedeliveries() *redeliveries {
	return &redeliveries{slots: make(chan struct{}, redeliveryLookups), ctx: context.Background()}
}

// check looks the task up off the caller's goroutine: found says whether
// its result is stored; then runs with the answer. With the service
// stopping (or stopped), giveBack runs instead: the message is handed back
// for another replica.
func (r *redeliveries) check(lookup func(ctx context.Context) bool, then func(found bool), giveBack func()) {
	r.mu.Lock()
	if r.stopped {
		r.mu.Unlock()
		giveBack()
		return
	}
	ctx := r.ctx
	r.wg.Add(1)
	r.mu.Unlock()
	go func() {
		defer r.wg.Done()
		select {
		case r.slots <- struct{}{}:
		case <-ctx.Done():
			giveBack()
			return
		}
		lctx, cancel := context.WithTimeout(ctx, lookupTimeout)
		found := lookup(lctx)
		cancel()
		<-r.slots
		if ctx.Err() != nil {
			giveBack()
			return
		}
		then(found)
	}()
}

// service runs the checks as a component: stopping, it waits for the
// checks under way (a lookup is cut short and its message handed back).
func (r *redeliveries) service() lifecycle.Service {
	return lifecycle.Run(func(ctx context.Context, ready func()) error {
		r.mu.Lock()
		r.ctx, r.stopped = ctx, false
		r.mu.Unlock()
		ready()
		<-ctx.Done()
		r.mu.Lock()
		r.stopped = true
		r.mu.Unlock()
		r.wg.Wait()
		return nil
	})
}

// redelivered is a task delivered before (or parked and back): dispatch it
// unless its result is stored, which the lookup off the consumer's
// goroutine tells (hasResult: false when the lookup fails, dispatching
// again is harmless, the second result is refused).
func (in *Stage) redelivered(msg jetstream.Msg, a admission.Attempt, o taskOrigin) {
	in.redeliver.check(
		func(ctx context.Context) bool { return in.Fin.HasResult(ctx, a.Task.ID) },
		func(found bool) {
			if found {
				in.Fin.End(a.EndsStored(msg))
				return
			}
			if rec, ok := in.Superseded.LostAttempt(a.Task.ID, a.Submission); ok {
				in.resumeLost(msg, a, o, rec) // lost.go
				return
			}
			in.enter(msg, a, o)
		},
		func() { in.Complete.Retry(msg, 0) })
}

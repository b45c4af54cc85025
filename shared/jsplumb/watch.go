// Follow follows a JetStream key-value bucket: the one watch loop
// behind the dispatcher's node registry and its superseded-attempt set.

package jsplumb

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// FollowOptions tune Follow. The zero value follows the bucket for ever, with no
// ticks, retrying a failed watch after a second.
type FollowOptions struct {
	// Silence, when set, re-creates the watch after that long without an
	// update. A watch resumes at its old stream sequence, so after the
	// bucket is re-created (a memory bucket does not survive a NATS
	// restart) it would skip every entry until the new sequence caught up;
	// set it for a bucket written more often than Silence.
	Silence time.Duration
	// Tick, when set, calls OnTick that often while following.
	Tick   time.Duration
	OnTick func()
	// Retry is the wait before re-creating a watch that failed (default 1s).
	Retry time.Duration
	Log   zerolog.Logger
}

// Follow watches every key of kv until ctx ends, handing each entry, in
// order, to apply (deletes and purges included), and calls ready once the
// bucket's current contents have been applied the first time. It returns
// when ctx ends.
func Follow(ctx context.Context, kv jetstream.KeyValue, apply func(jetstream.KeyValueEntry), ready func(), o FollowOptions) {
	if o.Retry <= 0 {
		o.Retry = time.Second
	}
	var tick <-chan time.Time
	every := o.Tick
	if every <= 0 && o.Silence > 0 {
		every = o.Silence / 4
	}
	if every > 0 {
		t := time.NewTicker(every)
		defer t.Stop()
		tick = t.C
	}
	isReady := false
	for ctx.Err() == nil {
		w, err := kv.WatchAll(ctx)
		if err != nil {
			o.Log.Warn().Err(err).Str("bucket", kv.Bucket()).Msg("watch failed, retrying")
			select {
			case <-ctx.Done():
			case <-time.After(o.Retry):
			}
			continue
		}
		last := time.Now()
	follow:
		for {
			select {
			case <-ctx.Done():
				break follow
			case <-tick:
				if o.OnTick != nil {
					o.OnTick()
				}
				if o.Silence > 0 && time.Since(last) > o.Silence {
					break follow // a fresh watch reads the bucket as it is
				}
			case e, ok := <-w.Updates():
				if !ok {
					break follow
				}
				last = time.Now()
				if e == nil { // the current contents are delivered
					if !isReady && ready != nil {
						ready()
					}
					isReady = true
					continue
				}
				apply(e)
			}
		}
		_ = w.Stop()
	}
}

package worker

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/shared/jsplumb"
	"github.com/mlsched/mlsched/shared/topology"
)

// How a worker waits for a topology it may not create.
const (
	// topologyAttempt bounds one creation or lookup.
	topologyAttempt = 10 * time.Second
	// topologyPoll is how often a waiting worker looks for the stream.
	topologyPoll = time.Second
	// topologyRecreate is how often a waiting worker tries to create it
	// again, for a server where the creation failed for another reason.
	topologyRecreate = 30 * time.Second
)

// awaitTopology makes sure every stream and the nodes bucket exist, as
// topology.Ensure does, and returns the bucket. On an open server the worker
// creates what is missing. On its node key (`mlsched auth init`) it may not:
// the server refuses the creation, which the client sees only as a timeout.
// Compose starts processes in any order, so the worker then waits, saying
// so, until a dispatcher has created it; a dispatcher starting later finds
// the worker serving within a second. An incompatible stream, or any error
// that is not a refusal or a timeout, is returned at once.
func (w *Worker) awaitTopology(ctx context.Context, js jetstream.JetStream) (jetstream.KeyValue, error) {
	cfg := w.topology()
	for _, sc := range topology.Streams(cfg) {
		err := w.awaitCreated(ctx, "stream "+sc.Name,
			func(ctx context.Context) error { _, err := topology.EnsureStream(ctx, js, sc); return err },
			func(ctx context.Context) error { _, err := js.Stream(ctx, sc.Name); return err })
		if err != nil {
			return nil, err
		}
	}
	var kv jetstream.KeyValue
	err := w.awaitCreated(ctx, "bucket "+topology.BucketNodes,
		func(ctx context.Context) (err error) { kv, err = topology.EnsureNodesBucket(ctx, js, cfg); return err },
		func(ctx context.Context) error { _, err := js.KeyValue(ctx, topology.BucketNodes); return err })
	return kv, err
}

// awaitCreated runs ensure (look up, create when missing) until it
// succeeds. After a failure that may pass (a refusal looks like a timeout)
// it logs once that it waits for the dispatcher, looks the thing up every
// topologyPoll with lookup, runs ensure again as soon as it exists, and
// tries to create it again every topologyRecreate.
func (w *Worker) awaitCreated(ctx context.Context, what string, ensure, lookup func(context.Context) error) error {
	attempt := func(f func(context.Context) error) error {
		actx, cancel := context.WithTimeout(ctx, topologyAttempt)
		defer cancel()
		return f(actx)
	}
	var lastEnsure time.Time
	waiting := false
	for {
		if lastEnsure.IsZero() || time.Since(lastEnsure) >= topologyRecreate {
			lastEnsure = time.Now()
			err := attempt(ensure)
			switch {
			case err == nil:
				if waiting {
					w.log.Info().Msgf("%s exists now", what)
				}
				return nil
			case ctx.Err() != nil:
				return ctx.Err()
			case !jsplumb.Transient(err):
				return err
			case !waiting:
				waiting = true
				w.log.Warn().Err(err).Msgf("waiting for the dispatcher to create %s: this node's key may not create it (or JetStream is unavailable); looking for it every %s", what, topologyPoll)
			}
		} else {
			err := attempt(lookup)
			switch {
			case err == nil:
				lastEnsure = time.Time{} // it exists: check it now
				continue
			case ctx.Err() != nil:
				return ctx.Err()
			case !jsplumb.Transient(err) && !errors.Is(err, jetstream.ErrStreamNotFound) && !errors.Is(err, jetstream.ErrBucketNotFound):
				return err
			}
		}
		t := time.NewTimer(topologyPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

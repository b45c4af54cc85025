// Retry retries the JetStream requests a process makes while it
// starts (creating streams, buckets and consumers) as long as JetStream is
// briefly unavailable: on a cluster, during a leader election (a server
// killed, paused or partitioned) the meta leader answers 503 "JetStream
// system temporarily unavailable", or nobody answers in time. A process
// (re)started at that moment must wait, not exit: the chaos-cluster run found
// a worker exiting. Any other error, such as an incompatible stream, is
// returned at once.

package jsplumb

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// Backoff between attempts, and the bound of one attempt.
const (
	retryMin = 250 * time.Millisecond
	retryMax = 5 * time.Second
	// attemptTimeout bounds one attempt, so that a request to a
	// server that stopped answering is retried (elsewhere) instead of
	// hanging until ctx ends.
	attemptTimeout = 10 * time.Second
	// placementGrace is how long "no suitable peers for placement" is
	// waited out: a cluster that is forming, or has a server restarting,
	// has too few peers for a moment; one that never has enough (R3 asked
	// of a single server) is a configuration error, returned after this.
	placementGrace = time.Minute
)

// errCodeNoPeers is JetStream's "no suitable peers for placement".
const errCodeNoPeers = 10005

// noPeers reports whether err is "no suitable peers for placement".
func noPeers(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeNoPeers
}

// Transient reports whether err may go away by itself: JetStream
// unavailable (HTTP-like 5xx from the API), no responders, a timeout.
func Transient(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.Code >= 500 {
		return true
	}
	return errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoHeartbeat) ||
		errors.Is(err, nats.ErrConnectionReconnecting) || errors.Is(err, nats.ErrDisconnected)
}

// Retry runs step until it succeeds, fails for good (not Transient), or ctx
// ends (then it returns step's last error). Each attempt gets its own
// deadline; every retry is logged as a warning naming what.
func Retry(ctx context.Context, log zerolog.Logger, what string, step func(ctx context.Context) error) error {
	wait := retryMin
	start := time.Now()
	for {
		actx, cancel := context.WithTimeout(ctx, attemptTimeout)
		err := step(actx)
		cancel()
		if err == nil || ctx.Err() != nil {
			return err
		}
		if !Transient(err) && !(noPeers(err) && time.Since(start) < placementGrace) {
			return err
		}
		log.Warn().Err(err).Dur("retry_in", wait).Msgf("%s: JetStream unavailable, retrying", what)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		wait = min(2*wait, retryMax)
	}
}

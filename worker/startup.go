package worker

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// Start-up steps that talk to JetStream are retried while JetStream is
// briefly unavailable: on a cluster, during a leader election (a server
// killed, paused or partitioned) the meta leader answers 503 "JetStream
// system temporarily unavailable", or nobody answers in time. A worker
// restarted at that moment must wait, not exit (the chaos-cluster run found
// it exiting). Any other error, such as an incompatible stream, stops it.
const (
	startRetryMin = 250 * time.Millisecond
	startRetryMax = 5 * time.Second
	// startAttemptTimeout bounds one attempt, so that a request to a
	// server that stopped answering is retried (elsewhere) instead of
	// hanging until ctx ends.
	startAttemptTimeout = 10 * time.Second
)

// transientJetStream reports whether err may go away by itself: JetStream
// unavailable (HTTP-like 5xx from the API), no responders, a timeout.
func transientJetStream(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.Code >= 500 {
		return true
	}
	return errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoHeartbeat) ||
		errors.Is(err, nats.ErrConnectionReconnecting) || errors.Is(err, nats.ErrDisconnected)
}

// retryStart runs step until it succeeds, fails for good, or ctx ends
// (then it returns step's last error).
func retryStart(ctx context.Context, log zerolog.Logger, what string, step func(ctx context.Context) error) error {
	wait := startRetryMin
	for {
		actx, cancel := context.WithTimeout(ctx, startAttemptTimeout)
		err := step(actx)
		cancel()
		if err == nil || !transientJetStream(err) || ctx.Err() != nil {
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
		wait = min(2*wait, startRetryMax)
	}
}

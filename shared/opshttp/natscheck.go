package opshttp

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// NATSChecks are the readiness checks every mlsched process shares: "nats"
// (the connection is up) and "streams" (each named stream exists, one
// stream-info request each).
func NATSChecks(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, streams ...string) []Check {
	var natsErr, streamsErr error
	if s := nc.Status(); s != nats.CONNECTED {
		natsErr = fmt.Errorf("connection is %s", s)
		streamsErr = errors.New("not checked: NATS is not connected")
	} else {
		for _, name := range streams {
			if _, err := js.Stream(ctx, name); err != nil {
				streamsErr = fmt.Errorf("stream %s: %w", name, err)
				break
			}
		}
	}
	return []Check{{Name: "nats", Err: natsErr}, {Name: "streams", Err: streamsErr}}
}

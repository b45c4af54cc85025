//go:build tools

// This file keeps the nats-server module required by e2e/go.mod, so that
// `make build` can build bin/nats-server at the pinned version and the
// harness can run it as a real process.
package e2e

import _ "github.com/nats-io/nats-server/v2"

package worker

import "time"

// Consumer tuning. A pull waits consumerExpiry for messages with idle
// heartbeats every consumerHeartbeat; the consumer's existence is checked
// every consumerCheck (and at once when the client reports a problem), so a
// consumer deleted under the node is recreated within seconds.
var (
	consumerExpiry    = 10 * time.Second
	consumerHeartbeat = 2 * time.Second
	consumerCheck     = 2 * time.Second
)

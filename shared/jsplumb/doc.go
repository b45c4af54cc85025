// Package jsplumb is mlsched's JetStream plumbing, shared by the
// dispatcher and the worker:
//
//   - Publisher (publisher.go): asynchronous publishing with a callback per
//     acknowledgement, and Request for a core-NATS request answered the
//     same way (a direct report);
//   - Completer (completer.go): publish-then-ack, the one place a consumed
//     message is acked, nak'ed or kept in progress once what handling it
//     published is stored;
//   - Consumer (consumer.go): the self-healing durable pull consumer;
//   - Retry (retry.go): retrying start-up requests while JetStream is
//     briefly unavailable;
//   - Follow (watch.go): the watch loop of a key-value bucket.
package jsplumb

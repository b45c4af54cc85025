// Package protocol defines mlsched's wire protocol v1: the task a producer
// submits, the dispatch and outcome messages exchanged inside the cluster,
// the node heartbeat, and the final result. It also decodes and validates
// tasks, returning *Error values whose Code a caller can switch on.
//
// Everything here is plain JSON so that a producer in any language can speak
// it with an ordinary NATS client; see docs/protocol.md.
package protocol

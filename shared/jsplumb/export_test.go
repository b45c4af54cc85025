package jsplumb

// ParseReply is parseReply, for the tests.
var ParseReply = parseReply

// CanonicalAck is canonicalAck, for the tests.
var CanonicalAck = canonicalAck

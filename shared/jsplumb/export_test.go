package jsplumb

// ParseReply is parseReply, for the tests.
var ParseReply = parseReply

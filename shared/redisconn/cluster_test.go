package redisconn

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/redis/go-redis/v9"
)

// What makes a Redis Cluster client re-read the slot map: a node gone, not
// a reply of a working node.
func TestNodeFailure(t *testing.T) {
	t.Parallel()
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	for _, c := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{redis.Nil, false},
		{errors.New("NOSCRIPT No matching script"), false},
		{errors.New("ERR Error running script"), false},
		{context.Canceled, false},
		{context.DeadlineExceeded, false},
		{fmt.Errorf("wait: %w", context.DeadlineExceeded), false},
		{&net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, true},
		{refused, true},
		{fmt.Errorf("record: %w", refused), true},
		{io.EOF, true},
		{io.ErrUnexpectedEOF, true},
		{errors.New("CLUSTERDOWN The cluster is down"), true},
	} {
		if got := nodeFailure(c.err); got != c.want {
			t.Errorf("nodeFailure(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

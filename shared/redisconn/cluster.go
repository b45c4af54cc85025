package redisconn

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"

	"github.com/redis/go-redis/v9"
)

// newClusterClient is a Redis Cluster client that re-reads the slot map as
// soon as a node fails, instead of on its periodic reload.
//
// go-redis reloads the slot map after a MOVED or READONLY reply and
// otherwise every ClusterStateReloadInterval (60 s by default in v9.23). A
// killed or unreachable master sends neither, so after its replica took the
// slots over the client kept dialling the dead address for up to a minute:
// TestClusterFailoverKeepsStatistics (dispatcher/stats/redisstats) saw every
// statistics write refused long after the failover had completed. Asking
// for a reload on each connection error (go-redis coalesces them, at most
// one every 200 ms) makes the client follow the failover within one retry of
// it.
func newClusterClient(o *redis.ClusterOptions) *redis.ClusterClient {
	c := redis.NewClusterClient(o)
	c.AddHook(reloadOnNodeFailure{c})
	return c
}

type reloadOnNodeFailure struct{ c *redis.ClusterClient }

func (h reloadOnNodeFailure) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h reloadOnNodeFailure) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.check(ctx, err)
		return err
	}
}

func (h reloadOnNodeFailure) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		h.check(ctx, err)
		return err
	}
}

func (h reloadOnNodeFailure) check(ctx context.Context, err error) {
	if nodeFailure(err) {
		h.c.ReloadState(ctx)
	}
}

// nodeFailure reports whether err says a node is gone or the cluster is
// reconfiguring: a network error, a connection closed under the command, or
// CLUSTERDOWN (a slot without a master while a replica takes over). Replies
// of a working node (script errors, NOSCRIPT, nil) are not.
func nodeFailure(err error) bool {
	if err == nil || errors.Is(err, redis.Nil) {
		return false
	}
	var oe *net.OpError
	if errors.As(err, &oe) {
		return true
	}
	// The caller's deadline is a net.Error too, but says nothing of a node.
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		strings.HasPrefix(err.Error(), "CLUSTERDOWN")
}

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"
)

// runProxy is `dispatcher proxy LISTEN TARGET`: it forwards every TCP
// connection accepted on LISTEN to TARGET, a host:port resolved again for
// each connection. Compose runs it as the single-replica "dashboard"
// service, TARGET dispatcher:9090: Docker's DNS answers that name with
// every dispatcher replica alive at the time, so the documented address
// (127.0.0.1:9090, published by that service) keeps answering whatever the
// dispatcher service's scale, however often its containers are re-created
// (each replica's dashboard merges every replica's view, so any one
// serves). A replica that refuses is skipped: the dialer tries each address
// the name resolves to in turn.
func runProxy(args []string) int {
	if len(args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: dispatcher proxy LISTEN TARGET   e.g. dispatcher proxy :9090 dispatcher:9090")
		return 2
	}
	ln, err := net.Listen("tcp", args[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, "dispatcher proxy:", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		<-ctx.Done()
		_ = ln.Close()
	}()
	fmt.Fprintf(os.Stderr, "dispatcher proxy: forwarding %s to %s\n", ln.Addr(), args[1])
	if err := forward(ctx, ln, args[1], os.Stderr); err != nil && ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, "dispatcher proxy:", err)
		return 1
	}
	return 0
}

// forward accepts connections on ln until it is closed and copies each,
// both ways, to a new connection to target. A target that cannot be
// reached closes the client's connection and is reported on logw, at most
// once every ten seconds.
func forward(ctx context.Context, ln net.Listener, target string, logw io.Writer) error {
	d := net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	var (
		mu       sync.Mutex
		reported time.Time
	)
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("accept on %s: %w", ln.Addr(), err)
		}
		go func() {
			defer c.Close()
			up, err := d.DialContext(ctx, "tcp", target)
			if err != nil {
				mu.Lock()
				if time.Since(reported) > 10*time.Second {
					reported = time.Now()
					fmt.Fprintf(logw, "dispatcher proxy: %s: %v\n", target, err)
				}
				mu.Unlock()
				return
			}
			defer up.Close()
			done := make(chan struct{}, 2)
			pipe := func(dst, src net.Conn) {
				_, _ = io.Copy(dst, src)
				if tc, ok := dst.(*net.TCPConn); ok {
					_ = tc.CloseWrite() // the other way may still be sending
				}
				done <- struct{}{}
			}
			go pipe(up, c)
			go pipe(c, up)
			<-done
			<-done
		}()
	}
}

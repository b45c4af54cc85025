package relay

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/shared/natsconn"
)

// Main is the relay process (`mlsched-bench relay -nats URL -nodes a,b
// [-nkey FILE]`): it relays until SIGTERM or SIGINT and returns the exit
// code. The benchmark starts it as a process of its own, as the dispatcher
// is.
func Main(args []string) int {
	fs := flag.NewFlagSet("mlsched-bench relay", flag.ContinueOnError)
	url := fs.String("nats", "", "NATS server URL (required)")
	nodes := fs.String("nodes", "", "comma-separated node ids (required)")
	nkey := fs.String("nkey", "", "nkey seed file to connect with (the benchmark gives the dispatcher's: the same grants)")
	maxInFlight := fs.Int("max-in-flight", 1024, "republished tasks awaiting their JetStream ack (the dispatcher's default)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *url == "" || *nodes == "" {
		fmt.Fprintln(os.Stderr, "relay: -nats and -nodes are required")
		return 2
	}
	var opts []nats.Option
	if *nkey != "" {
		o, err := nats.NkeyOptionFromSeed(*nkey)
		if err != nil {
			fmt.Fprintln(os.Stderr, "relay:", err)
			return 2
		}
		// The dispatcher's reply prefix: its key may receive nothing else.
		opts = append(opts, o, nats.CustomInboxPrefix(natsconn.InboxDispatcher))
	}
	nc, err := nats.Connect(*url, append(opts, nats.Name("mlsched-bench-relay"), nats.MaxReconnects(-1))...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "relay:", err)
		return 1
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(*maxInFlight),
		jetstream.WithPublishAsyncTimeout(10*time.Second))
	if err != nil {
		fmt.Fprintln(os.Stderr, "relay:", err)
		return 1
	}
	r, err := New(js, Config{Nodes: strings.Split(*nodes, ","), MaxInFlight: *maxInFlight})
	if err != nil {
		fmt.Fprintln(os.Stderr, "relay:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = r.Start(sctx)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "relay:", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "relay: relaying to %s\n", *nodes)
	<-ctx.Done()
	r.Stop()
	fmt.Fprintf(os.Stderr, "relay: stopped after %d tasks (%d failed republishes)\n", r.Relayed(), r.Failed())
	return 0
}

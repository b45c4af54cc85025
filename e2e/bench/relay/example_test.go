package relay_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/e2e/bench/relay"
	"github.com/mlsched/mlsched/shared/natstest"
	"github.com/mlsched/mlsched/shared/topology"
)

// A relay moving tasks from MLSCHED_TASKS to two nodes' sinks, on an
// embedded server.
func Example() {
	srv, err := natstest.Start("") // temporary store, removed at shutdown
	if err != nil {
		panic(err)
	}
	defer srv.Shutdown()
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		panic(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(1024))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	r, _ := relay.New(js, relay.Config{Nodes: []string{"n1", "n2"}})
	if err := r.Start(ctx); err != nil { // creates the streams and the consumer
		panic(err)
	}
	var got atomic.Int64
	all := make(chan struct{})
	onMsg := func(jetstream.Msg) {
		if got.Add(1) == 10 {
			close(all)
		}
	}
	for _, node := range []string{"n1", "n2"} {
		s, _ := relay.NewSink(js, relay.SinkConfig{Node: node, OnMsg: onMsg})
		if err := s.Start(ctx); err != nil {
			panic(err)
		}
		defer s.Stop()
	}
	for i := range 10 {
		body := fmt.Sprintf(`{"id":"t%d","type":"bench"}`, i)
		if _, err := js.Publish(ctx, topology.TaskSubject("bench"), []byte(body)); err != nil {
			panic(err)
		}
	}
	select {
	case <-all:
	case <-ctx.Done():
	}
	r.Stop()
	fmt.Println("sinks received", got.Load(), "tasks; relayed", r.Relayed())
	// Output: sinks received 10 tasks; relayed 10
}

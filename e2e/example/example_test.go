// Package example_test is the shortest honest program that runs mlsched: a
// dispatcher and a worker in one process, through their public APIs, on an
// embedded NATS server. It lives in the e2e module because the dispatcher
// module does not depend on the worker module.
package example_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/mlsched/mlsched/dispatcher"
	"github.com/mlsched/mlsched/shared/client"
	"github.com/mlsched/mlsched/shared/natsconn"
	"github.com/mlsched/mlsched/shared/natstest"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/worker"
	"github.com/mlsched/mlsched/worker/model"
)

// A producer submits a task; the dispatcher picks the model and the node;
// the worker runs it; the producer reads the one final result.
func Example() {
	srv, err := natstest.Start("") // NATS with JetStream, in memory, on a free port
	if err != nil {
		panic(err)
	}
	defer srv.Shutdown()
	nats := natsconn.Config{URL: srv.ClientURL()}

	// The dispatcher: statistics in memory (set RedisURL to share them
	// between replicas), every other setting at its default.
	dcfg := dispatcher.DefaultConfig()
	dcfg.NATS, dcfg.HTTPAddr = nats, "off"
	d, err := dispatcher.New(dcfg)
	if err != nil {
		panic(err)
	}

	// A worker node hosting one model: an in-process Go handler.
	w, err := worker.New(worker.Config{NATS: nats, NodeID: "node-1", HTTPAddr: "off"},
		worker.WithHandler("upper", func(ctx context.Context, t worker.Task) (any, error) {
			var s string
			if err := json.Unmarshal(t.Payload, &s); err != nil {
				return nil, &worker.TaskError{Msg: "payload must be a string", Err: err}
			}
			return strings.ToUpper(s), nil
		}),
		worker.WithModels([]worker.ModelSpec{{Name: "upper-v1", Types: []string{"text"},
			Executor: model.ExecutorGo, Go: &model.GoSpec{Handler: "upper"}}}))
	if err != nil {
		panic(err)
	}

	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 2)
	go func() { done <- d.Run(ctx) }()
	go func() { done <- w.Run(ctx) }()

	// A producer.
	c, err := client.Dial(nats)
	if err != nil {
		panic(err)
	}
	defer c.Close()
	wait, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := c.Submit(wait, protocol.Task{ID: "t-1", Type: "text", Payload: json.RawMessage(`"hello"`)}); err != nil {
		panic(err)
	}
	res, err := c.Wait(wait, "t-1")
	if err != nil {
		panic(err)
	}
	fmt.Println(res.Status, res.Model, res.Node, string(res.Output))

	stop() // both drain and stop
	fmt.Println(<-done, <-done)
	// Output:
	// succeeded upper-v1 node-1 "HELLO"
	// <nil> <nil>
}

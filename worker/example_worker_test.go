package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/shared/natsconn"
	"github.com/mlsched/mlsched/shared/natstest"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
	"github.com/mlsched/mlsched/worker"
	"github.com/mlsched/mlsched/worker/model"
)

// A node hosting an in-process Go model. The example plays the dispatcher:
// it sends one dispatch to the node and reads the outcome.
func Example() {
	srv, err := natstest.Start("") // an embedded NATS server, for the example
	if err != nil {
		panic(err)
	}
	defer srv.Shutdown()

	w, err := worker.New(worker.Config{NATS: natsconn.Config{URL: srv.ClientURL()}, NodeID: "gpu-1"},
		worker.WithLogger(zerolog.Nop()),
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
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()

	// The dispatcher's side.
	nc, _ := nats.Connect(srv.ClientURL())
	defer nc.Close()
	js, _ := jetstream.New(nc)
	_ = topology.Ensure(ctx, js, topology.Config{})
	outcomes, _ := js.CreateOrUpdateConsumer(ctx, topology.StreamOutcomes, jetstream.ConsumerConfig{
		Durable: "example", FilterSubject: topology.OutcomeSubject("gpu-1"), AckPolicy: jetstream.AckExplicitPolicy})
	attempt := protocol.Dispatch{TaskID: "t-1", Type: "text", Model: "upper-v1", Node: "gpu-1",
		Attempt: 1, MaxAttempts: 1, Deadline: time.Now().Add(time.Minute), Timeout: 5 * time.Second}
	m := &nats.Msg{Subject: topology.DispatchSubject("gpu-1"), Header: attempt.Header(),
		Data: []byte(`{"id":"t-1","type":"text","payload":"hello"}`)}
	if _, err := js.PublishMsg(ctx, m); err != nil {
		panic(err)
	}
	batch, _ := outcomes.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
	for msg := range batch.Messages() {
		var o protocol.Outcome
		_ = json.Unmarshal(msg.Data(), &o)
		fmt.Println(o.TaskID, o.Status, o.Node, string(o.Output))
		_ = msg.Ack()
	}

	stop() // drains the node
	fmt.Println("run:", <-done)
	// Output:
	// t-1 success gpu-1 "HELLO"
	// run: <nil>
}

package client_test

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/shared/client"
	"github.com/mlsched/mlsched/shared/natstest"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// A producer submits a task and waits for its one final result. Here the
// test plays the dispatcher and publishes the result by hand.
func Example() {
	srv, err := natstest.Start("")
	if err != nil {
		panic(err)
	}
	defer srv.Shutdown()
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		panic(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	c := client.New(js)
	ack, err := c.Submit(ctx, protocol.Task{
		ID: "invoice-42", Type: "ocr", Payload: json.RawMessage(`{"url":"s3://bucket/42.png"}`),
		TimeoutMs: 2000, MaxAttempts: 3,
	})
	if err != nil {
		panic(err)
	}
	fmt.Println("queued at", ack.Seq, "duplicate:", ack.Duplicate)

	// A second submission of the same id is deduplicated by the stream.
	again, _ := c.Submit(ctx, protocol.Task{ID: "invoice-42", Type: "ocr"})
	fmt.Println("resubmitted, duplicate:", again.Duplicate)

	// Local validation gives the code the dispatcher would reject with.
	_, err = c.Submit(ctx, protocol.Task{ID: "no.dots", Type: "ocr"})
	fmt.Println("invalid:", protocol.CodeOf(err))

	// The dispatcher's side, simplified.
	res, _ := json.Marshal(protocol.Result{ID: "invoice-42", Type: "ocr", Status: protocol.StatusSucceeded,
		Model: "tesseract", Attempts: 1, Output: json.RawMessage(`{"total":12.5}`)})
	if _, err := js.Publish(ctx, topology.ResultSubject("invoice-42"), res); err != nil {
		panic(err)
	}

	r, err := c.Wait(ctx, "invoice-42")
	if err != nil {
		panic(err)
	}
	fmt.Println(r.Status, r.Model, string(r.Output))
	// Output:
	// queued at 1 duplicate: false
	// resubmitted, duplicate: true
	// invalid: invalid_id
	// succeeded tesseract {"total":12.5}
}

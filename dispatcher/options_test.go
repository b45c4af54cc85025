package dispatcher_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mlsched/mlsched/dispatcher"
	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/shared/natstest"
)

// WithConn and WithStore embed a dispatcher in a program that already holds
// a NATS connection and a statistics store: the dispatcher runs on them
// (its own URL leads nowhere), reports the store's kind, and leaves the
// connection open for its owner when it stops.
func TestWithConnAndWithStore(t *testing.T) {
	ns := natstest.New(t)
	nc, err := nats.Connect(ns.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	store := stats.NewMemory(stats.Window{})
	cfg := testConfig("nats://127.0.0.1:1") // nothing listens there
	d, err := dispatcher.New(cfg, dispatcher.WithConn(nc), dispatcher.WithStore(store, "given"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()

	deadline := time.Now().Add(20 * time.Second)
	for !d.Ready(ctx).Ready() {
		if time.Now().After(deadline) {
			t.Fatalf("not ready on the given connection: %+v", d.Ready(ctx))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if d.Store() != store {
		t.Errorf("Store() is %T %p, not the given store %p", d.Store(), d.Store(), store)
	}
	if got := d.Report().Store; got != "given" {
		t.Errorf("the stats report names store %q, want the given kind %q", got, "given")
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the dispatcher did not stop")
	}
	if nc.IsClosed() {
		t.Fatal("the dispatcher closed the connection it was given")
	}
	if err := nc.Flush(); err != nil {
		t.Fatalf("the given connection no longer works: %v", err)
	}
}

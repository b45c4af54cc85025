package dispatcher_test

import (
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
	t.Cleanup(nc.Close)
	// Cleanups run last first: this one after runDispatcher's has stopped
	// the dispatcher (and checked that it stopped cleanly), before nc.Close.
	t.Cleanup(func() {
		if nc.IsClosed() {
			t.Error("the dispatcher closed the connection it was given")
		} else if err := nc.Flush(); err != nil {
			t.Errorf("the given connection no longer works: %v", err)
		}
	})
	store := stats.NewMemory(stats.Window{})
	cfg := testConfig("nats://127.0.0.1:1") // nothing listens there
	d, ctx := runDispatcher(t, cfg, dispatcher.WithConn(nc), dispatcher.WithStore(store, "given"))

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
}

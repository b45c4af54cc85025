package jsplumb_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/shared/jsplumb"
	"github.com/mlsched/mlsched/shared/natstest"
	"github.com/mlsched/mlsched/shared/topology"
)

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The consumer is deleted under it: it re-creates it and goes on; a
// consumer of that name with another configuration stops Start.
func TestConsumerHealsAndRefusesIncompatible(t *testing.T) {
	t.Parallel()
	ns := natstest.New(t)
	ctx := context.Background()
	s, err := ns.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}})
	if err != nil {
		t.Fatal(err)
	}
	var got atomic.Int64
	c := &jsplumb.Consumer{JS: ns.JS, Stream: "S", Log: zerolog.Nop(), Check: 100 * time.Millisecond,
		Config: jetstream.ConsumerConfig{Durable: "d", AckPolicy: jetstream.AckExplicitPolicy},
		Handle: func(m jetstream.Msg) { got.Add(1); _ = m.Ack() }}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	<-c.Started()
	publish := func() {
		if _, err := ns.JS.Publish(ctx, "s.x", nil); err != nil {
			t.Fatal(err)
		}
	}
	publish()
	waitFor(t, "the first message", func() bool { return got.Load() == 1 })
	if err := s.DeleteConsumer(ctx, "d"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the consumer re-created", func() bool { _, err := s.Consumer(ctx, "d"); return err == nil })
	publish()
	waitFor(t, "a message after the re-creation", func() bool { return got.Load() >= 2 })
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}

	other := &jsplumb.Consumer{JS: ns.JS, Stream: "S", Log: zerolog.Nop(), Handle: func(jetstream.Msg) {},
		Config: jetstream.ConsumerConfig{Durable: "d", AckPolicy: jetstream.AckNonePolicy}}
	if err := other.Start(ctx); !errors.Is(err, topology.ErrIncompatible) {
		t.Fatalf("start on an incompatible consumer: %v", err)
	}
}

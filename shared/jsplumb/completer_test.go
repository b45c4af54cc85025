package jsplumb_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/shared/jsplumb"
	"github.com/mlsched/mlsched/shared/natstest"
)

// The Completer acks a consumed message once its publish is stored, naks
// it when the publish failed, keeps one in progress, and Wait waits for
// slow follow-ups.
func TestCompleterPublishThenAck(t *testing.T) {
	t.Parallel()
	ns := natstest.New(t)
	ctx := context.Background()
	in, err := ns.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "IN", Subjects: []string{"in.>"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ns.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "OUT", Subjects: []string{"out.>"}}); err != nil {
		t.Fatal(err)
	}
	cons, err := in.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"ok", "fails", "slow", "kept"} {
		if _, err := ns.JS.Publish(ctx, "in."+s, nil); err != nil {
			t.Fatal(err)
		}
	}
	batch, err := cons.Fetch(4, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	msgs := map[string]jetstream.Msg{}
	for m := range batch.Messages() {
		msgs[m.Subject()] = m
	}
	if len(msgs) != 4 {
		t.Fatalf("fetched %d", len(msgs))
	}

	pub := start(t, ns.NC, jsplumb.PublisherConfig{Timeout: 10 * time.Second})
	var settled atomic.Int64
	c := &jsplumb.Completer{Settled: func() { settled.Add(1) }}
	var okAck atomic.Bool
	if err := c.Publish(ctx, pub, msgs["in.ok"], &nats.Msg{Subject: "out.ok"}, "", func(ack *jetstream.PubAck, err error) error {
		okAck.Store(err == nil && ack.Stream == "OUT")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	refused := &nats.Msg{Subject: "out.x", Header: nats.Header{jetstream.ExpectedLastSubjSeqHeader: []string{"99"}}}
	if err := c.Publish(ctx, pub, msgs["in.fails"], refused, "", func(_ *jetstream.PubAck, err error) error {
		if err == nil {
			return errors.New("the publish should have been refused")
		}
		return err // nak: redelivered
	}); err != nil {
		t.Fatal(err)
	}
	release, slowDone := make(chan struct{}), make(chan struct{})
	if err := c.PublishSlow(ctx, pub, msgs["in.slow"], &nats.Msg{Subject: "out.slow"}, "", func(*jetstream.PubAck, error) error {
		<-release
		close(slowDone)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	waited := make(chan struct{})
	go func() { c.Wait(); close(waited) }()
	select {
	case <-waited:
		t.Fatal("Wait returned before the slow follow-up was released")
	case <-time.After(50 * time.Millisecond): // not synchronisation: a chance for a wrong Wait to return
	}
	close(release)
	<-waited
	select {
	case <-slowDone:
	default:
		t.Fatal("Wait returned before the slow follow-up ended")
	}
	if !okAck.Load() {
		t.Fatal("the ok publish was not acknowledged by OUT")
	}
	// Kept in progress past its ack wait: not redelivered meanwhile.
	for range 4 {
		time.Sleep(time.Second) // the ack wait must pass: time is what is tested
		c.Progress(msgs["in.kept"])
	}
	c.Settle(msgs["in.kept"], nil)

	again, err := cons.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for m := range again.Messages() {
		meta, _ := m.Metadata()
		if m.Subject() != "in.fails" || meta.NumDelivered != 2 {
			t.Fatalf("redelivered %s (delivery %d), want in.fails", m.Subject(), meta.NumDelivered)
		}
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := settled.Load(); n != 3 {
		t.Fatalf("Settled ran %d times, want 3 (the publishes' messages)", n)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := cons.Info(ctx)
		if err == nil && info.NumAckPending == 0 && info.NumPending == 0 {
			break // ok, slow and kept were acked
		}
		if time.Now().After(deadline) {
			t.Fatalf("consumer after settling: %+v %v", info, err)
		}
		time.Sleep(10 * time.Millisecond) // polling, not synchronisation
	}
}

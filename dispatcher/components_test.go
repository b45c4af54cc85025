package dispatcher

// Each component alone, on a real NATS server, without a Dispatcher.

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/dispatcher/internal/finish"
	"github.com/mlsched/mlsched/shared/natstest"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

func within(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func streamMsgs(t *testing.T, ctx context.Context, s jetstream.Stream) []*jetstream.RawStreamMsg {
	t.Helper()
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		if m, err := s.GetMsg(ctx, seq); err == nil {
			out = append(out, m)
		}
	}
	return out
}

// The sweeper reads each stored dispatch once it is older than the slack,
// keeps it in its heap until due, then reports it lost (or dead-letters it
// when invalid, or drops it when acked or already final) and deletes it.
func TestSweeperCursorAndHeap(t *testing.T) {
	t.Parallel()
	ns := natstest.New(t)
	ctx := context.Background()
	if err := topology.Ensure(ctx, ns.JS, topology.Config{}); err != nil {
		t.Fatal(err)
	}
	stream := func(name string) jetstream.Stream {
		s, err := ns.JS.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	dispatches, results, outcomes, dlq := stream(topology.StreamDispatch), stream(topology.StreamResults),
		stream(topology.StreamOutcomes), stream(topology.StreamDLQ)
	sw := &sweeper{js: ns.JS, dispatch: dispatches, results: results, every: 100 * time.Millisecond, slack: time.Second,
		dlq: &finish.DeadLetters{JS: ns.JS, Log: zerolog.Nop(), Count: new(atomic.Int64)}, log: zerolog.Nop()}

	send := func(id string, deadline time.Time, valid bool) uint64 {
		pd := protocol.Dispatch{TaskID: id, Type: "x", Model: "m", Node: "n1", Attempt: 1, MaxAttempts: 2, Deadline: deadline, Submission: "7"}
		m := &nats.Msg{Subject: topology.DispatchSubject("n1"), Data: []byte(`{"id":"` + id + `","type":"x"}`), Header: pd.Header()}
		if !valid {
			m.Header = nil
		}
		ack, err := ns.JS.PublishMsg(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		return ack.Sequence
	}
	past, future := time.Now().Add(-time.Minute), time.Now().Add(time.Hour)
	send("later", future, true)
	send("lost", past, true)
	send("bad", time.Time{}, false)
	send("final", past, true)
	acked := send("acked", past, true)
	if _, err := ns.JS.Publish(ctx, topology.ResultSubject("final"), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}

	// Younger than the slack: nothing is read.
	if n, err := sw.sweep(ctx, time.Now()); n != 0 || err != nil || sw.due.Len() != 0 || sw.next != 1 {
		t.Fatalf("young sweep: %d %v, heap %d, cursor %d", n, err, sw.due.Len(), sw.next)
	}
	if err := dispatches.DeleteMsg(ctx, acked); err != nil { // its worker acks it
		t.Fatal(err)
	}
	now := time.Now().Add(2 * time.Second)
	n, err := sw.sweep(ctx, now)
	if err != nil || n != 3 { // lost, bad, final; acked is gone
		t.Fatalf("sweep: %d %v", n, err)
	}
	if sw.due.Len() != 1 || sw.next != acked+1 {
		t.Fatalf("heap %d (want the later one), cursor %d (want %d)", sw.due.Len(), sw.next, acked+1)
	}
	left := streamMsgs(t, ctx, dispatches)
	if len(left) != 1 || left[0].Header.Get(protocol.HdrTaskID) != "later" {
		t.Fatalf("stored dispatches after the sweep: %d", len(left))
	}
	reports := streamMsgs(t, ctx, outcomes)
	if len(reports) != 1 {
		t.Fatalf("%d outcomes, want the lost one's", len(reports))
	}
	var o protocol.Outcome
	_ = json.Unmarshal(reports[0].Data, &o)
	pd, err := protocol.ParseDispatch(reports[0].Header)
	if o.TaskID != "lost" || o.Status != protocol.OutcomeLost || err != nil || pd.TaskID != "lost" ||
		reports[0].Header.Get(protocol.HdrMsgID) != "l:lost:7:1" {
		t.Fatalf("lost report %+v, headers %v (%v)", o, reports[0].Header, err)
	}
	dls := streamMsgs(t, ctx, dlq)
	var dl protocol.DeadLetter
	if len(dls) == 1 {
		_ = json.Unmarshal(dls[0].Data, &dl)
	}
	if len(dls) != 1 || dl.Code != protocol.CodeInvalidDispatch || dls[0].Header.Get(protocol.HdrMsgID) == "" {
		t.Fatalf("dead letters %d: %+v", len(dls), dl)
	}

	// Nothing new: no read, the later one stays in the heap.
	if n, err := sw.sweep(ctx, now); n != 0 || err != nil || sw.due.Len() != 1 {
		t.Fatalf("idle sweep: %d %v, heap %d", n, err, sw.due.Len())
	}
	// A re-created stream starts the cursor over.
	if err := ns.JS.DeleteStream(ctx, topology.StreamDispatch); err != nil {
		t.Fatal(err)
	}
	if err := topology.Ensure(ctx, ns.JS, topology.Config{}); err != nil {
		t.Fatal(err)
	}
	sw.dispatch = stream(topology.StreamDispatch)
	send("again", past, true)
	if n, err := sw.sweep(ctx, now); n != 1 || err != nil || sw.due.Len() != 0 {
		t.Fatalf("sweep of the re-created stream: %d %v, heap %d", n, err, sw.due.Len())
	}
}

// A mark made by one replica's set reaches another's through the bucket.
func TestSupersededSetAcrossReplicas(t *testing.T) {
	t.Parallel()
	ns := natstest.New(t)
	ctx := context.Background()
	kv, err := topology.EnsureSupersededBucket(ctx, ns.JS, topology.Config{})
	if err != nil {
		t.Fatal(err)
	}
	a, b := newSupersededSet(kv, zerolog.Nop()), newSupersededSet(kv, zerolog.Nop())
	a.Mark("t.1", "5", 2) // before b starts: b loads it
	for _, s := range []*supersededSet{a, b} {
		if err := s.Start(ctx); err != nil {
			t.Fatal(err)
		}
		<-s.Started() // the bucket's contents are loaded
		t.Cleanup(func() {
			if err := s.Stop(); err != nil {
				t.Error(err)
			}
		})
	}
	if !b.Is("t.1", "5", 1) || !b.Is("t.1", "5", 2) || b.Is("t.1", "5", 3) || b.Is("t.1", "6", 1) {
		t.Fatal("b does not see a's mark as it was")
	}
	if err := b.Cancel(ctx, "t.2", "9"); err != nil {
		t.Fatal(err)
	}
	within(t, "a sees b's cancellation", func() bool { return a.Cancelled("t.2", "9") })
	if a.Cancelled("t.1", "5") {
		t.Fatal("a superseded attempt is not a cancellation")
	}
}

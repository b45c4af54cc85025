package jsplumb_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/shared/jsplumb"
	"github.com/mlsched/mlsched/shared/natstest"
)

// groupCommit returns a group commit over a started publisher on s, with a
// file stream "G" on g.> (atomic publishes allowed when atomic).
func groupCommit(t *testing.T, s *natstest.Server, atomic bool, cfg jsplumb.GroupCommitConfig) *jsplumb.GroupCommit {
	t.Helper()
	if _, err := s.JS.CreateStream(context.Background(), jetstream.StreamConfig{Name: "G", Subjects: []string{"g.>"},
		Storage: jetstream.FileStorage, AllowAtomicPublish: atomic, MaxMsgsPerSubject: 1}); err != nil {
		t.Fatal(err)
	}
	pub := start(t, s.NC, jsplumb.PublisherConfig{})
	g := jsplumb.NewGroupCommit(pub, cfg)
	t.Cleanup(func() { _ = g.Stop() })
	return g
}

// stored reads the message at seq of stream G.
func stored(t *testing.T, s *natstest.Server, seq uint64) *jetstream.RawStreamMsg {
	t.Helper()
	st, err := s.JS.Stream(context.Background(), "G")
	if err != nil {
		t.Fatal(err)
	}
	m, err := st.GetMsg(context.Background(), seq)
	if err != nil {
		t.Fatalf("seq %d: %v", seq, err)
	}
	return m
}

// Messages queued before Start go as batches; each callback gets its own
// message's sequence, which the stream holds with that message's data.
func TestGroupCommitStoresEachMessageOnce(t *testing.T) {
	s := natstest.New(t)
	g := groupCommit(t, s, true, jsplumb.GroupCommitConfig{MaxBatch: 100})
	const n = 450
	chs := make([]chan result, n)
	for i := range n {
		ch, cb := collect(1)
		chs[i] = ch
		if err := g.Publish(context.Background(), &nats.Msg{Subject: "g." + strconv.Itoa(i), Data: []byte("m" + strconv.Itoa(i))}, "", cb); err != nil {
			t.Fatal(err)
		}
	}
	if err := g.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	seen := map[uint64]bool{}
	for i, ch := range chs {
		r := wait(t, ch)
		if r.err != nil {
			t.Fatalf("message %d: %v", i, r.err)
		}
		if r.ack.Stream != "G" || seen[r.ack.Sequence] {
			t.Fatalf("message %d: ack %+v (sequence seen before: %v)", i, r.ack, seen[r.ack.Sequence])
		}
		seen[r.ack.Sequence] = true
		if m := stored(t, s, r.ack.Sequence); m.Subject != "g."+strconv.Itoa(i) || string(m.Data) != "m"+strconv.Itoa(i) {
			t.Fatalf("message %d: sequence %d holds %s %q", i, r.ack.Sequence, m.Subject, m.Data)
		}
		if i == n-1 {
			t.Logf("stored headers: %v", stored(t, s, r.ack.Sequence).Header)
		}
	}
	batches, msgs := g.Stats()
	// The first batch takes 100; while a batch is in flight, up to Solo
	// messages go alone beside it.
	if batches < 3 || msgs < n/2 || msgs > n {
		t.Fatalf("%d batches carrying %d messages, want at least 3 carrying at least %d of %d", batches, msgs, n/2, n)
	}
	info, err := s.JS.Stream(context.Background(), "G")
	if err != nil {
		t.Fatal(err)
	}
	if got := info.CachedInfo().State.Msgs; got != n {
		t.Fatalf("stream holds %d messages, want %d", got, n)
	}
}

// A batch the stream refuses (one message's id is a duplicate, another's
// expected sequence fails) is stored not at all; its messages then go
// alone and each gets the verdict it would have had alone.
func TestGroupCommitRefusedBatchGoesAlone(t *testing.T) {
	s := natstest.New(t)
	ctx := context.Background()
	g := groupCommit(t, s, true, jsplumb.GroupCommitConfig{})
	if _, err := s.JS.Publish(ctx, "g.taken", []byte("first"), jetstream.WithMsgID("dup")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.JS.Publish(ctx, "g.result", []byte("first result")); err != nil {
		t.Fatal(err)
	}
	const n = 40
	chs := make([]chan result, n)
	for i := range n {
		ch, cb := collect(1)
		chs[i] = ch
		m := &nats.Msg{Subject: fmt.Sprintf("g.%d", i), Data: []byte("m"), Header: nats.Header{}}
		id := fmt.Sprintf("id-%d", i)
		switch i {
		case 7: // a duplicate of a stored message's id
			m.Subject, id = "g.taken", "dup"
		case 19: // a second result: refused by its expected sequence
			m.Subject = "g.result"
			m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, "0")
		}
		if err := g.Publish(ctx, m, id, cb); err != nil {
			t.Fatal(err)
		}
	}
	if err := g.Start(ctx); err != nil {
		t.Fatal(err)
	}
	for i, ch := range chs {
		r := wait(t, ch)
		switch i {
		case 7:
			if r.err != nil || !r.ack.Duplicate {
				t.Fatalf("the duplicate: ack %+v err %v, want a duplicate acknowledgement", r.ack, r.err)
			}
		case 19:
			var apiErr *jetstream.APIError
			if !errors.As(r.err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence {
				t.Fatalf("the second result: err %v, want wrong last sequence", r.err)
			}
		default:
			if r.err != nil || r.ack.Duplicate {
				t.Fatalf("message %d: ack %+v err %v", i, r.ack, r.err)
			}
		}
	}
	if batches, _ := g.Stats(); batches != 1 {
		t.Fatalf("%d batches sent, want the one refused", batches)
	}
	st, _ := s.JS.Stream(ctx, "G")
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := uint64(2 + n - 2); info.State.Msgs != want {
		t.Fatalf("stream holds %d messages, want %d (each stored once)", info.State.Msgs, want)
	}
	if m := stored(t, s, 2); string(m.Data) != "first result" {
		t.Fatalf("the first result became %q", m.Data)
	}
}

// On a stream without atomic publishes the first batch is refused: its
// messages and every later one go alone.
func TestGroupCommitWithoutAtomicStream(t *testing.T) {
	s := natstest.New(t)
	ctx := context.Background()
	g := groupCommit(t, s, false, jsplumb.GroupCommitConfig{})
	var chs []chan result
	publish := func(k int) {
		for i := range k {
			ch, cb := collect(1)
			chs = append(chs, ch)
			if err := g.Publish(ctx, &nats.Msg{Subject: fmt.Sprintf("g.%d.%d", len(chs), i), Data: []byte("m")}, "", cb); err != nil {
				t.Fatal(err)
			}
		}
	}
	publish(50)
	if err := g.Start(ctx); err != nil {
		t.Fatal(err)
	}
	for _, ch := range chs {
		if r := wait(t, ch); r.err != nil {
			t.Fatal(r.err)
		}
	}
	publish(100)
	for _, ch := range chs[50:] {
		if r := wait(t, ch); r.err != nil {
			t.Fatal(r.err)
		}
	}
	if batches, _ := g.Stats(); batches != 1 {
		t.Fatalf("%d batches sent, want 1 (refused, then none)", batches)
	}
	st, _ := s.JS.Stream(ctx, "G")
	if info, err := st.Info(ctx); err != nil || info.State.Msgs != 150 {
		t.Fatalf("stream holds %v messages (%v), want 150", info.State.Msgs, err)
	}
}

// Stop waits for every message's outcome; a publish after it is refused.
func TestGroupCommitStopSettlesEverything(t *testing.T) {
	s := natstest.New(t)
	ctx := context.Background()
	g := groupCommit(t, s, true, jsplumb.GroupCommitConfig{})
	if err := g.Start(ctx); err != nil {
		t.Fatal(err)
	}
	const n = 1000
	ch, cb := collect(n)
	for i := range n {
		if err := g.Publish(ctx, &nats.Msg{Subject: "g." + strconv.Itoa(i), Data: []byte("m")}, "", cb); err != nil {
			t.Fatal(err)
		}
	}
	if err := g.Stop(); err != nil {
		t.Fatal(err)
	}
	if len(ch) != n {
		t.Fatalf("%d of %d callbacks called by Stop's return", len(ch), n)
	}
	for range n {
		if r := <-ch; r.err != nil {
			t.Fatal(r.err)
		}
	}
	if err := g.Publish(ctx, &nats.Msg{Subject: "g.late"}, "", cb); !errors.Is(err, jsplumb.ErrStopped) {
		t.Fatalf("publish after Stop: %v, want ErrStopped", err)
	}
}

package jsplumb_test

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/shared/jsplumb"
	"github.com/mlsched/mlsched/shared/natstest"
)

type result struct {
	ack *jetstream.PubAck
	err error
}

// collect is a callback that hands its result to a channel (buffered, so the
// callback never blocks).
func collect(n int) (chan result, jsplumb.Callback) {
	ch := make(chan result, n)
	return ch, func(ack *jetstream.PubAck, err error) { ch <- result{ack, err} }
}

func wait(t *testing.T, ch chan result) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(30 * time.Second):
		t.Fatal("no callback within 30s")
		return result{}
	}
}

func start(t *testing.T, nc *nats.Conn, cfg jsplumb.PublisherConfig) *jsplumb.Publisher {
	t.Helper()
	p := jsplumb.NewPublisher(nc, cfg)
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop() })
	return p
}

func TestPublishAcknowledged(t *testing.T) {
	s := natstest.New(t)
	ctx := context.Background()
	if _, err := s.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}}); err != nil {
		t.Fatal(err)
	}
	p := start(t, s.NC, jsplumb.PublisherConfig{})
	const n = 500
	ch, cb := collect(2 * n)
	for i := range n {
		if err := p.Publish(ctx, &nats.Msg{Subject: "s.a", Data: []byte("x")}, "id-"+strconv.Itoa(i), cb); err != nil {
			t.Fatal(err)
		}
	}
	seqs := map[uint64]bool{}
	for range n {
		r := wait(t, ch)
		if r.err != nil || r.ack == nil || r.ack.Stream != "S" || r.ack.Duplicate {
			t.Fatalf("ack %+v, err %v", r.ack, r.err)
		}
		seqs[r.ack.Sequence] = true
	}
	if len(seqs) != n {
		t.Fatalf("%d distinct sequences, want %d", len(seqs), n)
	}
	// The same message id again: stored once, acknowledged as a duplicate.
	if err := p.Publish(ctx, &nats.Msg{Subject: "s.a", Data: []byte("x")}, "id-7", cb); err != nil {
		t.Fatal(err)
	}
	if r := wait(t, ch); r.err != nil || !r.ack.Duplicate || r.ack.Stream != "S" {
		t.Fatalf("duplicate: ack %+v, err %v", r.ack, r.err)
	}
	if got := p.Pending(); got != 0 {
		t.Fatalf("pending %d after every ack", got)
	}
	info, err := s.JS.Stream(ctx, "S")
	if err != nil {
		t.Fatal(err)
	}
	if msgs := info.CachedInfo().State.Msgs; msgs != n {
		t.Fatalf("stream holds %d messages, want %d", msgs, n)
	}
}

func TestPublishRefused(t *testing.T) {
	s := natstest.New(t)
	ctx := context.Background()
	if _, err := s.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}}); err != nil {
		t.Fatal(err)
	}
	p := start(t, s.NC, jsplumb.PublisherConfig{})
	ch, cb := collect(4)

	// JetStream's own error: the expected last sequence does not match.
	m := &nats.Msg{Subject: "s.b", Data: []byte("x"), Header: nats.Header{jetstream.ExpectedLastSeqHeader: []string{"42"}}}
	if err := p.Publish(ctx, m, "", cb); err != nil {
		t.Fatal(err)
	}
	r := wait(t, ch)
	var apiErr *jetstream.APIError
	if !errors.As(r.err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence || r.ack != nil {
		t.Fatalf("wrong last sequence: ack %+v, err %v", r.ack, r.err)
	}

	// Nothing stores the subject.
	if err := p.Publish(ctx, &nats.Msg{Subject: "nostream", Data: []byte("x")}, "", cb); err != nil {
		t.Fatal(err)
	}
	if r := wait(t, ch); !errors.Is(r.err, jsplumb.ErrNoResponders) {
		t.Fatalf("no stream: ack %+v, err %v", r.ack, r.err)
	}
}

// responder answers publishes on subject like a stream would, with body, when
// release is closed (a real NATS subscriber standing in for a stream, to
// hold acknowledgements back or send unusual ones).
func responder(t *testing.T, nc *nats.Conn, subject string, body func(*nats.Msg) []byte) (release func()) {
	t.Helper()
	gate := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			_ = m.Respond(body(m))
		}()
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	release = func() { once.Do(func() { close(gate) }) }
	t.Cleanup(func() { release(); wg.Wait(); _ = sub.Unsubscribe() })
	return release
}

func TestPublishBoundedAndTimeout(t *testing.T) {
	s := natstest.New(t)
	other, err := nats.Connect(s.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	release := responder(t, other, "held", func(*nats.Msg) []byte { return []byte(`{"stream":"H","seq":1}`) })
	p := start(t, s.NC, jsplumb.PublisherConfig{MaxPending: 2, Timeout: time.Hour})
	ch, cb := collect(3)
	for range 2 {
		if err := p.Publish(context.Background(), &nats.Msg{Subject: "held"}, "", cb); err != nil {
			t.Fatal(err)
		}
	}
	// A third waits for room; with a context that ends, it gives up.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	err = p.Publish(ctx, &nats.Msg{Subject: "held"}, "", cb)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("third publish with 2 in flight: %v, want the context's deadline", err)
	}
	// One waiting for room goes once an acknowledgement frees it.
	third := make(chan error, 1)
	go func() { third <- p.Publish(context.Background(), &nats.Msg{Subject: "held"}, "", cb) }()
	release()
	for range 3 {
		if r := wait(t, ch); r.err != nil || r.ack.Stream != "H" {
			t.Fatalf("ack %+v, err %v", r.ack, r.err)
		}
	}
	if err := <-third; err != nil {
		t.Fatal(err)
	}

	// Never answered: the callback gets ErrTimeout.
	s2 := natstest.New(t)
	other2, err := nats.Connect(s2.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer other2.Close()
	responder(t, other2, "silent", func(*nats.Msg) []byte { return nil }) // released only at cleanup
	q := start(t, s2.NC, jsplumb.PublisherConfig{Timeout: 100 * time.Millisecond})
	if err := q.Publish(context.Background(), &nats.Msg{Subject: "silent"}, "", cb); err != nil {
		t.Fatal(err)
	}
	if r := wait(t, ch); !errors.Is(r.err, jsplumb.ErrTimeout) {
		t.Fatalf("unanswered: ack %+v, err %v", r.ack, r.err)
	}
	if q.Pending() != 0 {
		t.Fatalf("pending %d after the timeout", q.Pending())
	}
}

func TestStopWaitsForPending(t *testing.T) {
	s := natstest.New(t)
	other, err := nats.Connect(s.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	release := responder(t, other, "held", func(*nats.Msg) []byte { return []byte(`{"stream":"H","seq":9, "duplicate": true}`) })
	p := jsplumb.NewPublisher(s.NC, jsplumb.PublisherConfig{Timeout: time.Hour})
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	ch, cb := collect(1)
	if err := p.Publish(context.Background(), &nats.Msg{Subject: "held"}, "", cb); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- p.Stop() }()
	// The acknowledgement is held back: Stop cannot have returned (this
	// check can miss a bug, never fail without one).
	select {
	case err := <-stopped:
		t.Fatalf("Stop returned (%v) with a publish in flight", err)
	case <-time.After(50 * time.Millisecond):
	}
	release()
	if r := wait(t, ch); r.err != nil || !r.ack.Duplicate || r.ack.Sequence != 9 || r.ack.Stream != "H" {
		t.Fatalf("ack %+v, err %v", r.ack, r.err)
	}
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Stop did not return once nothing was in flight")
	}
	if err := p.Publish(context.Background(), &nats.Msg{Subject: "held"}, "", cb); !errors.Is(err, jsplumb.ErrStopped) {
		t.Fatalf("Publish after Stop: %v, want ErrStopped", err)
	}
}

func TestDisconnectFailsPending(t *testing.T) {
	s := natstest.New(t)
	other, err := nats.Connect(s.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	responder(t, other, "held", func(*nats.Msg) []byte { return nil }) // never answers in time
	nc, err := nats.Connect(s.URL, nats.MaxReconnects(-1), nats.ReconnectWait(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	p := start(t, nc, jsplumb.PublisherConfig{Timeout: time.Hour})
	ch, cb := collect(1)
	if err := p.Publish(context.Background(), &nats.Msg{Subject: "held"}, "", cb); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// The server closes the client's connection: it reconnects, and the
	// acknowledgement in flight is failed rather than awaited for an hour.
	if err := s.Server.DisconnectClientByID(cid(t, nc)); err != nil {
		t.Fatal(err)
	}
	if r := wait(t, ch); !errors.Is(r.err, nats.ErrDisconnected) {
		t.Fatalf("after a disconnect: ack %+v, err %v", r.ack, r.err)
	}
}

func cid(t *testing.T, nc *nats.Conn) uint64 {
	t.Helper()
	id, err := nc.GetClientID()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func TestParseAckAgainstJSON(t *testing.T) {
	for _, body := range []string{
		`{"stream":"S","seq":1}`,
		`{"stream":"MLSCHED_DISPATCH","seq":18446744073709551615}`,
		`{"stream":"S","seq":3,"duplicate": true}`,
		`{"stream":"S","seq":3,"duplicate":false}`,
		`{"stream":"S","domain":"hub","seq":12}`,
		` { "stream" : "S" , "seq" : 4 } `,
		`{"stream":"S","seq":5,"val":"7"}`,
		`{"stream":"S\u0041","seq":6}`,
		`{"stream":"S","seq":7,"batch":"b","count":2}`,
	} {
		t.Run(body, func(t *testing.T) {
			ack, err := jsplumb.ParseReply(&nats.Msg{Data: []byte(body)})
			if err != nil {
				t.Fatal(err)
			}
			var want jetstream.PubAck
			if err := json.Unmarshal([]byte(body), &want); err != nil {
				t.Fatal(err)
			}
			if *ack != want {
				t.Fatalf("got %+v, encoding/json reads %+v", *ack, want)
			}
		})
	}
	for _, body := range []string{`{"seq":1}`, `[]`, `{"stream":"S","seq":-1}`, `nope`} {
		if ack, err := jsplumb.ParseReply(&nats.Msg{Data: []byte(body)}); !errors.Is(err, jsplumb.ErrInvalidAck) {
			t.Fatalf("%s: ack %+v, err %v, want ErrInvalidAck", body, ack, err)
		}
	}
	_, err := jsplumb.ParseReply(&nats.Msg{Data: []byte(`{"error":{"code":503,"err_code":10039,"description":"jetstream not enabled"}}`)})
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.Code != 503 || apiErr.ErrorCode != 10039 {
		t.Fatalf("error reply: %v", err)
	}
}

// FuzzParseReply: whatever body the canonical form's scan accepts,
// encoding/json reads as the same acknowledgement, with no error; and no
// body crashes parseReply.
func FuzzParseReply(f *testing.F) {
	for _, s := range []string{
		`{"stream":"S","seq":1}`, `{"stream":"MLSCHED_DISPATCH","seq":1234567,"duplicate": true}`,
		`{"stream":"MLSCHED_RESULTS","seq":77,"batch":"b.1","count":16}`, `{"stream":"S","seq":7,"batch":"","count":1}`,
		`{"stream":"S","seq":01}`, `{"stream":"S\u0041","seq":6}`, `{"stream":"S","seq":99999999999999999999}`,
		`{"stream":"S","seq":1,"duplicate":false}`, `{"stream":"","seq":1}`, `{"error":{"code":503}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		_, _ = jsplumb.ParseReply(&nats.Msg{Data: body})
		ack, ok := jsplumb.CanonicalAck(body)
		if !ok {
			return
		}
		var want struct {
			Error *jetstream.APIError `json:"error"`
			jetstream.PubAck
		}
		if err := json.Unmarshal(body, &want); err != nil || want.Error != nil {
			t.Fatalf("%q: the scan read %+v, encoding/json refuses it: %v %v", body, *ack, err, want.Error)
		}
		if *ack != want.PubAck {
			t.Fatalf("%q: the scan read %+v, encoding/json %+v", body, *ack, want.PubAck)
		}
	})
}

// The acknowledgements a real server writes, a store and a duplicate, are
// in the canonical form parseReply reads in place: were the server's format
// to change, the fast path would silently never run.
func TestCanonicalAckReadsTheServersAcks(t *testing.T) {
	s := natstest.New(t)
	ctx := context.Background()
	if _, err := s.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "MLSCHED_C", Subjects: []string{"c.>"}}); err != nil {
		t.Fatal(err)
	}
	for i, want := range []jetstream.PubAck{{Stream: "MLSCHED_C", Sequence: 1}, {Stream: "MLSCHED_C", Sequence: 1, Duplicate: true}} {
		m := &nats.Msg{Subject: "c.x", Data: []byte("x"), Header: nats.Header{jetstream.MsgIDHeader: {"same"}}}
		reply, err := s.NC.RequestMsg(m, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		ack, ok := jsplumb.CanonicalAck(reply.Data)
		if !ok || *ack != want {
			t.Fatalf("publish %d: the server wrote %s, read as %+v (canonical %v), want %+v", i+1, reply.Data, ack, ok, want)
		}
	}
}

// Request hands the reply to the caller as it came (no acknowledgement
// parsing), and no responders as ErrNoResponders.
func TestRequest(t *testing.T) {
	s := natstest.New(t)
	ctx := context.Background()
	sub, err := s.NC.Subscribe("ask.me", func(m *nats.Msg) { _ = m.Respond([]byte(`{"status":"settled"}`)) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	p := start(t, s.NC, jsplumb.PublisherConfig{Timeout: 10 * time.Second})
	type reply struct {
		m   *nats.Msg
		err error
	}
	ch := make(chan reply, 2)
	cb := func(m *nats.Msg, err error) { ch <- reply{m, err} }
	for _, subj := range []string{"ask.me", "nobody.listens"} {
		if err := p.Request(ctx, &nats.Msg{Subject: subj}, "", cb); err != nil {
			t.Fatal(err)
		}
		var r reply
		select {
		case r = <-ch:
		case <-time.After(30 * time.Second):
			t.Fatal("no callback within 30s")
		}
		switch {
		case subj == "ask.me" && (r.err != nil || string(r.m.Data) != `{"status":"settled"}`):
			t.Fatalf("reply %v, %v", r.m, r.err)
		case subj != "ask.me" && !errors.Is(r.err, jsplumb.ErrNoResponders):
			t.Fatalf("no responders: %v, %v, want ErrNoResponders", r.m, r.err)
		}
	}
}

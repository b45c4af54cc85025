package loadshare

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/dispatcher/internal/policy"
	"github.com/mlsched/mlsched/shared/logtest"
	"github.com/mlsched/mlsched/shared/natstest"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// table is a replica's table: one node of 2 slots hosting m, sharing its
// changes with s.
type table struct{ t atomic.Pointer[policy.Table] }

func (x *table) Table() *policy.Table { return x.t.Load() }

func newTable(s *Sharer) *table {
	tb := policy.NewTable(nil, []protocol.Heartbeat{{Node: "n1", Capacity: 2, SentAt: time.Now(),
		Models: []protocol.ModelInfo{{Name: "m", Types: []string{"t"}}}}}, time.Now())
	if s != nil {
		tb.ShareWith(s.Note)
	}
	x := &table{}
	x.t.Store(tb)
	return x
}

// replica is a Sharer running on its own connection, with its own table.
func replica(t *testing.T, url string) (*Sharer, *table) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	x := &table{}
	s := New(Params{NC: nc, Tables: x, Log: zerolog.Nop()})
	*x = *newTable(s)
	svc := s.Service()
	if err := svc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop() })
	return s, x
}

func waitWork(t *testing.T, x *table, want int64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := x.Table().NodeWork("n1")
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("node work %d, want %d", got, want)
		}
		time.Sleep(time.Millisecond)
	}
}

// Each replica's table counts the other's dispatches and settled outcomes
// (through a real nats-server), and its own once.
func TestReplicasShareTheirLoad(t *testing.T) {
	srv := natstest.New(t)
	a, ta := replica(t, srv.URL)
	b, tb := replica(t, srv.URL)
	for range 3 {
		ta.Table().Dispatched("m", "n1")
	}
	waitWork(t, tb, 3)
	tb.Table().Completed("m", "n1") // b settled one of a's
	waitWork(t, ta, 2)
	waitWork(t, tb, 2)
	if a.Sent.Load() == 0 || b.Received.Load() == 0 {
		t.Fatalf("sent %d, received %d", a.Sent.Load(), b.Received.Load())
	}
	// a's own messages came back to it (one subscription for all) and
	// were not counted again: b's received one (the settled outcome) is
	// in, and a received its own three dispatches' message too
	if got := ta.Table().NodeWork("n1"); got != 2 {
		t.Fatalf("a counts %d, want 2", got)
	}
}

// A message that does not decode is refused and counted, not applied.
func TestBadLoadShareIsRefused(t *testing.T) {
	srv := natstest.New(t)
	s, x := replica(t, srv.URL)
	for _, bad := range []string{`not json`, `{"r":"","p":[]}`, `{"r":"x","p":[{"m":"m","n":"n1","d":99999999999}]}`,
		`{"r":"x","p":[{"m":"","n":"n1","d":1}]}`} {
		if err := srv.NC.Publish(topology.SubjectLoad, []byte(bad)); err != nil {
			t.Fatal(err)
		}
	}
	if err := srv.NC.Publish(topology.SubjectLoad, []byte(`{"r":"other","p":[{"m":"m","n":"n1","d":4}]}`)); err != nil {
		t.Fatal(err)
	}
	waitWork(t, x, 4) // the good one, sent last, is applied
	if got := s.Refused.Load(); got != 4 {
		t.Fatalf("refused %d, want 4", got)
	}
}

// Changes are summed per pair between two messages: a burst of changes is
// one message, not one each.
func TestChangesAreBatched(t *testing.T) {
	srv := natstest.New(t)
	a, ta := replica(t, srv.URL)
	_, tb := replica(t, srv.URL)
	for i := range 1000 {
		ta.Table().Dispatched("m", "n1")
		if i%2 == 1 {
			ta.Table().Completed("m", "n1")
		}
	}
	waitWork(t, tb, 500)
	if got := a.Sent.Load(); got > 100 {
		t.Fatalf("%d messages for 1500 changes, want them batched", got)
	}
}

// More pairs changed than one message holds: the rest go in the next
// message at once, not at the next change.
func TestManyPairsAreAllSent(t *testing.T) {
	srv := natstest.New(t)
	a, _ := replica(t, srv.URL)
	var got atomic.Int64
	sub, err := srv.NC.Subscribe(topology.SubjectLoad, func(m *nats.Msg) {
		if l, err := protocol.DecodeLoadShare(m.Data); err == nil {
			got.Add(int64(len(l.Pairs)))
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := srv.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	n := protocol.MaxLoadPairs*2 + 7
	for i := range n {
		a.Note("m", "n"+strconv.Itoa(i), 1)
	}
	deadline := time.Now().Add(5 * time.Second)
	for got.Load() < int64(n) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d pairs sent", got.Load(), n)
		}
		time.Sleep(time.Millisecond) // poll interval
	}
}

// An authorization written before the subject existed refuses it: the
// replica says so once, with what to do, and stops sending.
func TestRefusedSubjectStopsSending(t *testing.T) {
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoLog: true, NoSigs: true,
		Users: []*server.User{{Username: "d", Password: "d-pw", Permissions: &server.Permissions{
			Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: []string{topology.SubjectLoad}}}}}})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats not ready")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	nc, err := nats.Connect(s.ClientURL(), nats.UserInfo("d", "d-pw"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	var logs logtest.Buffer
	x := &table{}
	sh := New(Params{NC: nc, Tables: x, Log: zerolog.New(&logs)})
	*x = *newTable(sh)
	svc := sh.Service()
	if err := svc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop() })
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(logs.String(), "NATS refuses this dispatcher "+topology.SubjectLoad) {
		if time.Now().After(deadline) {
			t.Fatalf("no refusal said; logs: %s", logs.String())
		}
		x.Table().Dispatched("m", "n1")  // a change to send, until the refusal is seen
		time.Sleep(2 * time.Millisecond) // poll interval
	}
	sent := sh.Sent.Load()
	for range 50 {
		x.Table().Dispatched("m", "n1")
	}
	// The loop has returned: nothing takes the pending changes any more.
	deadline = time.Now().Add(5 * time.Second)
	for {
		sh.mu.Lock()
		pending := len(sh.pending)
		sh.mu.Unlock()
		if pending > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("changes still taken after the refusal")
		}
		time.Sleep(time.Millisecond) // poll interval
	}
	if got := sh.Sent.Load(); got > sent+1 {
		t.Fatalf("sent %d messages after the refusal", got-sent)
	}
	if n := strings.Count(logs.String(), "NATS refuses this dispatcher"); n != 1 {
		t.Fatalf("the refusal said %d times, want once", n)
	}
}

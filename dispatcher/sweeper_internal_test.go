package dispatcher

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/shared/natstest"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// An attempt unanswered at its deadline is its model's loss (lost) only
// when its path stayed whole: its node did not restart after it was sent,
// and this replica's NATS connection was not lost since. Otherwise it is
// node_lost: not counted against the model.
func TestLostStatusBlamesTheModelOnlyOnAWholePath(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	started := map[string]time.Time{"old": t0.Add(-time.Hour), "new": t0.Add(time.Minute)}
	var reconnects uint64
	s := &sweeper{
		live: func() []protocol.Heartbeat {
			var out []protocol.Heartbeat
			for n, at := range started {
				out = append(out, protocol.Heartbeat{Node: n, StartedAt: at})
			}
			return out
		},
		reconnects: func() uint64 { return reconnects },
	}
	s.noteReconnects(t0) // the first count is the baseline, not a reconnection
	if st, why := s.lostStatus("old", t0); st != protocol.OutcomeLost || why != "" {
		t.Fatalf("a whole path: %s %q, want lost", st, why)
	}
	if st, why := s.lostStatus("new", t0); st != protocol.OutcomeNodeLost || !strings.Contains(why, "restarted") {
		t.Fatalf("node restarted after the attempt: %s %q, want node_lost (restarted)", st, why)
	}
	if st, _ := s.lostStatus("gone", t0); st != protocol.OutcomeLost {
		t.Fatalf("a node the registry does not see (sweepGone's case): %s, want lost", st)
	}
	reconnects++
	s.noteReconnects(t0.Add(2 * time.Second))
	if st, why := s.lostStatus("old", t0); st != protocol.OutcomeNodeLost || !strings.Contains(why, "connection to NATS") {
		t.Fatalf("NATS reconnected after the attempt was sent: %s %q, want node_lost (connection)", st, why)
	}
	if st, _ := s.lostStatus("old", t0.Add(3*time.Second)); st != protocol.OutcomeLost {
		t.Fatalf("an attempt sent after the reconnection: %s, want lost", st)
	}
	s.noteReconnects(t0.Add(time.Hour)) // no new reconnection: the time stays
	if st, _ := s.lostStatus("old", t0.Add(3*time.Second)); st != protocol.OutcomeLost {
		t.Fatalf("a sweep without a new reconnection moved its time: %s, want lost", st)
	}
}

// A dispatch the node's consumer never delivered was never seen by its
// model: fetchedBy says so from the consumer's info, once per node.
func TestFetchedByReadsTheNodesConsumer(t *testing.T) {
	srv := natstest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := topology.Ensure(ctx, srv.JS, topology.Config{}); err != nil {
		t.Fatal(err)
	}
	st, err := srv.JS.Stream(ctx, topology.StreamDispatch)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: topology.NodeConsumer("n1"),
		FilterSubject: topology.DispatchSubject("n1"), AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for range 2 {
		a, err := srv.JS.Publish(ctx, topology.DispatchSubject("n1"), []byte(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, a.Sequence)
	}
	b, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for range b.Messages() { // delivered, left unacked: the node holds it
	}
	s := &sweeper{dispatch: st}
	fetched := map[string]uint64{}
	if !s.fetchedBy(ctx, "n1", seqs[0], fetched) {
		t.Fatal("the delivered dispatch: not fetched")
	}
	if s.fetchedBy(ctx, "n1", seqs[1], fetched) {
		t.Fatal("the dispatch never delivered: fetched")
	}
	if !s.fetchedBy(ctx, "nobody", seqs[1], map[string]uint64{}) {
		t.Fatal("a node without a consumer: cannot tell, must say fetched (the model's loss, as before)")
	}
}

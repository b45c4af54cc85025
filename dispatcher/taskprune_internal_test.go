package dispatcher

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/shared/natstest"
	"github.com/mlsched/mlsched/shared/topology"
)

// taskSeqs lists the sequences MLSCHED_TASKS holds.
func taskSeqs(ctx context.Context, t *testing.T, s jetstream.Stream) []uint64 {
	t.Helper()
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	if info.State.Msgs == 0 {
		return seqs
	}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		if _, err := s.GetMsg(ctx, seq); err == nil {
			seqs = append(seqs, seq)
		}
	}
	return seqs
}

// A limits-retention task stream loses only finished tasks: those at or
// below the band consumer's ack floor at each pass, those acked above it
// (an older task still runs) once they straggle, and never an unacked one.
func TestTaskPrunerRemovesOnlyFinishedTasks(t *testing.T) {
	t.Parallel()
	srv := natstest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := topology.Ensure(ctx, srv.JS, topology.Config{}); err != nil {
		t.Fatal(err)
	}
	s, err := srv.JS.Stream(ctx, topology.StreamTasks)
	if err != nil {
		t.Fatal(err)
	}
	if r := s.CachedInfo().Config.Retention; r != jetstream.LimitsPolicy {
		t.Fatalf("new task stream retention %v, want limits", r)
	}
	durable, filters := topology.BandConsumer(topology.BandNormal)
	c, err := s.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: durable, FilterSubjects: filters,
		AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: -1, AckWait: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if _, err := srv.JS.Publish(ctx, topology.TaskSubject("x"), fmt.Appendf(nil, `{"id":"t%d","type":"x"}`, i)); err != nil {
			t.Fatal(err)
		}
	}
	msgs := fetchN(t, c, 5, "tasks")
	p := newTaskPruner(srv.JS, zerolog.Nop())
	p.straggle = time.Hour
	if err := p.prune(ctx); err != nil { // finds limits retention: notes acks from now on
		t.Fatal(err)
	}
	ack := func(i int) {
		t.Helper()
		if err := msgs[i].DoubleAck(ctx); err != nil { // the server has it: the floor moves
			t.Fatal(err)
		}
		p.noteAcked(msgs[i])
	}
	// Tasks 1, 2, 4 and 5 finish; task 3 still runs.
	for _, i := range []int{0, 1, 3, 4} {
		ack(i)
	}
	if err := p.prune(ctx); err != nil {
		t.Fatal(err)
	}
	if got := taskSeqs(ctx, t, s); !slices.Equal(got, []uint64{3, 4, 5}) {
		t.Fatalf("after a pass the stream holds %v, want [3 4 5] (below the floor purged, acked above it kept)", got)
	}
	// Tasks 4 and 5 straggle: deleted one by one, task 3 stays.
	p.straggle = 0
	if err := p.prune(ctx); err != nil {
		t.Fatal(err)
	}
	if got := taskSeqs(ctx, t, s); !slices.Equal(got, []uint64{3}) {
		t.Fatalf("after the stragglers' pass the stream holds %v, want [3] (the unfinished task)", got)
	}
	ack(2)
	if err := p.prune(ctx); err != nil {
		t.Fatal(err)
	}
	if got := taskSeqs(ctx, t, s); len(got) != 0 {
		t.Fatalf("with every task finished the stream holds %v, want none", got)
	}
	p.mu.Lock()
	left := len(p.acked)
	p.mu.Unlock()
	if left != 0 {
		t.Fatalf("pruner still tracks %d acked tasks, want 0", left)
	}
}

// An earlier version's work-queue task stream is used as it is (its acks
// remove the tasks) and the pruner leaves it alone.
func TestTaskPrunerLeavesAWorkQueueStream(t *testing.T) {
	t.Parallel()
	srv := natstest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	old := topology.Streams(topology.Config{})[0]
	old.Retention = jetstream.WorkQueuePolicy
	if _, err := srv.JS.CreateStream(ctx, old); err != nil {
		t.Fatal(err)
	}
	var notices []string
	if err := topology.Ensure(ctx, srv.JS, topology.Config{UpdateLimits: true, Notice: func(m string) { notices = append(notices, m) }}); err != nil {
		t.Fatalf("a work-queue task stream must stay usable: %v", err)
	}
	if len(notices) == 0 {
		t.Fatal("no notice that the task stream keeps its work-queue retention")
	}
	if _, err := srv.JS.Publish(ctx, topology.TaskSubject("x"), []byte(`{"id":"a","type":"x"}`)); err != nil {
		t.Fatal(err)
	}
	p := newTaskPruner(srv.JS, zerolog.Nop())
	if err := p.prune(ctx); err != nil {
		t.Fatal(err)
	}
	s, err := srv.JS.Stream(ctx, topology.StreamTasks)
	if err != nil {
		t.Fatal(err)
	}
	if r := s.CachedInfo().Config.Retention; r != jetstream.WorkQueuePolicy {
		t.Fatalf("retention %v, want the work queue kept", r)
	}
	if got := taskSeqs(ctx, t, s); !slices.Equal(got, []uint64{1}) {
		t.Fatalf("stream holds %v, want [1]", got)
	}
	if p.active.Load() {
		t.Fatal("pruner active on a work-queue stream")
	}
}

// A parked tenant's finished tasks are purged below its parked consumer's
// ack floor, as a band's (with stragglers off: only the floor removes
// them), and an unfinished one stays; the band's tasks are not touched.
func TestTaskPrunerPurgesParkedTasksByFloor(t *testing.T) {
	t.Parallel()
	srv := natstest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := topology.Ensure(ctx, srv.JS, topology.Config{}); err != nil {
		t.Fatal(err)
	}
	s, err := srv.JS.Stream(ctx, topology.StreamTasks)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.JS.Publish(ctx, topology.TaskSubject("x"), []byte(`{"id":"waiting","type":"x"}`)); err != nil {
		t.Fatal(err)
	}
	subj := topology.ParkedSubject(topology.BandNormal, "a")
	for i := range 3 {
		if _, err := srv.JS.Publish(ctx, subj, fmt.Appendf(nil, `{"id":"p%d","type":"x","tenant":"a"}`, i)); err != nil {
			t.Fatal(err)
		}
	}
	name := topology.ParkedConsumer(topology.BandNormal, "a")
	c, err := s.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: name, FilterSubject: subj,
		AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: -1, AckWait: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	msgs := fetchN(t, c, 3, "parked tasks")
	p := newTaskPruner(srv.JS, zerolog.Nop())
	p.straggle = time.Hour
	p.parked = func() ([]string, []string) { return []string{name}, []string{subj} }
	if err := p.prune(ctx); err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs[:2] { // p0 and p1 finish, p2 still runs
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
		p.noteAcked(m)
	}
	if err := p.prune(ctx); err != nil {
		t.Fatal(err)
	}
	// sequence 1 is the band's waiting task, 2..4 the parked ones
	if got := taskSeqs(ctx, t, s); !slices.Equal(got, []uint64{1, 4}) {
		t.Fatalf("after a pass the stream holds %v, want [1 4] (the band's waiting task and the running parked one)", got)
	}
}

// fetchN fetches exactly n messages from c, failing the test otherwise.
func fetchN(t *testing.T, c jetstream.Consumer, n int, what string) []jetstream.Msg {
	t.Helper()
	batch, err := c.Fetch(n, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var msgs []jetstream.Msg
	for m := range batch.Messages() {
		msgs = append(msgs, m)
	}
	if len(msgs) != n {
		t.Fatalf("fetched %d %s, want %d", len(msgs), what, n)
	}
	return msgs
}

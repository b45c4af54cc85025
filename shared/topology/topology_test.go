package topology_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/shared/natstest"
	"github.com/mlsched/mlsched/shared/topology"
)

// A results stream an older version created (24h MaxAge, no count or byte
// bound) is updated in place by the dispatcher's Ensure: same stream, its
// results kept, the new bounds set; a bound below what it holds discards
// the oldest. Roles without UpdateLimits leave it alone.
func TestEnsureBoundsExistingResultsStream(t *testing.T) {
	srv := natstest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	old := jetstream.StreamConfig{Name: topology.StreamResults, Subjects: []string{topology.SubjectResultsAll},
		MaxMsgsPerSubject: 1, MaxAge: 24 * time.Hour, AllowDirect: true, Duplicates: 2 * time.Minute}
	if _, err := srv.JS.CreateStream(ctx, old); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if _, err := srv.JS.Publish(ctx, topology.ResultSubject(fmt.Sprintf("t-%d", i)), []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	info := func() *jetstream.StreamInfo {
		s, err := srv.JS.Stream(ctx, topology.StreamResults)
		if err != nil {
			t.Fatal(err)
		}
		return s.CachedInfo()
	}
	created := info().Created
	if err := topology.Ensure(ctx, srv.JS, topology.Config{}); err != nil { // a worker or producer
		t.Fatal(err)
	}
	if got := info().Config; got.MaxMsgs != -1 || got.MaxBytes != -1 || got.AllowAtomicPublish {
		t.Fatalf("without UpdateLimits: max_msgs=%d max_bytes=%d allow_atomic=%v, want the stream untouched", got.MaxMsgs, got.MaxBytes, got.AllowAtomicPublish)
	}
	if topology.GroupCommits(info()) {
		t.Fatal("GroupCommits on a stream without atomic publishes")
	}
	if err := topology.Ensure(ctx, srv.JS, topology.Config{UpdateLimits: true}); err != nil {
		t.Fatal(err)
	}
	got := info()
	if got.Config.MaxMsgs != topology.DefaultResultsMaxMsgs || got.Config.MaxBytes != topology.DefaultResultsMaxBytes ||
		got.Config.Discard != jetstream.DiscardOld || got.Config.MaxAge != 24*time.Hour {
		t.Fatalf("updated config: max_msgs=%d max_bytes=%d discard=%v max_age=%v", got.Config.MaxMsgs, got.Config.MaxBytes, got.Config.Discard, got.Config.MaxAge)
	}
	if !got.Config.AllowAtomicPublish || !topology.GroupCommits(got) {
		t.Fatalf("updated config: allow_atomic=%v, want atomic publishes (group commit) on the file results stream", got.Config.AllowAtomicPublish)
	}
	if got.State.Msgs != 10 || !got.Created.Equal(created) {
		t.Fatalf("after update: %d results (want 10), created %v (want %v: updated, not re-created)", got.State.Msgs, got.Created, created)
	}
	if err := topology.Ensure(ctx, srv.JS, topology.Config{UpdateLimits: true, ResultsMaxMsgs: 4, ResultsMaxAge: time.Hour}); err != nil {
		t.Fatal(err)
	}
	got = info()
	if got.State.Msgs != 4 || got.State.FirstSeq != 7 || got.Config.MaxAge != time.Hour {
		t.Fatalf("bound 4: %d results from seq %d, max_age %v; want the newest 4 (from 7), 1h", got.State.Msgs, got.State.FirstSeq, got.Config.MaxAge)
	}
	dlq, err := srv.JS.Stream(ctx, topology.StreamDLQ)
	if err != nil {
		t.Fatal(err)
	}
	if c := dlq.CachedInfo().Config; c.MaxBytes != topology.DefaultDLQMaxBytes || c.Discard != jetstream.DiscardOld {
		t.Fatalf("dlq: max_bytes=%d discard=%v", c.MaxBytes, c.Discard)
	}
}

func TestBandSubjects(t *testing.T) {
	for _, c := range []struct {
		prio    int
		subject string
		band    int
	}{{0, "mlsched.tasks.x", topology.BandNormal}, {10, "mlsched.tasks.x.high", topology.BandHigh},
		{1, "mlsched.tasks.x.high", topology.BandHigh}, {-1, "mlsched.tasks.x.low", topology.BandLow}} {
		if got := topology.BandTaskSubject("x", c.prio); got != c.subject {
			t.Errorf("BandTaskSubject(x, %d) = %q, want %q", c.prio, got, c.subject)
		}
		typ, band, ok := topology.ParseTaskSubject(c.subject)
		if !ok || typ != "x" || band != c.band {
			t.Errorf("ParseTaskSubject(%q) = %q %d %v", c.subject, typ, band, ok)
		}
	}
	for _, bad := range []string{"mlsched.tasks.x.mid", "mlsched.other.x"} {
		if _, _, ok := topology.ParseTaskSubject(bad); ok {
			t.Errorf("ParseTaskSubject(%q) accepted", bad)
		}
	}
	// The band consumers' filters must not overlap (a work-queue stream
	// refuses it), and each band's subject must match its own filter only.
	for _, band := range topology.Bands {
		subj := topology.BandTaskSubject("x", band*5)
		for _, other := range topology.Bands {
			_, filters := topology.BandConsumer(other)
			matched := false
			for _, f := range filters {
				matched = matched || subjectMatches(f, subj)
			}
			if matched != (band == other) {
				t.Errorf("subject %s matched by band %d's filters %v: %v", subj, other, filters, matched)
			}
		}
	}
}

// subjectMatches is NATS subject matching for the test's filters.
func subjectMatches(filter, subject string) bool {
	f, s := strings.Split(filter, "."), strings.Split(subject, ".")
	for i, tok := range f {
		if tok == ">" {
			return len(s) > i
		}
		if i >= len(s) || (tok != "*" && tok != s[i]) {
			return false
		}
	}
	return len(f) == len(s)
}

// The unfiltered task consumer of an earlier version is narrowed to band 0
// in place, keeping its pending messages, and the other bands' consumers
// can then be created beside it (their filters overlapped it before).
func TestBandConsumersReplaceTheUnfilteredOne(t *testing.T) {
	srv := natstest.New(t)
	ctx := context.Background()
	if err := topology.Ensure(ctx, srv.JS, topology.Config{}); err != nil {
		t.Fatal(err)
	}
	s, err := srv.JS.Stream(ctx, topology.StreamTasks)
	if err != nil {
		t.Fatal(err)
	}
	old := jetstream.ConsumerConfig{Durable: topology.ConsumerDispatcher, AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: -1}
	if _, err := s.CreateConsumer(ctx, old); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.JS.Publish(ctx, topology.TaskSubject("x"), []byte(`{"id":"a","type":"x"}`)); err != nil {
		t.Fatal(err)
	}
	for _, band := range []int{topology.BandNormal, topology.BandHigh, topology.BandLow} {
		want := old
		want.Durable, want.FilterSubjects = topology.BandConsumer(band)
		c, err := topology.EnsureConsumer(ctx, s, want)
		if err != nil {
			t.Fatalf("band %d: %v", band, err)
		}
		info, err := c.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(info.Config.FilterSubjects) != fmt.Sprint(want.FilterSubjects) {
			t.Fatalf("band %d consumer filters %v, want %v", band, info.Config.FilterSubjects, want.FilterSubjects)
		}
		if band == topology.BandNormal && info.NumPending != 1 {
			t.Fatalf("band 0 consumer has %d pending, want the 1 task queued before the update", info.NumPending)
		}
	}
}

// New task and results streams take atomic publishes; only on file storage
// does group commit pay.
func TestStreamsAllowGroupCommit(t *testing.T) {
	for _, sc := range topology.Streams(topology.Config{}) {
		want := sc.Name == topology.StreamTasks || sc.Name == topology.StreamResults
		if sc.AllowAtomicPublish != want {
			t.Errorf("%s: allow_atomic=%v, want %v", sc.Name, sc.AllowAtomicPublish, want)
		}
	}
	file := &jetstream.StreamInfo{Config: jetstream.StreamConfig{Storage: jetstream.FileStorage, AllowAtomicPublish: true}}
	mem := &jetstream.StreamInfo{Config: jetstream.StreamConfig{Storage: jetstream.MemoryStorage, AllowAtomicPublish: true}}
	if !topology.GroupCommits(file) || topology.GroupCommits(mem) || topology.GroupCommits(nil) {
		t.Fatal("GroupCommits: want true on file storage with atomic publishes only")
	}
}

// Parked subjects name their band and tenant, are read by no band
// consumer, and a tenant a consumer name may not hold is hashed.
func TestParkedSubjects(t *testing.T) {
	for _, band := range topology.Bands {
		for _, tenant := range []string{"acme", "a/b", "x\\y", "high", "low"} {
			subj := topology.ParkedSubject(band, tenant)
			b, tn, ok := topology.ParseParkedSubject(subj)
			if !ok || b != band || tn != tenant {
				t.Fatalf("topology.ParseParkedSubject(%q) = %d, %q, %v", subj, b, tn, ok)
			}
			if _, _, ok := topology.ParseTaskSubject(subj); ok {
				t.Fatalf("%s reads as a task subject", subj)
			}
			for _, b := range topology.Bands { // no band consumer reads it
				_, filters := topology.BandConsumer(b)
				for _, f := range filters {
					if subjectMatches(f, subj) {
						t.Fatalf("band %d's filter %s reads %s", b, f, subj)
					}
				}
			}
			for _, f := range topology.ParkedFilters() {
				if f == subj {
					t.Fatalf("filter %s is a subject", f)
				}
			}
			name := topology.ParkedConsumer(band, tenant)
			if strings.ContainsAny(name, "./\\*> ") || !strings.HasPrefix(name, topology.ParkedConsumerPrefix) {
				t.Fatalf("topology.ParkedConsumer(%d, %q) = %q, not a valid durable name", band, tenant, name)
			}
		}
	}
	if got := topology.ParkedConsumer(topology.BandHigh, "acme"); got != "parked-high-acme" {
		t.Fatalf("topology.ParkedConsumer = %q", got)
	}
	for _, s := range []string{"mlsched.tasks.a", "mlsched.tasks.a.high", "mlsched.tasks._park", "mlsched.tasks._park.a.b", "mlsched.tasks._parkx.t_a", "mlsched.tasks._park.a"} {
		if _, _, ok := topology.ParseParkedSubject(s); ok {
			t.Fatalf("%s parsed as parked", s)
		}
	}
}

package topology_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/shared/natstest"
	"github.com/mlsched/mlsched/shared/topology"
)

// Attempt streams created on file storage by an older version: the
// dispatcher's Ensure re-creates an empty one in memory and keeps one that
// holds messages, saying so; other roles accept either storage; the other
// streams' storage is still checked.
func TestEnsureMigratesEmptyAttemptStreams(t *testing.T) {
	srv := natstest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := topology.Ensure(ctx, srv.JS, topology.Config{}); err != nil { // the old layout: all on file
		t.Fatal(err)
	}
	if _, err := srv.JS.Publish(ctx, topology.OutcomeSubject("n1"), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	storage := func(name string) (jetstream.StorageType, uint64) {
		s, err := srv.JS.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.Config.Storage, info.State.Msgs
	}
	// A worker (no UpdateLimits) wanting memory accepts the file streams.
	if err := topology.Ensure(ctx, srv.JS, topology.Config{AttemptStorage: jetstream.MemoryStorage}); err != nil {
		t.Fatalf("a role that does not own the streams refused file attempt streams: %v", err)
	}
	if st, _ := storage(topology.StreamDispatch); st != jetstream.FileStorage {
		t.Fatalf("a role that does not own the streams changed the dispatch stream to %v", st)
	}
	var mu sync.Mutex
	var notices []string
	cfg := topology.Config{AttemptStorage: jetstream.MemoryStorage, UpdateLimits: true,
		Notice: func(m string) { mu.Lock(); notices = append(notices, m); mu.Unlock() }}
	if err := topology.Ensure(ctx, srv.JS, cfg); err != nil {
		t.Fatal(err)
	}
	if st, _ := storage(topology.StreamDispatch); st != jetstream.MemoryStorage {
		t.Errorf("empty %s on %v storage after the dispatcher's Ensure, want memory", topology.StreamDispatch, st)
	}
	if st, n := storage(topology.StreamOutcomes); st != jetstream.FileStorage || n != 1 {
		t.Errorf("%s holding a message: %v storage, %d messages; want it kept on file with its message", topology.StreamOutcomes, st, n)
	}
	for _, name := range []string{topology.StreamTasks, topology.StreamResults} {
		if st, _ := storage(name); st != jetstream.FileStorage {
			t.Errorf("%s on %v storage, want file", name, st)
		}
	}
	mu.Lock()
	all := strings.Join(notices, "\n")
	mu.Unlock()
	if !strings.Contains(all, topology.StreamDispatch+" was empty") || !strings.Contains(all, topology.StreamOutcomes+" is on File storage with 1 messages, kept") {
		t.Errorf("notices:\n%s", all)
	}
	// Once it is empty, a dispatcher started again moves it.
	s, err := srv.JS.Stream(ctx, topology.StreamOutcomes)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	if err := topology.Ensure(ctx, srv.JS, cfg); err != nil {
		t.Fatal(err)
	}
	if st, _ := storage(topology.StreamOutcomes); st != jetstream.MemoryStorage {
		t.Errorf("emptied %s on %v storage after a dispatcher's Ensure, want memory", topology.StreamOutcomes, st)
	}
	// A role wanting file accepts memory attempt streams, and a memory
	// task stream is still incompatible with one wanting file.
	if err := topology.Ensure(ctx, srv.JS, topology.Config{}); err != nil {
		t.Fatalf("file-wanting role refused memory attempt streams: %v", err)
	}
	if err := topology.Ensure(ctx, srv.JS, topology.Config{Storage: jetstream.MemoryStorage}); err == nil {
		t.Error("a memory-wanting role accepted file task and result streams")
	}
}

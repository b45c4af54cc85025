package client_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/shared/client"
	"github.com/mlsched/mlsched/shared/natstest"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// With group commit on a file task stream, tasks submitted from many
// goroutines and with SubmitMany are each stored once, each with its own
// sequence, and a re-submission is still acknowledged as a duplicate.
func TestSubmitWithGroupCommit(t *testing.T) {
	srv := natstest.New(t)
	if err := topology.Ensure(ctx(t), srv.JS, topology.Config{}); err != nil { // file storage
		t.Fatal(err)
	}
	c := client.New(srv.JS, client.WithGroupCommit(true))
	t.Cleanup(c.Close)
	task := func(i int) protocol.Task {
		return protocol.Task{ID: fmt.Sprintf("t-%d", i), Type: "echo", Payload: []byte(`{}`)}
	}
	const goroutines, each = 16, 40
	var (
		mu   sync.Mutex
		seqs = map[uint64]string{}
		wg   sync.WaitGroup
	)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range each {
				tk := task(g*each + k)
				ack, err := c.Submit(ctx(t), tk)
				if err != nil || ack.Duplicate {
					t.Errorf("%s: %+v %v", tk.ID, ack, err)
					return
				}
				mu.Lock()
				if other, dup := seqs[ack.Seq]; dup {
					t.Errorf("%s and %s acknowledged at the same sequence %d", tk.ID, other, ack.Seq)
				}
				seqs[ack.Seq] = tk.ID
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	var many []protocol.Task
	for i := goroutines * each; i < goroutines*each+500; i++ {
		many = append(many, task(i))
	}
	many = append(many, task(3)) // submitted before: a duplicate
	acks, errs := c.SubmitMany(ctx(t), many, 256)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("%s: %v", many[i].ID, err)
		}
		if acks[i].Duplicate != (i == len(many)-1) {
			t.Fatalf("%s: duplicate %v", many[i].ID, acks[i].Duplicate)
		}
		if i < len(many)-1 {
			if other, dup := seqs[acks[i].Seq]; dup {
				t.Fatalf("%s and %s acknowledged at the same sequence %d", many[i].ID, other, acks[i].Seq)
			}
			seqs[acks[i].Seq] = many[i].ID
		}
	}
	s, err := srv.JS.Stream(ctx(t), topology.StreamTasks)
	if err != nil {
		t.Fatal(err)
	}
	for seq, id := range seqs {
		m, err := s.GetMsg(ctx(t), seq)
		if err != nil {
			t.Fatalf("%s at %d: %v", id, seq, err)
		}
		got, err := protocol.DecodeTask(m.Data, protocol.DefaultLimits)
		if err != nil || got.ID != id || m.Header.Get(jetstream.MsgIDHeader) != id {
			t.Fatalf("sequence %d holds %q (msg id %q), want %s", seq, m.Data, m.Header.Get(jetstream.MsgIDHeader), id)
		}
	}
	info, err := s.Info(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if want := uint64(goroutines*each + 500); info.State.Msgs != want {
		t.Fatalf("the task stream holds %d tasks, want %d", info.State.Msgs, want)
	}
	batched := 0
	for seq := range seqs {
		if m, _ := s.GetMsg(ctx(t), seq); m != nil && m.Header.Get("Nats-Batch-Id") != "" {
			batched++
		}
	}
	if batched == 0 {
		t.Fatal("no task was stored in a batch")
	}
	t.Logf("%d of %d tasks stored in batches", batched, len(seqs))
}

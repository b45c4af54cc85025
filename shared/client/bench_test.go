package client_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/shared/client"
	"github.com/mlsched/mlsched/shared/natstest"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

func benchSetup(b testing.TB) (*natstest.Server, *client.Client) {
	srv := natstest.New(b)
	tc := topology.Config{Storage: jetstream.MemoryStorage}
	if err := topology.Ensure(context.Background(), srv.JS, tc); err != nil {
		b.Fatal(err)
	}
	return srv, client.New(srv.JS, client.WithTopology(tc))
}

// BenchmarkSubmit is one validated, acknowledged submission (a round trip to
// the embedded server), sequential and from parallel goroutines.
func BenchmarkSubmit(b *testing.B) {
	_, c := benchSetup(b)
	ctx := context.Background()
	payload := json.RawMessage(`{"text":"is this spam?"}`)
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			if _, err := c.Submit(ctx, protocol.Task{ID: fmt.Sprintf("s-%d", i), Type: "classify", Payload: payload}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(8)
		var n atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				id := fmt.Sprintf("p-%d", n.Add(1))
				if _, err := c.Submit(ctx, protocol.Task{ID: id, Type: "classify", Payload: payload}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

// BenchmarkWaitAll collects 2000 results already stored, with one consumer;
// per-op figures are for the whole batch.
func BenchmarkWaitAll(b *testing.B) {
	srv, c := benchSetup(b)
	ctx := context.Background()
	const n = 2000
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("w-%d", i)
		data, _ := json.Marshal(protocol.Result{ID: ids[i], Status: protocol.StatusSucceeded})
		if _, err := srv.JS.PublishAsync(topology.ResultSubject(ids[i]), data); err != nil {
			b.Fatal(err)
		}
	}
	<-srv.JS.PublishAsyncComplete()
	b.ReportAllocs()
	for b.Loop() {
		got := 0
		if err := c.WaitAll(ctx, ids, func(*protocol.Result) { got++ }); err != nil || got != n {
			b.Fatalf("got %d, err %v", got, err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/result")
}

// BenchmarkSubmitMany is a pipelined batch of 1000 tasks; per-op figures are
// for the batch.
func BenchmarkSubmitMany(b *testing.B) {
	_, c := benchSetup(b)
	ctx := context.Background()
	const n = 1000
	payload := json.RawMessage(`{"text":"is this spam?"}`)
	batch := 0
	b.ReportAllocs()
	for b.Loop() {
		batch++
		tasks := make([]protocol.Task, n)
		for i := range tasks {
			tasks[i] = protocol.Task{ID: fmt.Sprintf("b%d-%d", batch, i), Type: "classify", Payload: payload}
		}
		_, errs := c.SubmitMany(ctx, tasks, 0)
		for _, err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/task")
}

package client_test

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/mlsched/mlsched/shared/client"
	"github.com/mlsched/mlsched/shared/natstest"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// apiTotal is the server's count of JetStream API requests so far.
func apiTotal(t testing.TB, srv *natstest.Server) uint64 {
	t.Helper()
	jsz, err := srv.Jsz(&server.JSzOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return jsz.API.Total
}

// waitAllRegistered polls until n ids are registered with the client's
// shared results consumer.
func waitAllRegistered(t testing.TB, c *client.Client, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for client.Waiting(c) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d waits registered", client.Waiting(c), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func publishResults(t testing.TB, srv *natstest.Server, ids []string) {
	t.Helper()
	for _, id := range ids {
		data, _ := json.Marshal(protocol.Result{ID: id, Status: protocol.StatusSucceeded})
		if _, err := srv.JS.PublishAsync(topology.ResultSubject(id), data); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-srv.JS.PublishAsyncComplete():
	case <-time.After(time.Minute):
		t.Fatal("results not acknowledged")
	}
}

// Concurrent Waits share one consumer: the results stream never has more
// than one consumer of the client's, the server counts a handful of
// JetStream API requests for the lot (not one per wait), every wait gets
// its own result, and the consumer goes away with Close.
func TestWaitsShareOneConsumer(t *testing.T) {
	srv, c := benchSetup(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 300
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("share-%d", i)
	}
	publishResults(t, srv, ids[:n/3]) // some are there before the wait
	before := apiTotal(t, srv)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := c.Wait(ctx, id)
			if err == nil && r.ID != id {
				err = fmt.Errorf("wait for %s got the result of %s", id, r.ID)
			}
			if err != nil {
				errs <- err
			}
		}()
	}
	waitAllRegistered(t, c, n-n/3)
	s, err := srv.JS.Stream(ctx, topology.StreamResults)
	if err != nil {
		t.Fatal(err)
	}
	// The ordered consumer is created as it starts consuming: wait for it,
	// then hold it to one.
	polls := 0
	consumers := func() int {
		polls++
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Consumers
	}
	for deadline := time.Now().Add(10 * time.Second); consumers() == 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if got := consumers(); got != 1 {
		t.Fatalf("%d consumers on the results stream while %d waits wait, want 1", got, n-n/3)
	}
	publishResults(t, srv, ids[n/3:])
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// The info request above and the consumer's creation; allow a few more
	// (a consumer reset), never one per wait.
	if d := apiTotal(t, srv) - before - uint64(polls); d > 10 {
		t.Fatalf("%d JetStream API requests for %d waits", d, n)
	}
	c.Close() // stops the consumer; the server removes it (asynchronously)
	deadline := time.Now().Add(20 * time.Second)
	for {
		info, err := s.Info(ctx)
		if err == nil && info.State.Consumers == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after Close: consumers left (info %+v, err %v), want 0", info, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// WaitAll through the shared consumer: results stored before and after.
func TestWaitAllSharedConsumer(t *testing.T) {
	srv, c := benchSetup(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ids := make([]string, 500)
	for i := range ids {
		ids[i] = fmt.Sprintf("all-%d", i)
	}
	publishResults(t, srv, ids[:250])
	done := make(chan error, 1)
	seen := map[string]int{}
	var got atomic.Int64
	go func() {
		done <- c.WaitAll(ctx, append(ids, ids[0]), func(r *protocol.Result) { seen[r.ID]++; got.Add(1) })
	}()
	// Every id is registered, and the stored ones may already be answered
	// (the consumer replays them): waiting plus answered is all of them.
	// (Waiting alone reaches 500 only for a moment, which a starved poll
	// missed: CI, 0 of 500 after a minute, once WaitAll had given up.)
	for deadline := time.Now().Add(time.Minute); client.Waiting(c)+int(got.Load()) < len(ids); {
		select {
		case err := <-done:
			t.Fatalf("WaitAll returned before the rest were stored: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d waiting and %d answered of %d", client.Waiting(c), got.Load(), len(ids))
		}
		time.Sleep(5 * time.Millisecond) // poll interval
	}
	publishResults(t, srv, ids[250:])
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if seen[id] != 1 {
			t.Fatalf("%s seen %d times", id, seen[id])
		}
	}
}

// BenchmarkWaitConcurrent: 10 000 Waits at once on one client, then their
// results. Reported per op (the 10 000): JetStream API requests the server
// counted, and the heap the registered waits hold per wait (goroutine stacks
// are the caller's and not counted).
func BenchmarkWaitConcurrent(b *testing.B) {
	srv, c := benchSetup(b)
	ctx := context.Background()
	const n = 10_000
	round := 0
	var apiReqs, heapPerWait float64
	for b.Loop() {
		round++
		ids := make([]string, n)
		for i := range ids {
			ids[i] = fmt.Sprintf("bw%d-%d", round, i)
		}
		runtime.GC()
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		before := apiTotal(b, srv)
		var wg sync.WaitGroup
		for _, id := range ids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := c.Wait(ctx, id); err != nil {
					b.Error(err)
				}
			}()
		}
		waitAllRegistered(b, c, n)
		runtime.GC()
		runtime.ReadMemStats(&m1)
		heapPerWait += (float64(m1.HeapAlloc) - float64(m0.HeapAlloc)) / n
		publishResults(b, srv, ids)
		wg.Wait()
		apiReqs += float64(apiTotal(b, srv) - before)
	}
	b.ReportMetric(apiReqs/float64(round), "js-api-req/op")
	b.ReportMetric(heapPerWait/float64(round), "heap-B/wait")
}

package jsplumb_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/shared/jsplumb"
	"github.com/mlsched/mlsched/shared/natstest"
)

// Follow applies the bucket's current contents, says ready once, then
// applies every later put and delete in order, and ticks.
func TestFollow(t *testing.T) {
	t.Parallel()
	ns := natstest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	kv, err := ns.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "W", Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "a", []byte("1")); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	state := map[string]string{}
	ready, ticked, done := make(chan struct{}), make(chan struct{}, 1), make(chan struct{})
	readies := 0
	go func() {
		defer close(done)
		jsplumb.Follow(ctx, kv, func(e jetstream.KeyValueEntry) {
			mu.Lock()
			defer mu.Unlock()
			if e.Operation() == jetstream.KeyValuePut {
				state[e.Key()] = string(e.Value())
			} else {
				delete(state, e.Key())
			}
		}, func() { readies++; close(ready) }, jsplumb.FollowOptions{Log: zerolog.Nop(), Tick: 10 * time.Millisecond,
			OnTick: func() {
				select {
				case ticked <- struct{}{}:
				default:
				}
			}})
	}()
	select {
	case <-ready:
	case <-time.After(10 * time.Second):
		t.Fatal("not ready")
	}
	mu.Lock()
	if state["a"] != "1" {
		t.Errorf("initial contents not applied before ready: %v", state)
	}
	mu.Unlock()
	if _, err := kv.Put(ctx, "b", []byte("2")); err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		ok := len(state) == 1 && state["b"] == "2"
		mu.Unlock()
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("updates not applied: %v", state)
		}
		time.Sleep(5 * time.Millisecond)
	}
	select {
	case <-ticked:
	case <-time.After(10 * time.Second):
		t.Fatal("no tick")
	}
	cancel()
	<-done
	if readies != 1 {
		t.Fatalf("ready called %d times", readies)
	}
}

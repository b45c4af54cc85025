package relay_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/e2e/bench/relay"
	"github.com/mlsched/mlsched/shared/natstest"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// TestRelayMovesEveryTask pushes 200 tasks through a relay to two sinks on
// an embedded server: each task reaches exactly one sink with its bytes
// unchanged, the nodes share the load evenly, and both work-queue streams
// end up empty (everything was acknowledged).
func TestRelayMovesEveryTask(t *testing.T) {
	t.Parallel()
	const n = 200
	srv := natstest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, err := jetstream.New(srv.NC, jetstream.WithPublishAsyncMaxPending(64))
	if err != nil {
		t.Fatal(err)
	}

	r, err := relay.New(js, relay.Config{Nodes: []string{"a", "b"}, MaxInFlight: 32})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer r.Stop()

	var mu sync.Mutex
	got := map[string]string{} // body -> node
	var dups []string
	for _, node := range []string{"a", "b"} {
		s, err := relay.NewSink(js, relay.SinkConfig{Node: node, MaxAckPending: 16, OnMsg: func(m jetstream.Msg) {
			mu.Lock()
			defer mu.Unlock()
			if _, ok := got[string(m.Data())]; ok {
				dups = append(dups, string(m.Data()))
			}
			got[string(m.Data())] = node
		}})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Start(ctx); err != nil {
			t.Fatal(err)
		}
		defer s.Stop()
	}

	want := map[string]bool{}
	for i := range n {
		body := fmt.Sprintf(`{"id":"t-%03d","type":"bench","payload":{"n":%d}}`, i, i)
		want[body] = true
		msg := &nats.Msg{Subject: topology.TaskSubject("bench"), Data: []byte(body), Header: nats.Header{}}
		msg.Header.Set(protocol.HdrMsgID, fmt.Sprintf("t-%03d", i))
		if _, err := js.PublishMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
	}

	waitFor(t, ctx, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(got) < n {
			return fmt.Errorf("sinks got %d of %d tasks", len(got), n)
		}
		return nil
	})
	mu.Lock()
	perNode := map[string]int{}
	for body, node := range got {
		if !want[body] {
			t.Errorf("a sink got %q, which was never published", body)
		}
		perNode[node]++
	}
	if len(dups) > 0 {
		t.Errorf("tasks delivered twice: %v", dups)
	}
	mu.Unlock()
	if perNode["a"] != n/2 || perNode["b"] != n/2 {
		t.Errorf("round-robin split %v, want %d each", perNode, n/2)
	}
	waitFor(t, ctx, func() error {
		if got := r.Relayed(); got != n {
			return fmt.Errorf("relay acknowledged %d tasks", got)
		}
		// The task stream is under limits retention: an ack removes
		// nothing (the dispatcher's pruner would), so the relay's consumer
		// says whether every task was settled.
		ts, err := js.Stream(ctx, topology.StreamTasks)
		if err != nil {
			return err
		}
		ci, err := ts.Consumer(ctx, "relay")
		if err != nil {
			return err
		}
		if info := ci.CachedInfo(); info.NumPending != 0 || info.NumAckPending != 0 || info.AckFloor.Stream != uint64(n) {
			return fmt.Errorf("relay consumer: %d pending, %d unacked, ack floor %d", info.NumPending, info.NumAckPending, info.AckFloor.Stream)
		}
		for _, name := range []string{topology.StreamDispatch} {
			s, err := js.Stream(ctx, name)
			if err != nil {
				return err
			}
			info, err := s.Info(ctx)
			if err != nil {
				return err
			}
			if info.State.Msgs != 0 {
				return fmt.Errorf("%s still holds %d messages", name, info.State.Msgs)
			}
		}
		return nil
	})
	if f := r.Failed(); f != 0 {
		t.Errorf("%d republishes failed", f)
	}
}

func TestNewRejectsBadNodes(t *testing.T) {
	t.Parallel()
	if _, err := relay.New(nil, relay.Config{}); !errors.Is(err, relay.ErrNoNodes) {
		t.Errorf("no nodes: err = %v, want ErrNoNodes", err)
	}
	if _, err := relay.New(nil, relay.Config{Nodes: []string{"a.b"}}); err == nil {
		t.Error("node a.b accepted")
	}
	if _, err := relay.NewSink(nil, relay.SinkConfig{Node: ""}); err == nil {
		t.Error("sink without node accepted")
	}
}

// waitFor polls cond until it returns nil or ctx ends.
func waitFor(t *testing.T, ctx context.Context, cond func() error) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		err := cond()
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("not in time: %v", err)
		case <-tick.C:
		}
	}
}

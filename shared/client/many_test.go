package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/shared/client"
	"github.com/mlsched/mlsched/shared/natstest"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

func TestSubmitMany(t *testing.T) {
	t.Parallel()
	srv, c := setup(t)
	const n = 1000
	tasks := make([]protocol.Task, n)
	for i := range tasks {
		tasks[i] = protocol.Task{ID: fmt.Sprintf("m-%d", i), Type: "echo", Payload: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))}
	}
	tasks[10].ID = "bad id"  // invalid: fails locally
	tasks[20] = tasks[19]    // duplicate of the previous one
	tasks[30].TimeoutMs = -1 // invalid
	acks, errs := c.SubmitMany(ctx(t), tasks, 64)
	if len(acks) != n || len(errs) != n {
		t.Fatalf("%d acks, %d errs", len(acks), len(errs))
	}
	for i := range tasks {
		switch i {
		case 10:
			if protocol.CodeOf(errs[i]) != protocol.CodeInvalidID {
				t.Errorf("task 10: err %v", errs[i])
			}
		case 30:
			if protocol.CodeOf(errs[i]) != protocol.CodeInvalidTimeout {
				t.Errorf("task 30: err %v", errs[i])
			}
		case 20:
			if errs[i] != nil || !acks[i].Duplicate || acks[i].Seq != acks[19].Seq {
				t.Errorf("task 20: ack %+v err %v, want duplicate of %+v", acks[i], errs[i], acks[19])
			}
		default:
			if errs[i] != nil || acks[i].Duplicate || acks[i].Seq == 0 {
				t.Fatalf("task %d: ack %+v err %v", i, acks[i], errs[i])
			}
		}
	}
	s, _ := srv.JS.Stream(ctx(t), topology.StreamTasks)
	info, err := s.Info(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != n-3 {
		t.Fatalf("stream holds %d tasks, want %d", info.State.Msgs, n-3)
	}
	// Order is kept: every task sits at the sequence its ack reports.
	for _, i := range []int{0, 1, 500, n - 1} {
		m, err := s.GetMsg(ctx(t), acks[i].Seq)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := json.Marshal(tasks[i])
		if string(m.Data) != string(want) || m.Header.Get(protocol.HdrMsgID) != tasks[i].ID {
			t.Errorf("seq %d holds %s (%s), want task %d", acks[i].Seq, m.Data, m.Header.Get(protocol.HdrMsgID), i)
		}
	}
}

func TestSubmitManyCreatesStreamsAndHonoursContext(t *testing.T) {
	t.Parallel()
	srv := natstest.New(t)
	c := client.New(srv.JS, client.WithTopology(topology.Config{Storage: jetstream.MemoryStorage}))
	acks, errs := c.SubmitMany(ctx(t), []protocol.Task{{ID: "a", Type: "echo"}}, 0)
	if errs[0] != nil || acks[0].Seq != 1 {
		t.Fatalf("ack %+v err %v", acks[0], errs[0])
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	_, errs = c.SubmitMany(cancelled, []protocol.Task{{ID: "b", Type: "echo"}, {ID: "c", Type: "echo"}}, 1)
	for i, err := range errs {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("task %d: err %v, want canceled", i, err)
		}
	}
	if acks, errs := c.SubmitMany(ctx(t), nil, 0); len(acks) != 0 || len(errs) != 0 {
		t.Errorf("empty batch: %v %v", acks, errs)
	}
}

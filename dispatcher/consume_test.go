package dispatcher_test

import (
	"testing"

	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// Consumers can be deleted under a running dispatcher (an operator, an
// InactiveThreshold, a server restart): it re-creates them and carries on.
func TestConsumerDeletedUnderTheDispatcherIsRecreated(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.startNode("n1", []string{"echo"}, map[string]behavior{"m1": succeed})
	e.submit(protocol.Task{ID: "c1", Type: "echo"})
	e.result("c1")
	for _, stream := range []string{topology.StreamTasks, topology.StreamOutcomes} {
		s, err := e.ns.JS.Stream(e.ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteConsumer(e.ctx, topology.ConsumerDispatcher); err != nil {
			t.Fatal(err)
		}
	}
	e.submit(protocol.Task{ID: "c2", Type: "echo"})
	if res := e.result("c2"); res.Status != protocol.StatusSucceeded {
		t.Fatalf("after consumer deletion: %+v", res)
	}
}

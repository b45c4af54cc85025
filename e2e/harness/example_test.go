package harness_test

import (
	"context"
	"testing"

	"github.com/mlsched/mlsched/e2e/harness"
	"github.com/mlsched/mlsched/shared/client"
	"github.com/mlsched/mlsched/shared/protocol"
)

// A whole cluster as processes: every process is killed when the test ends,
// and their logs are printed if it failed.
func Example() {
	var t *testing.T // the test's t

	c := harness.New(t)
	c.StartNATS()  // nats-server, JetStream on file storage, sync_interval always
	c.StartRedis() // redis-server without persistence
	d := c.StartDispatcher(harness.DispatcherOptions{Policy: "thompson"})
	c.StartWorker(harness.WorkerOptions{NodeID: "node-1", ModelsFile: "testdata/node-1.yaml"})

	_, js := c.Connect()
	res, err := client.New(js).Submit(context.Background(), protocol.Task{ID: "t1", Type: "classify"})
	_, _ = res, err

	_ = d.Restart()    // SIGTERM, start again, wait until it answers
	c.NATS.Kill()      // SIGKILL
	_ = c.NATS.Start() // same port and store
	_, _ = d.Stats(context.Background())
}

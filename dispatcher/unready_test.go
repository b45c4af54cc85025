package dispatcher_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/mlsched/mlsched/dispatcher"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// A task whose only candidates are hosted but unready is rejected at once,
// naming them and why (issue 22: `submit -type classify -wait` waited a
// silent MLSCHED_NO_NODE_WAIT, 30 s, then said no node announces a model).
// A model only cooling down after a 429 is expected back: its tasks wait.
func TestOnlyUnreadyCandidatesRejectAtOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *dispatcher.Config) { c.NoNodeWait = 10 * time.Minute })
	e.startNode("n-ok", []string{"echo"}, map[string]behavior{"echo": succeed})
	kv, err := topology.EnsureNodesBucket(e.ctx, e.ns.JS, topology.Config{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	hb, _ := json.Marshal(protocol.Heartbeat{Node: "n-remote", Capacity: 4, StartedAt: now, SentAt: now,
		Unready: []protocol.UnreadyModel{
			{Name: "remote", Types: []string{"classify"}, Reason: "GET http://127.0.0.1:9000/healthz: connection refused"},
			{Name: "throttled", Types: []string{"busy"}, Reason: "cooling down for 1s after the server's Retry-After", Transient: true},
		}})
	if _, err := kv.Put(e.ctx, "n-remote", hb); err != nil {
		t.Fatal(err)
	}
	e.waitFor("the node with unready models", func() bool {
		for _, n := range e.d.Report().Nodes {
			if n.Node == "n-remote" {
				return true
			}
		}
		return false
	})
	start := time.Now()
	e.submit(protocol.Task{ID: "c1", Type: "classify"})
	res := e.result("c1")
	if res.Status != protocol.StatusRejected || res.ErrorCode != protocol.CodeNoModel ||
		!strings.Contains(res.Error, "remote on n-remote") || !strings.Contains(res.Error, "connection refused") {
		t.Fatalf("result %+v: want rejected no_model naming remote on n-remote and why", res)
	}
	if waited := time.Since(start); waited > time.Minute {
		t.Fatalf("rejected after %v: it waited for a node", waited)
	}
	e.submit(protocol.Task{ID: "b1", Type: "busy"})
	time.Sleep(500 * time.Millisecond) // long enough for a wrong rejection to be stored
	if res, ok := e.lastResult("b1"); ok {
		t.Fatalf("a task whose model is only cooling down was not kept waiting: %+v", res)
	}
}

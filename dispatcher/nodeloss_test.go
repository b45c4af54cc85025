package dispatcher_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/mlsched/mlsched/dispatcher"
	"github.com/mlsched/mlsched/shared/protocol"
)

// A node that dies with attempts in flight (its heartbeats stop): its
// attempts are failed over once the registry drops it, within the node TTL
// and a sweep, not at their 30 s deadlines; they are recorded node_lost,
// and the model they ran is not blamed (no timeout counted against it).
func TestNodeDeathFailsOverAtOnceWithoutBlamingTheModel(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second
	e := newEnv(t, func(c *dispatcher.Config) {
		c.NodeTTL = ttl
		c.TaskTimeout = 30 * time.Second
		c.DeadlineSlack = 5 * time.Second
	})
	dead := e.startNode("dead", []string{"nl"}, map[string]behavior{"m": succeed})
	dead.silent.Store(true) // takes its dispatches and never answers
	const n = 6             // within its 8 slots: every one is sent to it
	for i := range n {
		e.submit(protocol.Task{ID: fmt.Sprintf("nl%d", i), Type: "nl", TimeoutMs: 30_000}) // a deadline 35 s away
	}
	e.waitFor("every task on the node", func() bool { return len(dead.attempts()) == n })
	e.startNode("alive", []string{"nl"}, map[string]behavior{"m": succeed})
	e.waitTableKnows("alive")
	killed := time.Now()
	dead.gone.Store(true) // its heartbeats stop: a kill -9
	for i := range n {
		res := e.result(fmt.Sprintf("nl%d", i))
		if res.Status != protocol.StatusSucceeded {
			t.Fatalf("nl%d: %+v", i, res)
		}
		if res.Attempts != 2 || len(res.History) != 2 || res.History[0].Status != protocol.OutcomeNodeLost || !strings.Contains(res.History[0].Error, "left the registry") {
			t.Fatalf("nl%d's attempts %+v, want the first node_lost on the dead node, then a success", i, res.History)
		}
	}
	if took := time.Since(killed); took > ttl+5*time.Second {
		t.Fatalf("the dead node's tasks took %v after it died, want within its TTL %v + 5s", took, ttl)
	}
	e.waitFor("the outcomes in the statistics", func() bool {
		for _, m := range e.stats().Models {
			if m.Name == "m" && m.Successes >= n {
				return true
			}
		}
		return false
	})
	for _, m := range e.stats().Models {
		if m.Name == "m" && (m.Timeouts != 0 || m.ModelErrors != 0) {
			t.Fatalf("model m blamed for its node's death: %d timeouts, %d model errors", m.Timeouts, m.ModelErrors)
		}
	}
}

// A node restarted within its TTL (a worker killed and started again: its
// heartbeats go on, from a new process) never leaves the registry; the
// attempts it held are unanswered at their deadlines. They are the node's
// loss, not the model's: recorded node_lost, the model not blamed, and
// the retry free to go back to it on another node.
func TestNodeRestartLosesAttemptsWithoutBlamingTheModel(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *dispatcher.Config) {
		c.TaskTimeout = 2 * time.Second
		c.DeadlineSlack = time.Second
	})
	re := e.startNode("restarted", []string{"rs"}, map[string]behavior{"m": succeed})
	re.silent.Store(true) // takes its dispatches and never answers: they died with the old process
	const n = 3
	for i := range n {
		e.submit(protocol.Task{ID: fmt.Sprintf("rs%d", i), Type: "rs", TimeoutMs: 2000})
	}
	e.waitFor("every task on the node", func() bool { return len(re.attempts()) == n })
	re.restart()
	e.startNode("other", []string{"rs"}, map[string]behavior{"m": succeed})
	e.waitTableKnows("other")
	for i := range n {
		res := e.result(fmt.Sprintf("rs%d", i))
		if res.Status != protocol.StatusSucceeded || len(res.History) != 2 {
			t.Fatalf("rs%d: %+v", i, res)
		}
		if h := res.History[0]; h.Status != protocol.OutcomeNodeLost || !strings.Contains(h.Error, "restarted") {
			t.Fatalf("rs%d's first attempt %+v, want node_lost: its node restarted", i, h)
		}
		if res.History[1].Model != "m" {
			t.Fatalf("rs%d's retry went to %s, want m again (not blamed)", i, res.History[1].Model)
		}
	}
	e.waitFor("the outcomes in the statistics", func() bool {
		for _, m := range e.stats().Models {
			if m.Name == "m" && m.Successes >= n {
				return true
			}
		}
		return false
	})
	for _, m := range e.stats().Models {
		if m.Name == "m" && (m.Timeouts != 0 || m.ModelErrors != 0) {
			t.Fatalf("model m blamed for its node's restart: %d timeouts, %d model errors", m.Timeouts, m.ModelErrors)
		}
	}
}

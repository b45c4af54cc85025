package dispatcher_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/dispatcher"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// A tenant that floods a band while another sends to it is parked beyond
// MLSCHED_PARK_ABOVE held tasks: the band's pull window (2 x
// MLSCHED_MAX_IN_FLIGHT = 64 here) stays open, so a task of the other
// tenant submitted after the whole flood is held at once, and goes among
// the first when capacity returns. Without parking it would wait in the
// stream behind the flood (more than 200 tasks). Every task still gets
// exactly one result, and no dispatch is an inversion.
func TestTenantFloodIsParked(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *dispatcher.Config) { c.MaxInFlight, c.ParkAbove = 32, 8 })
	e.queued = 100_000 // saturated: everything is held
	busy := e.startNode("busy", []string{"f"}, map[string]behavior{"m": succeed})
	// Parked tasks are group-committed, as results are (the wiring is
	// TestResultsAndParkedTasksAreGroupCommitted's): how many form batches
	// depends on how fast the server acknowledges, so it is only reported.
	var parkedStored, parkedBatched atomic.Int64
	oc, err := e.ns.JS.OrderedConsumer(e.ctx, topology.StreamTasks, jetstream.OrderedConsumerConfig{
		FilterSubjects: topology.ParkedFilters()})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := oc.Consume(func(m jetstream.Msg) {
		parkedStored.Add(1)
		if m.Headers().Get("Nats-Batch-Id") != "" {
			parkedBatched.Add(1)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	submit := func(id, tenant string) {
		data, _ := json.Marshal(protocol.Task{ID: id, Type: "f", Tenant: tenant, TimeoutMs: 60_000})
		e.publish(topology.TaskSubject("f"), data, id)
	}
	var ids []string
	for i := range 300 {
		if i%60 == 0 {
			submit(fmt.Sprint("b", i), "b")
			ids = append(ids, fmt.Sprint("b", i))
		}
		submit(fmt.Sprint("a", i), "a")
		ids = append(ids, fmt.Sprint("a", i))
	}
	submit("blast", "b")
	ids = append(ids, "blast")
	e.waitFor("b's last task held behind the parked flood", func() bool {
		for _, h := range e.d.Report().HeldBy {
			if h.Tenant == "b" && h.Held == 6 {
				return true
			}
		}
		return false
	})
	if n := e.d.Counters().Parked.Load(); n < 200 {
		t.Fatalf("parked %d of a's tasks, want most of the flood (≥ 200)", n)
	}
	e.waitFor("every parked task seen in the stream", func() bool { return parkedStored.Load() >= e.d.Counters().Parked.Load() })
	t.Logf("%d of %d parked tasks stored in atomic batches", parkedBatched.Load(), parkedStored.Load())
	busy.queued.Store(0)
	busy.beat()
	for _, id := range ids {
		if res := e.result(id); res.Status != protocol.StatusSucceeded {
			t.Fatalf("%s: %+v", id, res)
		}
	}
	order := busy.attempts() // "id/attempt/model", in dispatch order
	pos := slices.IndexFunc(order, func(s string) bool { return strings.HasPrefix(s, "blast/") })
	if pos < 0 || pos > 30 {
		t.Fatalf("b's last task was dispatched at position %d of %d, want among the first 30 (fair order, not behind the flood)", pos, len(order))
	}
	if len(order) != len(ids) {
		t.Fatalf("%d dispatches for %d tasks", len(order), len(ids))
	}
	for _, id := range ids {
		if n := e.resultCount(id); n != 1 {
			t.Fatalf("%s: %d results, want 1", id, n)
		}
	}
	if n := e.d.Counters().Inversions.Load(); n != 0 {
		t.Fatalf("inversions = %d, want 0", n)
	}
	if r := e.d.Report(); r.Counters["parked"] != e.d.Counters().Parked.Load() {
		t.Fatalf("stats report parked = %d, counter %d", r.Counters["parked"], e.d.Counters().Parked.Load())
	}
}

// A single tenant is never parked, however deep its backlog: with nobody
// to be fair to, parking would only cost a publish per task.
func TestSingleTenantIsNotParked(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *dispatcher.Config) { c.MaxInFlight, c.ParkAbove = 32, 8 })
	e.queued = 100_000
	busy := e.startNode("busy", []string{"s"}, map[string]behavior{"m": succeed})
	for i := range 100 {
		e.submit(protocol.Task{ID: fmt.Sprint("s", i), Type: "s", TimeoutMs: 60_000})
	}
	e.waitFor("the window held", func() bool { return e.d.Report().Held >= 60 })
	busy.queued.Store(0)
	busy.beat()
	for i := range 100 {
		if res := e.result(fmt.Sprint("s", i)); res.Status != protocol.StatusSucceeded {
			t.Fatalf("s%d: %+v", i, res)
		}
	}
	if n := e.d.Counters().Parked.Load(); n != 0 {
		t.Fatalf("parked %d tasks of the only tenant, want 0", n)
	}
}

// A message on a parked subject without the headers the dispatcher adds
// (a producer publishing there) is rejected with a clear error, not run
// and not dropped.
func TestParkedSubjectWithoutHeadersIsRejected(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *dispatcher.Config) { c.MaxInFlight, c.ParkAbove = 32, 8 })
	n := e.startNode("n", []string{"p"}, map[string]behavior{"m": succeed})
	// a tenant's parked subject is consumed once a replica sees tasks there
	data, _ := json.Marshal(protocol.Task{ID: "forged1", Type: "p", Tenant: "z"})
	m := &nats.Msg{Subject: topology.ParkedSubject(topology.BandNormal, "z"), Data: data, Header: nats.Header{}}
	if _, err := e.ns.JS.PublishMsg(e.ctx, m); err != nil {
		t.Fatal(err)
	}
	res := e.result("forged1")
	if res.Status != protocol.StatusRejected || res.ErrorCode != protocol.CodeInvalidField || !strings.Contains(res.Error, "parks") {
		t.Fatalf("result = %+v, want rejected with %s naming the parking subject", res, protocol.CodeInvalidField)
	}
	if got := n.attempts(); len(got) != 0 {
		t.Fatalf("the node got %v", got)
	}
}

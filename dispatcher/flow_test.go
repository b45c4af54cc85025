package dispatcher_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mlsched/mlsched/dispatcher"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// A task whose deadline_ms passes while every candidate is saturated is
// never sent: it fails with code expired, after 0 attempts, with a
// retry_after_ms, and is not dead-lettered (its answer is worthless now).
func TestExpiredHeldTaskIsNeverStarted(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.queued = 100_000 // on 8 slots: hours of work
	busy := e.startNode("busy", []string{"s"}, map[string]behavior{"m": succeed})
	e.submit(protocol.Task{ID: "exp1", Type: "s", TimeoutMs: 60_000, DeadlineMs: 300})
	res := e.result("exp1")
	if res.Status != protocol.StatusFailed || res.ErrorCode != protocol.CodeExpired || res.Attempts != 0 {
		t.Fatalf("result = %+v, want failed with %s after 0 attempts", res, protocol.CodeExpired)
	}
	if res.RetryAfterMs <= 0 {
		t.Fatalf("retry_after_ms = %d, want > 0", res.RetryAfterMs)
	}
	if got := busy.attempts(); len(got) != 0 {
		t.Fatalf("the node got %v", got)
	}
	if n := e.d.Counters().Expired.Load(); n != 1 {
		t.Fatalf("expired counter = %d, want 1", n)
	}
	for _, dl := range e.deadLetters() {
		if dl.TaskID == "exp1" {
			t.Fatalf("an expired task was dead-lettered: %+v", dl)
		}
	}
}

// The dispatch of a task with a deadline carries that deadline (not the
// attempt's longer timeout plus slack), so that a worker does not start it
// late; an attempt lost past it is not retried: the task fails expired.
func TestDispatchCarriesTaskDeadline(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	hung := e.startNode("hung", []string{"d"}, map[string]behavior{"m": succeed})
	hung.silent.Store(true) // never answers: the sweeper finds the attempt lost at its deadline
	before := time.Now()
	e.submit(protocol.Task{ID: "dl1", Type: "d", TimeoutMs: 60_000, MaxAttempts: 3, DeadlineMs: 800})
	res := e.result("dl1") // without the cap the attempt would be lost after 70 s
	if res.Status != protocol.StatusFailed || res.ErrorCode != protocol.CodeExpired || res.Attempts != 1 {
		t.Fatalf("result = %+v, want failed with %s after 1 attempt", res, protocol.CodeExpired)
	}
	hung.mu.Lock()
	h := hung.headers[0]
	n := len(hung.headers)
	hung.mu.Unlock()
	if n != 1 {
		t.Fatalf("%d dispatches, want 1: a task past its deadline is not retried", n)
	}
	pd, err := protocol.ParseDispatch(h)
	if err != nil {
		t.Fatal(err)
	}
	if limit := before.Add(800*time.Millisecond + time.Second); pd.Deadline.After(limit) {
		t.Fatalf("dispatch deadline %s, want at most the task's (about %s)", pd.Deadline, before.Add(800*time.Millisecond))
	}
}

// A node may refuse to start an attempt whose deadline leaves too little
// time for the model's run (outcome expired, worker/task.go). When that
// deadline is the task's own (deadline_ms, capped), retrying would meet it
// again: the task fails expired after that one attempt, not
// attempts_exhausted after three. When it is only the attempt's (timeout
// plus slack), the task is retried as before.
func TestNodeRefusalAtTaskDeadlineEndsExpired(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var refused atomic.Int32
	n := e.startNode("n", []string{"x"}, map[string]behavior{"m": func(task protocol.Task, attempt int) (protocol.OutcomeStatus, string) {
		if task.ID == "own" || attempt == 1 {
			refused.Add(1)
			return protocol.OutcomeExpired, "deadline leaves 30ms, less than the model's mean run of 200ms on this node: not started"
		}
		return protocol.OutcomeSuccess, ""
	}})
	e.submit(protocol.Task{ID: "own", Type: "x", TimeoutMs: 60_000, MaxAttempts: 3, DeadlineMs: 5_000})
	res := e.result("own")
	if res.Status != protocol.StatusFailed || res.ErrorCode != protocol.CodeExpired || res.Attempts != 1 {
		t.Fatalf("own: %+v, want failed %s after 1 attempt", res, protocol.CodeExpired)
	}
	e.submit(protocol.Task{ID: "attempt", Type: "x", TimeoutMs: 1_000, MaxAttempts: 3, DeadlineMs: 60_000})
	if res := e.result("attempt"); res.Status != protocol.StatusSucceeded || res.Attempts != 2 {
		t.Fatalf("attempt: %+v, want succeeded on the second attempt", res)
	}
	if got := len(n.attempts()); got != 3 {
		t.Fatalf("%d dispatches (%v), want 3: one of own, two of attempt", got, n.attempts())
	}
}

// Band subjects: a task on its priority's band subject runs; on another
// band's it is rejected with band_mismatch; today's subject takes any
// priority.
func TestPriorityBandSubjects(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.startNode("n1", []string{"b"}, map[string]behavior{"m": succeed})
	publish := func(subject string, task protocol.Task) {
		data, _ := json.Marshal(task)
		e.publish(subject, data, task.ID)
	}
	publish(topology.BandTaskSubject("b", 7), protocol.Task{ID: "hi1", Type: "b", Priority: 7})
	publish(topology.BandTaskSubject("b", -2), protocol.Task{ID: "lo1", Type: "b", Priority: -2, Tenant: "acme"})
	publish(topology.TaskSubject("b"), protocol.Task{ID: "old1", Type: "b", Priority: 7})
	publish(topology.BandTaskSubject("b", 7), protocol.Task{ID: "bad1", Type: "b", Priority: -3})
	publish("mlsched.tasks.b.x.y", protocol.Task{ID: "bad2", Type: "b"})
	for _, id := range []string{"hi1", "lo1", "old1"} {
		if res := e.result(id); res.Status != protocol.StatusSucceeded {
			t.Fatalf("%s: %+v", id, res)
		}
	}
	if res := e.result("bad1"); res.Status != protocol.StatusRejected || res.ErrorCode != protocol.CodeBandMismatch {
		t.Fatalf("bad1: %+v, want rejected with %s", res, protocol.CodeBandMismatch)
	}
	if res := e.result("bad2"); res.Status != protocol.StatusRejected || res.ErrorCode != protocol.CodeTypeMismatch {
		t.Fatalf("bad2: %+v, want rejected with %s", res, protocol.CodeTypeMismatch)
	}
}

// Held tasks go on highest priority first when capacity returns, whatever
// their submission order, and no dispatch is an inversion.
func TestHeldTasksGoHighestPriorityFirst(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.queued = 100_000 // saturated: everything is held
	busy := e.startNode("busy", []string{"p"}, map[string]behavior{"m": succeed})
	prios := []int{-5, 0, 5, 0, -5, 9, 0, 5, -5, 0, 5, -1, 0, 9, 0}
	for i, p := range prios {
		data, _ := json.Marshal(protocol.Task{ID: fmt.Sprintf("p%d", i), Type: "p", Priority: p, TimeoutMs: 60_000,
			Tenant: []string{"a", "b"}[i%2]})
		e.publish(topology.BandTaskSubject("p", p), data, fmt.Sprintf("p%d", i))
	}
	e.waitFor("every task held", func() bool { return e.d.Report().Held == len(prios) })
	busy.queued.Store(0)
	busy.beat()
	for i := range prios {
		if res := e.result(fmt.Sprintf("p%d", i)); res.Status != protocol.StatusSucceeded {
			t.Fatalf("p%d: %+v", i, res)
		}
	}
	byID := map[string]int{}
	for i, p := range prios {
		byID[fmt.Sprintf("p%d", i)] = p
	}
	last := protocol.MaxPriority
	for _, s := range busy.attempts() { // "id/attempt/model", in dispatch order
		p := byID[strings.SplitN(s, "/", 2)[0]]
		if p > last {
			t.Fatalf("dispatch order %v: priority %d after %d", busy.attempts(), p, last)
		}
		last = p
	}
	if n := e.d.Counters().Inversions.Load(); n != 0 {
		t.Fatalf("inversions = %d, want 0", n)
	}
	if r := e.d.Report(); r.Counters["inversions"] != 0 {
		t.Fatalf("stats report inversions = %d", r.Counters["inversions"])
	}
}

// A held task saturated only because little of its own deadline is left
// does not hold back its type: a younger task of the same priority that a
// node can still start in time goes at the next pass, while the older one
// waits to expire (issue 20: it blocked its type until then).
func TestHoldOwnDeadlineDoesNotBlockType(t *testing.T) {
	t.Parallel()
	// deadlines alone (no queue target): the node's queue is long, not
	// too long for young's deadline
	e := newEnv(t, func(c *dispatcher.Config) { c.QueueTarget = -1 })
	// 4000 queued on 8 slots at the engine's prior 100 ms a task: about
	// 50 s of wait, within a 60 s timeout but not within a 30 s deadline.
	e.queued = 4000
	busy := e.startNode("busy", []string{"o"}, map[string]behavior{"m": succeed})
	e.submit(protocol.Task{ID: "near", Type: "o", TimeoutMs: 60_000, DeadlineMs: 30_000})
	e.waitFor("the task with a deadline held", func() bool { return e.d.Report().Held == 1 })
	e.submit(protocol.Task{ID: "young", Type: "o", TimeoutMs: 60_000})
	if res := e.result("young"); res.Status != protocol.StatusSucceeded {
		t.Fatalf("young: %+v, want succeeded while the older task waits", res)
	}
	if n := e.d.Counters().Expired.Load(); n != 0 {
		t.Fatalf("expired = %d: the younger task went only once the older one expired", n)
	}
	if got := busy.attempts(); len(got) != 1 || !strings.HasPrefix(got[0], "young/") {
		t.Fatalf("the node got %v, want only young's attempt", got)
	}
	if r := e.d.Report(); r.Held != 1 || r.Counters["inversions"] != 0 {
		t.Fatalf("held %d, inversions %d; want the near-deadline task still held and 0", r.Held, r.Counters["inversions"])
	}
}

// A sheddable task that cannot start before its deadline is shed, not
// expired: code shed, retry_after_ms, counted, not dead-lettered.
func TestSheddableHeldTaskIsShed(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.queued = 100_000
	busy := e.startNode("busy", []string{"s"}, map[string]behavior{"m": succeed})
	data, _ := json.Marshal(protocol.Task{ID: "shed1", Type: "s", TimeoutMs: 60_000, DeadlineMs: 2000, Priority: -3})
	e.publish(topology.BandTaskSubject("s", -3), data, "shed1")
	res := e.result("shed1")
	if res.Status != protocol.StatusFailed || res.ErrorCode != protocol.CodeShed || res.RetryAfterMs <= 0 {
		t.Fatalf("result = %+v, want failed with %s and retry_after_ms", res, protocol.CodeShed)
	}
	if got := busy.attempts(); len(got) != 0 {
		t.Fatalf("the node got %v", got)
	}
	if n := e.d.Counters().ShedFlow.Load(); n != 1 {
		t.Fatalf("shed counter = %d, want 1", n)
	}
	for _, dl := range e.deadLetters() {
		if dl.TaskID == "shed1" {
			t.Fatalf("a shed task was dead-lettered: %+v", dl)
		}
	}
}

// A tenant over its rate quota: held until it may go (all succeed, later),
// or with MLSCHED_QUOTA_REJECT rejected at once with quota_exceeded and
// retry_after_ms; other tenants are not limited.
func TestTenantRateQuota(t *testing.T) {
	t.Parallel()
	for _, reject := range []bool{false, true} {
		t.Run(fmt.Sprint("reject=", reject), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, func(c *dispatcher.Config) {
				c.TenantRates = map[string]string{"a": "4"}
				c.QuotaReject = reject
			})
			e.startNode("n1", []string{"q"}, map[string]behavior{"m": succeed})
			const n = 12
			start := time.Now()
			for i := range n {
				e.submit(protocol.Task{ID: fmt.Sprintf("qa%d", i), Type: "q", Tenant: "a", TimeoutMs: 30_000})
				e.submit(protocol.Task{ID: fmt.Sprintf("qb%d", i), Type: "q", Tenant: "b"})
			}
			succeeded, rejected := 0, 0
			for i := range n {
				if res := e.result(fmt.Sprintf("qb%d", i)); res.Status != protocol.StatusSucceeded {
					t.Fatalf("tenant b, without a quota: %+v", res)
				}
				res := e.result(fmt.Sprintf("qa%d", i))
				switch {
				case res.Status == protocol.StatusSucceeded:
					succeeded++
				case res.Status == protocol.StatusRejected && res.ErrorCode == protocol.CodeQuotaExceeded && res.RetryAfterMs > 0:
					rejected++
				default:
					t.Fatalf("tenant a: %+v", res)
				}
			}
			elapsed := time.Since(start).Seconds()
			if limit := 4*elapsed + 1 + 1; float64(succeeded) > limit {
				t.Fatalf("%d of tenant a's tasks admitted in %.1fs, quota 4/s allows at most %.0f", succeeded, elapsed, limit)
			}
			if reject && rejected == 0 || !reject && succeeded != n {
				t.Fatalf("reject=%v: %d succeeded, %d rejected", reject, succeeded, rejected)
			}
			if e.d.Counters().OverQuota.Load() == 0 {
				t.Fatal("over_quota not counted")
			}
		})
	}
}

// Over its rate quota, a tenant's held tasks with a deadline get the tokens
// newest first: the oldest would start with little of their deadline left
// (adaptive LIFO). Every task still runs, within its deadline here.
func TestTenantRateQuotaServesNewestFirst(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *dispatcher.Config) { c.TenantRates = map[string]string{"a": "4"} })
	n := e.startNode("n1", []string{"q"}, map[string]behavior{"m": succeed})
	const k = 8
	for i := range k {
		e.submit(protocol.Task{ID: fmt.Sprintf("qa%d", i), Type: "q", Tenant: "a", DeadlineMs: 30_000})
	}
	for i := range k {
		if res := e.result(fmt.Sprintf("qa%d", i)); res.Status != protocol.StatusSucceeded {
			t.Fatalf("qa%d: %+v", i, res)
		}
	}
	pos := func(id string) int {
		for i, s := range n.attempts() {
			if strings.HasPrefix(s, id+"/") {
				return i
			}
		}
		return -1
	}
	// qa0 (maybe qa1) is let in on arrival; the held rest go newest first.
	last, second := pos(fmt.Sprintf("qa%d", k-1)), pos("qa2")
	if last < 0 || second < 0 || last > second {
		t.Fatalf("dispatch order %v: the newest held task (qa%d) must go before the older qa2", n.attempts(), k-1)
	}
}

// A tenant at its concurrency cap (tasks dispatched, not yet finished):
// its next task is held, not sent, while other tenants' go on; it goes once
// a place frees (here: the silent node's attempts are lost at their
// deadline), or with MLSCHED_QUOTA_REJECT it is rejected at once with
// quota_exceeded and retry_after_ms.
func TestTenantConcurrencyCap(t *testing.T) {
	t.Parallel()
	for _, reject := range []bool{false, true} {
		t.Run(fmt.Sprint("reject=", reject), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, func(c *dispatcher.Config) {
				c.TenantConcurrency = map[string]string{"a": "2"}
				c.QuotaReject = reject
			})
			n := e.startNode("n1", []string{"c"}, map[string]behavior{"m": succeed})
			n.silent.Store(true)          // takes the dispatches, answers none: they stay in flight
			seen := func(id string) int { // index of its first dispatch, -1 if none
				for i, s := range n.attempts() {
					if strings.HasPrefix(s, id+"/") {
						return i
					}
				}
				return -1
			}
			e.submit(protocol.Task{ID: "ca0", Type: "c", Tenant: "a", TimeoutMs: 1000})
			e.submit(protocol.Task{ID: "ca1", Type: "c", Tenant: "a", TimeoutMs: 1000})
			e.waitFor("a's first two dispatched", func() bool { return seen("ca0") >= 0 && seen("ca1") >= 0 })
			// held up to its timeout plus slack: past the lost attempts' deadlines
			e.submit(protocol.Task{ID: "ca2", Type: "c", Tenant: "a", TimeoutMs: 10_000})
			e.submit(protocol.Task{ID: "cb0", Type: "c", Tenant: "b", TimeoutMs: 1000})
			e.waitFor("over_quota counted and b dispatched", func() bool {
				return e.d.Counters().OverQuota.Load() == 1 && seen("cb0") >= 0
			})
			if seen("ca2") >= 0 {
				t.Fatalf("tenant a (cap 2) got a third task dispatched: %v", n.attempts())
			}
			third := "ca2"
			n.silent.Store(false) // the retries of the lost attempts are answered
			if reject {
				res := e.result(third)
				if res.Status != protocol.StatusRejected || res.ErrorCode != protocol.CodeQuotaExceeded || res.RetryAfterMs <= 0 ||
					!strings.Contains(res.Error, "concurrency cap of 2") {
					t.Fatalf("over the cap: %+v, want rejected with %s and retry_after_ms", res, protocol.CodeQuotaExceeded)
				}
				return
			}
			for _, id := range []string{"ca0", "ca1", "ca2", "cb0"} {
				if res := e.result(id); res.Status != protocol.StatusSucceeded {
					t.Fatalf("%s: %+v", id, res)
				}
			}
			for _, id := range []string{"ca0", "ca1", "ca2", "cb0"} {
				if c := e.resultCount(id); c != 1 {
					t.Fatalf("%s has %d results, want 1", id, c)
				}
			}
			if e.d.Counters().Inversions.Load() != 0 {
				t.Fatal("inversions")
			}
		})
	}
}

// A task that goes first in flow control's order (an urgent one, or a
// quiet tenant's while another's are held) is sent at once to a node that
// orders its queue (Heartbeat.Prefetch), although the node is at the queue
// target: it starts there at the next free slot. A node that starts its
// queue in arrival order gets it only once the queue drains, and it waits
// in the hold meanwhile. Either way every task gets one result and no
// dispatch is an inversion.
func TestFirstTaskGoesToOrderingNode(t *testing.T) {
	t.Parallel()
	for _, prefetch := range []int{32, 0} {
		t.Run(fmt.Sprint("prefetch=", prefetch), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, func(c *dispatcher.Config) { c.QueueTarget = dispatcher.QueueTarget(150 * time.Millisecond) })
			// 24 queued on 8 slots at the engine's prior 100 ms a task:
			// a wait of 212 ms, beyond the queue target with the run, and
			// still beyond it while a heartbeat up to 160 ms old drains
			// in the load model (16 was within 60 ms of the target: a
			// loaded machine's late heartbeat made the node look free).
			e.queued, e.prefetch = 24, prefetch
			n := e.startNode("n", []string{"q"}, map[string]behavior{"m": succeed})
			// The load model drains an announced queue at the node's
			// service rate between heartbeats (16 on 8 slots in 200 ms):
			// a node that keeps 16 queued says so again and again, as a
			// busy worker does, not once a second (the env's ticker), or
			// it looks free for most of each second.
			stopBeats := make(chan struct{})
			beats := make(chan struct{})
			go func() {
				defer close(beats)
				tick := time.NewTicker(20 * time.Millisecond)
				defer tick.Stop()
				for {
					select {
					case <-stopBeats:
						return
					case <-tick.C:
						n.beat()
					}
				}
			}()
			stopBeating := sync.OnceFunc(func() { close(stopBeats); <-beats })
			t.Cleanup(stopBeating)
			submit := func(id, tenant string, priority int) {
				data, _ := json.Marshal(protocol.Task{ID: id, Type: "q", Tenant: tenant, Priority: priority, TimeoutMs: 60_000})
				e.publish(topology.BandTaskSubject("q", priority), data, id)
			}
			for i := range 10 {
				submit(fmt.Sprint("a", i), "a", 0)
			}
			e.waitFor("a's tasks held", func() bool { return e.d.Report().Held == 10 })
			submit("b0", "b", 0)
			submit("u0", "a", 5)
			if prefetch > 0 {
				e.waitFor("b0 and u0 sent", func() bool { return len(n.attempts()) >= 2 })
				first := n.attempts()[:2]
				slices.Sort(first)
				if !slices.Equal(first, []string{"b0/1/m", "u0/1/m"}) {
					t.Fatalf("first dispatches %v, want b0 and u0 before any of a's held tasks", n.attempts())
				}
			} else {
				e.waitFor("b0 and u0 held too", func() bool { return e.d.Report().Held == 12 })
				if got := n.attempts(); len(got) != 0 {
					t.Fatalf("dispatched %v to a node at its queue target that orders nothing", got)
				}
			}
			stopBeating()
			n.queued.Store(0)
			n.beat()
			for _, id := range []string{"a0", "a1", "a2", "a3", "a4", "a5", "a6", "a7", "a8", "a9", "b0", "u0"} {
				if res := e.result(id); res.Status != protocol.StatusSucceeded {
					t.Fatalf("%s: %+v", id, res)
				}
				if c := e.resultCount(id); c != 1 {
					t.Fatalf("%s: %d results, want 1", id, c)
				}
			}
			if got := n.attempts(); prefetch == 0 && got[0] != "u0/1/m" {
				t.Fatalf("dispatch order %v: the urgent task first once the queue drains", got)
			}
			if c := e.d.Counters().Inversions.Load(); c != 0 {
				t.Fatalf("inversions = %d, want 0", c)
			}
		})
	}
}

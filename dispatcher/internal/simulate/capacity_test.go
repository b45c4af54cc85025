package simulate

import (
	"context"
	"testing"

	"github.com/mlsched/mlsched/dispatcher/internal/policy"
)

// One slot for twice the load it can serve. The node is not buried: the
// load model holds back what it cannot start in time, so every attempt
// sent starts in time (no expiration, no deadline miss charged to the
// model), and the excess waits for the task's own deadline, then fails.
// About half succeed, as many as the node can serve.
func TestOverloadedNodeIsNotBuried(t *testing.T) {
	t.Parallel()
	sc, err := ParseScenario([]byte(`{
	  "arrival": {"rate": 20, "types": {"t": 1}},
	  "timeout": "500ms", "deadline_slack": "500ms", "max_attempts": 2,
	  "models": [{"name": "m", "types": ["t"], "profile": [{"at": "0s", "failure_prob": 0, "latency": {"dist": "fixed", "value": "100ms"}}]}],
	  "nodes": [{"name": "n", "capacity": 1, "models": ["m"]}]
	}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, pol := range []string{policy.Reliability, policy.RoundRobin, Oracle} {
		s, err := newSim(sc, Options{Seed: 1}.withDefaults(sc), pol)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.run(context.Background(), 2000); err != nil {
			t.Fatal(err)
		}
		r := summarize(pol, s.tasks, sc, s.opt)
		// The node serves 10 tasks/s of the 20 arriving: about half succeed.
		if r.FinalSuccess < 0.4 || r.FinalSuccess > 0.6 {
			t.Errorf("%s: final success %.3f, want about a half", pol, r.FinalSuccess)
		}
		if r.P95LatencyMs < 900 {
			t.Errorf("%s: p95 %.0fms, want the held tasks waiting up to their 1s deadline", pol, r.P95LatencyMs)
		}
		if r.QueueFailedFirst < 500 {
			t.Errorf("%s: %d tasks failed for want of capacity, want about half of 2000", pol, r.QueueFailedFirst)
		}
		snap, err := s.store.Snapshot(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		c := snap.Models["m"].Counts
		if c.Expired != 0 || c.Failures() != 0 || c.Successes == 0 {
			t.Errorf("%s: counts %+v: want successes only, no attempt expired or cut by its deadline", pol, c)
		}
	}
}

// Before a model joins, tasks of its type have no candidate: they wait for
// one up to a timeout, then fail; afterwards they run.
func TestModelJoinAndNoCandidate(t *testing.T) {
	t.Parallel()
	src := `{
	  "arrival": {"rate": 50, "types": {"t": 1}},
	  "timeout": "1s",
	  "models": [{"name": "late", "types": ["t"], "profile": [{"at": "0s", "failure_prob": 0, "latency": {"dist": "fixed", "value": "10ms"}}]}],
	  "nodes": [{"name": "n", "models": ["late"]}],
	  "events": [{"at": "10s", "kind": "model_join", "model": "late"}]
	}`
	sc, err := ParseScenario([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	for _, pol := range []string{policy.Reliability, Oracle} {
		s, err := newSim(sc, Options{Seed: 1}.withDefaults(sc), pol)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.run(context.Background(), 1500); err != nil {
			t.Fatal(err)
		}
		for i, r := range s.tasks {
			// submitted before 9s: gave up waiting; after 10s: ran first time
			switch {
			case r.submit.Seconds() < 8.9 && (r.succeeded || r.attempts != 0):
				t.Fatalf("%s: task %d at %v succeeded=%v attempts %d before the model joined", pol, i, r.submit, r.succeeded, r.attempts)
			case r.submit.Seconds() >= 10 && (!r.firstOK || r.attempts != 1):
				t.Fatalf("%s: task %d at %v: first ok %v attempts %d after the join", pol, i, r.submit, r.firstOK, r.attempts)
			}
		}
	}
}

// The target scenario: the best model's node carries at most 60%
// of the arrivals. reliability and thompson fill it and spill to the next
// best, so their first-attempt success is at least round-robin's and within
// a point of the capacity-aware oracle's, and they do not bury it: nothing
// expires in a queue, and their mean latency stays within the best model's
// queue target (3 service times of its 130 ms) and within 1.2x the
// oracle's (issue 42). Until issue 42 a wait was charged against success,
// which kept the best node's queue shorter (mean latency 1.3x
// least-loaded's, now 2.5x) at 0.1 point of first-attempt success.
// (Simulated figures of a fixed seed, not timings. The whole scenario: the
// first seconds, while the policies learn which model is second best,
// weigh too much in less.)
func TestOverloadTargets(t *testing.T) {
	t.Parallel()
	rep := run(t, "overload", Options{Tasks: 20000, Seed: 1,
		Policies: []string{policy.Reliability, policy.Thompson, policy.RoundRobin, policy.LeastLoaded}})
	or, rr, ll := rep.Get(Oracle), rep.Get(policy.RoundRobin), rep.Get(policy.LeastLoaded)
	for _, name := range []string{policy.Reliability, policy.Thompson} {
		r := rep.Get(name)
		if r.FirstSuccess < rr.FirstSuccess || r.FirstSuccess < or.FirstSuccess-0.01 {
			t.Errorf("%s: first-attempt success %.4f, want >= round-robin's %.4f and within 1 point of the oracle's %.4f",
				name, r.FirstSuccess, rr.FirstSuccess, or.FirstSuccess)
		}
		if r.MeanLatencyMs > 3*130 || r.MeanLatencyMs > 1.2*or.MeanLatencyMs {
			t.Errorf("%s: mean latency %.1fms, want within 390ms (the best model's queue target) and 1.2x the oracle's %.1fms (least-loaded's: %.1fms)",
				name, r.MeanLatencyMs, or.MeanLatencyMs, ll.MeanLatencyMs)
		}
		if r.QueueFailedFirst != 0 {
			t.Errorf("%s: %d first attempts expired or missed their deadline in a queue", name, r.QueueFailedFirst)
		}
	}
}

// A model with a fixed cost per call: 100 ms a call, one slot, 20 tasks/s
// arriving. One task per call serves 10/s and about half fail; batching
// (up to 8 per call, +2 ms per task) serves them all, since each call
// carries what waited while the last ran, and the load model, counting the
// slot 8 times, sends the node enough to fill its batches.
func TestBatchingModelServesItsBatchThroughput(t *testing.T) {
	t.Parallel()
	for _, batch := range []string{"", `, "batch": {"max_size": 8, "per_item": "2ms"}`} {
		sc, err := ParseScenario([]byte(`{
		  "arrival": {"rate": 20, "types": {"t": 1}},
		  "timeout": "500ms", "deadline_slack": "500ms", "max_attempts": 2,
		  "models": [{"name": "m", "types": ["t"]` + batch + `, "profile": [{"at": "0s", "failure_prob": 0, "latency": {"dist": "fixed", "value": "100ms"}}]}],
		  "nodes": [{"name": "n", "capacity": 1, "models": ["m"]}]
		}`))
		if err != nil {
			t.Fatal(err)
		}
		s, err := newSim(sc, Options{Seed: 1}.withDefaults(sc), policy.Reliability)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.run(context.Background(), 2000); err != nil {
			t.Fatal(err)
		}
		r := summarize(policy.Reliability, s.tasks, sc, s.opt)
		switch {
		case batch == "" && (r.FinalSuccess < 0.4 || r.FinalSuccess > 0.6):
			t.Errorf("one per call: final success %.3f, want about a half", r.FinalSuccess)
		case batch != "" && r.FinalSuccess < 0.99:
			t.Errorf("batching: final success %.3f, want all served", r.FinalSuccess)
		}
		t.Logf("batch %q: final success %.3f, mean %.1f ms, p95 %.0f ms", batch, r.FinalSuccess, r.MeanLatencyMs, r.P95LatencyMs)
	}
}

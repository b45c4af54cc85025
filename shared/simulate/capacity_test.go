package simulate

import (
	"context"
	"testing"

	"github.com/mlsched/mlsched/shared/policy"
)

// One slot for twice the load it can serve: attempts queue, those still
// queued at their deadline expire (a retryable outcome that does not count
// against the model), and tasks run out of attempts. The run still ends.
func TestOverloadedNodeQueuesAndExpires(t *testing.T) {
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
	for _, pol := range []string{policy.Reliability, Oracle} {
		s, err := newSim(sc, Options{Seed: 1}.withDefaults(sc), pol)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.run(context.Background(), 2000); err != nil {
			t.Fatal(err)
		}
		r := summarize(pol, s.tasks, sc, s.opt)
		// The node serves 10 tasks/s of the 20 arriving: about half succeed.
		if r.FinalSuccess < 0.3 || r.FinalSuccess > 0.7 {
			t.Errorf("%s: final success %.3f, want about a half", pol, r.FinalSuccess)
		}
		if r.P95LatencyMs < 1000 {
			t.Errorf("%s: p95 %.0fms, want queueing delay beyond the 1s deadline", pol, r.P95LatencyMs)
		}
		snap, err := s.store.Snapshot(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		c := snap.Models["m"].Counts
		if c.Expired == 0 || c.Failures() != 0 {
			t.Errorf("%s: counts %+v: want expired attempts and no failure charged to the model", pol, c)
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

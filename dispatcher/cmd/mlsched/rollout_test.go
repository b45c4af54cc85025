package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mlsched/mlsched/dispatcher/rollout"
	"github.com/mlsched/mlsched/shared/natstest"
	"github.com/mlsched/mlsched/shared/topology"
)

func TestRolloutCommands(t *testing.T) {
	t.Parallel()
	srv := natstest.New(t)
	if code, _, errs := cli(t, srv.URL, "", "rollout", "start", "fraud", "--steps", "1,5"); code != exitUsage || !strings.Contains(errs, "names no version") {
		t.Fatalf("unversioned: %d %q", code, errs)
	}
	if code, _, errs := cli(t, srv.URL, "", "rollout", "start", "fraud@v8", "--steps", "5,1"); code != exitUsage || !strings.Contains(errs, "increasing") {
		t.Fatalf("bad steps: %d %q", code, errs)
	}
	code, out, errs := cli(t, srv.URL, "", "rollout", "start", "fraud@v8", "--steps", "5,25,50,100", "--min-tasks", "200", "--max-drop", "2pp")
	if code != exitOK || !strings.Contains(out, "fraud@v8: running, step 1/4 at 5%") || !strings.Contains(out, "max-drop 2pp") {
		t.Fatalf("start: %d %q %q", code, out, errs)
	}
	if code, _, errs := cli(t, srv.URL, "", "rollout", "start", "fraud@v9"); code != exitFailed || !strings.Contains(errs, "promote or abort it first") {
		t.Fatalf("second start: %d %q", code, errs)
	}
	kv, err := topology.EnsureRolloutsBucket(tctx(t), srv.JS, topology.Config{})
	if err != nil {
		t.Fatal(err)
	}
	r, _, err := rollout.Store{KV: kv}.Get(tctx(t), "fraud")
	if err != nil || r.MinTasks != 200 || r.MaxDrop != 0.02 || len(r.Steps) != 4 {
		t.Fatalf("stored %+v %v", r, err)
	}
	for _, c := range []struct{ args, want string }{
		{"pause fraud", "fraud@v8: paused, step 1/4 at 5%"},
		{"resume fraud@v8", "fraud@v8: running, step 1/4"},
		{"promote fraud", "fraud@v8: running, step 2/4 at 25%"},
		{"status", "fraud@v8: running, step 2/4 at 25%"},
		{"abort fraud", "fraud@v8: aborted, step 2/4 at 0%"},
		{"history fraud", "operator  promoted by hand"},
	} {
		code, out, errs := cli(t, srv.URL, "", append([]string{"rollout"}, strings.Fields(c.args)...)...)
		if code != exitOK || !strings.Contains(out, c.want) {
			t.Fatalf("%s: %d %q %q, want %q", c.args, code, out, errs, c.want)
		}
	}
	if code, _, errs := cli(t, srv.URL, "", "rollout", "resume", "fraud"); code != exitFailed || !strings.Contains(errs, "aborted already") {
		t.Fatalf("resume after abort: %d %q", code, errs)
	}
	if code, _, errs := cli(t, srv.URL, "", "rollout", "pause", "nothing"); code != exitFailed || !strings.Contains(errs, "no rollout") {
		t.Fatalf("unknown family: %d %q", code, errs)
	}
	// a rollout file and a pinned split; the history carries over
	f := filepath.Join(t.TempDir(), "r.json")
	if err := os.WriteFile(f, []byte(`{"model": "fraud@v9", "min_tasks": 50, "max_drop": 0.005}`), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errs = cli(t, srv.URL, "", "rollout", "start", "-f", f, "--split", "90/10")
	if code != exitOK || !strings.Contains(out, "fraud@v9: running, step 1/1 at 10% (pinned split 90/10, min-tasks 50, max-drop 0.5pp)") {
		t.Fatalf("file: %d %q %q", code, out, errs)
	}
	if code, out, _ := cli(t, srv.URL, "", "rollout", "history"); code != exitOK || strings.Count(out, "fraud@v8") != 5 || !strings.Contains(out, "fraud@v9") {
		t.Fatalf("history: %q", out)
	}
}

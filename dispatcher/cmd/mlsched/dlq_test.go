package main

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/mlsched/mlsched/shared/client"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

func TestDLQListShowReplay(t *testing.T) {
	t.Parallel()
	srv := cluster(t)
	if code, out, _ := cli(t, srv.URL, "", "dlq", "list"); code != exitOK || !strings.Contains(out, "empty") {
		t.Fatalf("empty dlq: code %d, out %q", code, out)
	}
	original := []byte(`{"id":"t1","type":"ocr","payload":{"page":1}}`)
	exhausted := publishJSON(t, srv.JS, topology.DLQSubject("exhausted"), protocol.DeadLetter{
		Reason: "3 attempts failed", Code: protocol.CodeAttemptsExhausted, Subject: "mlsched.tasks.ocr",
		TaskID: "t1", Original: original, At: time.Now(),
		History: []protocol.Attempt{{Attempt: 1, Model: "m1", Node: "n1", Status: protocol.OutcomeModelError}},
	})
	invalid := publishJSON(t, srv.JS, topology.DLQSubject("invalid"), protocol.DeadLetter{
		Reason: "task is not valid JSON", Code: protocol.CodeMalformedJSON, Subject: "mlsched.tasks.ocr",
		Original: []byte("\xff\xfe garbage"), At: time.Now(),
	})
	junk, err := srv.JS.Publish(tctx(t), topology.DLQSubject("invalid"), []byte("not a dead letter"))
	if err != nil {
		t.Fatal(err)
	}
	// The failed result the dispatcher published for t1.
	publishJSON(t, srv.JS, topology.ResultSubject("t1"), protocol.Result{ID: "t1", Status: protocol.StatusFailed})

	code, out, _ := cli(t, srv.URL, "", "dlq", "list")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != exitOK || len(lines) != 4 {
		t.Fatalf("list: code %d, out:\n%s", code, out)
	}
	if f := strings.Fields(lines[1]); f[0] != "1" || f[2] != "exhausted" || f[3] != "attempts_exhausted" || f[4] != "t1" {
		t.Errorf("row 1 %q", lines[1])
	}
	if !strings.Contains(lines[2], "(none)") || !strings.Contains(lines[2], "malformed_json") {
		t.Errorf("row 2 %q", lines[2])
	}
	if !strings.Contains(lines[3], "malformed entry") {
		t.Errorf("row 3 %q", lines[3])
	}
	code, out, _ = cli(t, srv.URL, "", "dlq", "list", "-n", "1")
	if code != exitOK || strings.Contains(out, "exhausted") || !strings.Contains(out, "2 older entries not shown") {
		t.Errorf("list -n 1: code %d, out:\n%s", code, out)
	}

	code, out, _ = cli(t, srv.URL, "", "dlq", "show", "1")
	var view entryJSON
	if code != exitOK || json.Unmarshal([]byte(out), &view) != nil || view.DeadLetter == nil ||
		view.OriginalText == nil || *view.OriginalText != string(original) || len(view.DeadLetter.History) != 1 {
		t.Fatalf("show: code %d, out:\n%s", code, out)
	}
	if code, out, _ := cli(t, srv.URL, "", "dlq", "show", "2"); code != exitOK || strings.Contains(out, "original_text") {
		t.Errorf("show binary original: code %d, out:\n%s", code, out)
	}
	if code, _, errs := cli(t, srv.URL, "", "dlq", "show", "99"); code != exitFailed || !strings.Contains(errs, "no dead letter") {
		t.Errorf("show missing: code %d, stderr %q", code, errs)
	}
	if code, _, _ := cli(t, srv.URL, "", "dlq", "show", "x"); code != exitUsage {
		t.Errorf("show x: code %d", code)
	}

	// Unkeyable and malformed entries are refused, and stay.
	for _, seq := range []string{"2", "3"} {
		code, _, errs := cli(t, srv.URL, "", "dlq", "replay", seq)
		if code != exitPartial || !strings.Contains(errs, "cannot be replayed") {
			t.Errorf("replay %s: code %d, stderr %q", seq, code, errs)
		}
	}
	// At once: the old result is purged and the task resubmitted.
	code, out, errs := cli(t, srv.URL, "", "dlq", "replay", "1")
	if code != exitOK || !strings.Contains(out, "replayed dead letter 1 as task t1") || !strings.Contains(out, "the replay's result replaces it") {
		t.Fatalf("replay 1: code %d, out %q, err %q", code, out, errs)
	}
	c := client.New(srv.JS)
	if _, err := c.Result(tctx(t), "t1"); !errors.Is(err, client.ErrNoResult) {
		t.Errorf("old result of t1 not purged: %v", err)
	}
	tasks := streamMsgs(t, srv.JS, topology.StreamTasks)
	if len(tasks) != 1 || string(tasks[0].Data) != string(original) || tasks[0].Subject != "mlsched.tasks.ocr" ||
		tasks[0].Header.Get(protocol.HdrMsgID) != "t1:replay:1" {
		t.Fatalf("resubmitted %+v", tasks)
	}
	left := streamMsgs(t, srv.JS, topology.StreamDLQ)
	if len(left) != 2 || left[0].Sequence != invalid || left[1].Sequence != junk.Sequence {
		t.Fatalf("dlq after replay: %d entries", len(left))
	}
	_ = exhausted

	// -all replays what it can and reports the rest.
	publishJSON(t, srv.JS, topology.DLQSubject("exhausted"), protocol.DeadLetter{
		Code: protocol.CodeAttemptsExhausted, Subject: "mlsched.tasks.ocr", TaskID: "t2",
		Original: []byte(`{"id":"t2","type":"ocr"}`),
	})
	code, out, errs = cli(t, srv.URL, "", "dlq", "replay", "-all")
	if code != exitPartial || !strings.Contains(out, "as task t2") || strings.Count(errs, "cannot be replayed") != 2 {
		t.Fatalf("replay -all: code %d, out %q, err %q", code, out, errs)
	}
	if n := len(streamMsgs(t, srv.JS, topology.StreamTasks)); n != 2 {
		t.Errorf("%d tasks after replay -all, want 2", n)
	}
	if code, _, _ := cli(t, srv.URL, "", "dlq", "replay"); code != exitUsage {
		t.Errorf("replay without args: code %d", code)
	}
	if code, _, _ := cli(t, srv.URL, "", "dlq", "bogus"); code != exitUsage {
		t.Errorf("dlq bogus: code %d", code)
	}
}

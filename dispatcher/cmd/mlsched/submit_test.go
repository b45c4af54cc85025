package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

func TestSubmitFileReportsBadLinesAndSubmitsTheRest(t *testing.T) {
	t.Parallel()
	srv := cluster(t)
	lines := []string{
		`{"id":"a1","type":"echo","payload":{"x":1}}`, // 1
		`{"type":"echo","payload":"no id"}`,           // 2: id generated
		`{"id":"a3","type":"echo"`,                    // 3: malformed
		``,                                            // 4: blank, skipped
		`[1,2,3]`,                                     // 5: not an object
		`{"id":"a>b","type":"echo"}`,                  // 6: invalid id
		`{"id":"a7","type":"echo","timeout_ms":-5}`,     // 7: invalid timeout
		`{"id":"a1","type":"echo","payload":{"x":1}}`,   // 8: duplicate of line 1
		`{"id":"a9","type":"classify","models":["m1"]}`, // 9
	}
	path := filepath.Join(t.TempDir(), "tasks.jsonl")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errs := cli(t, srv.URL, "", "submit", "-f", path)
	if code != exitPartial {
		t.Fatalf("code %d, want %d (bad lines); stderr:\n%s", code, exitPartial, errs)
	}
	for _, want := range []string{"line 3: malformed_json", "line 5: not_object", "line 6: invalid_id", "line 7: invalid_timeout",
		"summary: submitted=4 duplicates=1 bad_lines=4"} {
		if !strings.Contains(errs, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errs)
		}
	}
	var acks []submitAck
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var a submitAck
		if err := json.Unmarshal([]byte(l), &a); err != nil {
			t.Fatalf("ack line %q: %v", l, err)
		}
		acks = append(acks, a)
	}
	if len(acks) != 4 {
		t.Fatalf("acks %+v, want 4", acks)
	}
	msgs := streamMsgs(t, srv.JS, topology.StreamTasks)
	if len(msgs) != 3 {
		t.Fatalf("task stream holds %d tasks, want 3 (a1, generated, a9)", len(msgs))
	}
	ids := map[string]string{}
	for _, m := range msgs {
		task, err := protocol.DecodeTask(m.Data, protocol.Limits{})
		if err != nil {
			t.Fatalf("submitted an invalid task %s: %v", m.Data, err)
		}
		if m.Header.Get(protocol.HdrMsgID) != task.ID {
			t.Errorf("Nats-Msg-Id %q for task %q", m.Header.Get(protocol.HdrMsgID), task.ID)
		}
		ids[task.ID] = m.Subject
	}
	if ids["a1"] != "mlsched.tasks.echo" || ids["a9"] != "mlsched.tasks.classify" {
		t.Errorf("subjects %v", ids)
	}
	generated := ""
	for id := range ids {
		if strings.HasPrefix(id, "cli-") {
			generated = id
		}
	}
	if generated == "" {
		t.Errorf("no generated id among %v", ids)
	}
}

func TestSubmitStdinAllGood(t *testing.T) {
	t.Parallel()
	srv := cluster(t)
	var b strings.Builder
	for i := range 50 {
		fmt.Fprintf(&b, `{"id":"s%d","type":"echo"}`+"\n", i)
	}
	code, _, errs := cli(t, srv.URL, b.String(), "submit", "-f", "-")
	if code != exitOK || !strings.Contains(errs, "submitted=50 duplicates=0 bad_lines=0") {
		t.Fatalf("code %d, stderr %q", code, errs)
	}
	if n := len(streamMsgs(t, srv.JS, topology.StreamTasks)); n != 50 {
		t.Fatalf("%d tasks in the stream, want 50", n)
	}
}

func TestSubmitFlags(t *testing.T) {
	t.Parallel()
	srv := cluster(t)
	code, out, errs := cli(t, srv.URL, "", "submit", "-type", "ocr", "-id", "f1", "-payload", `{"url":"x"}`,
		"-models", "m1,m2", "-timeout-ms", "1500", "-max-attempts", "2")
	if code != exitOK {
		t.Fatalf("code %d, stderr %q", code, errs)
	}
	if !strings.Contains(out, `"id":"f1"`) {
		t.Errorf("stdout %q", out)
	}
	msgs := streamMsgs(t, srv.JS, topology.StreamTasks)
	if len(msgs) != 1 || msgs[0].Subject != "mlsched.tasks.ocr" {
		t.Fatalf("msgs %+v", msgs)
	}
	task, err := protocol.DecodeTask(msgs[0].Data, protocol.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if task.ID != "f1" || string(task.Payload) != `{"url":"x"}` || strings.Join(task.Models, ",") != "m1,m2" ||
		task.TimeoutMs != 1500 || task.MaxAttempts != 2 {
		t.Errorf("task %+v", task)
	}
	// Invalid flags are refused before anything is published.
	// Every bad flag value is a usage error, exit 2, as the README's table
	// says (issue 22: -id, -timeout-ms and -type exited 1).
	for _, bad := range [][]string{
		{"-type", "ocr", "-id", "bad id"},
		{"-type", "ocr", "-timeout-ms", "999999999"},
		{"-type", "bad.type"},
		{"-type", "ocr", "-max-attempts", "1000"},
	} {
		if code, _, errs := cli(t, srv.URL, "", append([]string{"submit"}, bad...)...); code != exitUsage || !strings.Contains(errs, "invalid") {
			t.Errorf("submit %q: code %d, stderr %q, want %d", bad, code, errs, exitUsage)
		}
	}
	if code, _, _ := cli(t, srv.URL, "", "submit", "-type", "ocr", "-payload", "{nope"); code != exitUsage {
		t.Errorf("bad payload: code %d", code)
	}
	if code, _, _ := cli(t, srv.URL, "", "submit"); code != exitUsage {
		t.Errorf("no -type or -f: code %d", code)
	}
	if n := len(streamMsgs(t, srv.JS, topology.StreamTasks)); n != 1 {
		t.Errorf("%d tasks in the stream after refused submissions, want 1", n)
	}
}

// fakeDispatcher answers every task with a result: status from the task's
// payload ("fail" fails it).
func fakeDispatcher(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	cons, err := js.CreateOrUpdateConsumer(ctx, topology.StreamTasks, jetstream.ConsumerConfig{Durable: "fake", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		task, err := protocol.DecodeTask(m.Data(), protocol.Limits{})
		r := protocol.Result{ID: task.ID, Type: task.Type, Status: protocol.StatusSucceeded, Attempts: 1, Model: "m1"}
		if err != nil {
			r.Status, r.ErrorCode = protocol.StatusRejected, protocol.CodeOf(err)
		} else if string(task.Payload) == `"fail"` {
			r.Status, r.ErrorCode = protocol.StatusFailed, protocol.CodeAttemptsExhausted
		}
		data, _ := json.Marshal(r)
		if _, err := js.Publish(ctx, topology.ResultSubject(task.ID), data); err != nil && ctx.Err() == nil {
			t.Errorf("publish result: %v", err)
		}
		_ = m.Ack()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cc.Stop)
}

func TestSubmitWait(t *testing.T) {
	t.Parallel()
	srv := cluster(t)
	fakeDispatcher(t, srv.JS)
	in := `{"id":"w1","type":"echo"}
{"id":"w2","type":"echo","payload":"fail"}
{"id":"w3","type":"echo"}
`
	code, out, errs := cli(t, srv.URL, in, "submit", "-f", "-", "-wait")
	if code != exitPartial {
		t.Fatalf("code %d, want %d (one failed); stderr %q", code, exitPartial, errs)
	}
	if !strings.Contains(errs, "results=3 succeeded=2 failed=1 rejected=0") {
		t.Errorf("summary: %q", errs)
	}
	got := map[string]protocol.Status{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var r protocol.Result
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("result line %q: %v", l, err)
		}
		got[r.ID] = r.Status
	}
	if got["w1"] != protocol.StatusSucceeded || got["w2"] != protocol.StatusFailed || got["w3"] != protocol.StatusSucceeded {
		t.Errorf("results %v", got)
	}

	code, out, errs = cli(t, srv.URL, "", "submit", "-type", "echo", "-id", "w4", "-wait")
	if code != exitOK || !strings.Contains(out, `"status":"succeeded"`) || !strings.Contains(errs, "succeeded=1") {
		t.Errorf("single -wait: code %d, out %q, err %q", code, out, errs)
	}
}

func TestResultAndWaitCommands(t *testing.T) {
	t.Parallel()
	srv := cluster(t)
	code, _, errs := cli(t, srv.URL, "", "result", "r1")
	if code != exitFailed || !strings.Contains(errs, "not finished yet, unknown, or expired (results are kept for at most") {
		t.Fatalf("missing result: code %d, stderr %q", code, errs)
	}
	publishJSON(t, srv.JS, topology.ResultSubject("r1"), protocol.Result{ID: "r1", Status: protocol.StatusSucceeded, Output: json.RawMessage(`{"ok":true}`)})
	publishJSON(t, srv.JS, topology.ResultSubject("r2"), protocol.Result{ID: "r2", Status: protocol.StatusRejected, ErrorCode: protocol.CodeNoModel})
	code, out, _ := cli(t, srv.URL, "", "result", "r1")
	var r protocol.Result
	if code != exitOK || json.Unmarshal([]byte(out), &r) != nil || r.ID != "r1" || string(r.Output) != `{"ok":true}` {
		t.Fatalf("result: code %d, out %q", code, out)
	}
	// A task that did not succeed exits 3, as submit -wait and wait do.
	if code, out, _ := cli(t, srv.URL, "", "result", "r2"); code != exitPartial || !strings.Contains(out, `"status":"rejected"`) {
		t.Fatalf("result of a rejected task: code %d, out %q, want %d", code, out, exitPartial)
	}
	if code, _, errs := cli(t, srv.URL, "", "result", "a b"); code != exitUsage {
		t.Fatalf("result with a bad id: code %d, stderr %q, want %d", code, errs, exitUsage)
	}
	code, out, errs = cli(t, srv.URL, "", "wait", "r1", "r2")
	if code != exitPartial || strings.Count(out, "\n") != 2 || !strings.Contains(errs, "summary: results=2 succeeded=1 failed=0 rejected=1") {
		t.Fatalf("wait: code %d, out %q, err %q", code, out, errs)
	}
	code, _, errs = cli(t, srv.URL, "", "wait", "-wait-timeout", "100ms", "never")
	if code != exitFailed || !strings.Contains(errs, "deadline") {
		t.Fatalf("wait timeout: code %d, err %q", code, errs)
	}
}

// A file is submitted as it is read, chunk by chunk (here 4×window = 8
// lines), every task once and its ack in line order, with plain progress
// lines on a stderr that is not a terminal.
func TestSubmitFileStreamsWithProgress(t *testing.T) {
	t.Parallel()
	srv := cluster(t)
	var b strings.Builder
	const n = 203
	for i := range n {
		if i == 100 {
			b.WriteString("not json\n")
		}
		fmt.Fprintf(&b, `{"id":"p%03d","type":"echo"}`+"\n", i)
	}
	path := filepath.Join(t.TempDir(), "tasks.jsonl")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errs := cli(t, srv.URL, "", "submit", "-f", path, "-window", "2", "-progress", "1ns")
	if code != exitPartial {
		t.Fatalf("code %d, want %d (one bad line); stderr:\n%s", code, exitPartial, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != n {
		t.Fatalf("%d ack lines, want %d", len(lines), n)
	}
	for i, l := range lines {
		var ack submitAck
		if err := json.Unmarshal([]byte(l), &ack); err != nil || ack.ID != fmt.Sprintf("p%03d", i) {
			t.Fatalf("ack line %d = %q (%v)", i, l, err)
		}
	}
	for _, want := range []string{"line 101:", "progress: 100.0% of", n2s(n) + " submitted, 1 bad, 0 unsent", "submitted=203 duplicates=0 bad_lines=1"} {
		if !strings.Contains(errs, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errs)
		}
	}
	if strings.Contains(errs, "\r") || strings.Contains(errs, "\x1b") {
		t.Errorf("terminal control characters on a non-terminal stderr: %q", errs)
	}
	if strings.Count(errs, "progress:") < 10 {
		t.Errorf("want a progress line per chunk:\n%s", errs)
	}
	if got := len(streamMsgs(t, srv.JS, topology.StreamTasks)); got != n {
		t.Fatalf("%d tasks in the stream, want %d", got, n)
	}
}

func n2s(n int) string { return fmt.Sprint(n) }

// No wait is silent (issue 22): submit -f -wait reports the results as
// they come (done, succeeded, failed, rate, ETA), and a single task that
// has no result says so after a progress interval, and why, from the
// live nodes: none announces a model for its type.
func TestSubmitWaitReportsProgress(t *testing.T) {
	t.Parallel()
	srv := cluster(t)
	in := "{\"id\":\"p1\",\"type\":\"nobody\"}\n{\"id\":\"p2\",\"type\":\"nobody\"}\n"
	code, _, errs := cli(t, srv.URL, in, "submit", "-f", "-", "-wait", "-wait-timeout", "800ms", "-progress", "100ms")
	if code != exitFailed || !strings.Contains(errs, "results: 0 of 2 (0 succeeded, 0 failed, 0 rejected)") || !strings.Contains(errs, "ETA") {
		t.Errorf("-f -wait: code %d, stderr %q: want result progress", code, errs)
	}
	// 4 s: each hint reads the nodes' bucket within 500 ms, which a loaded
	// machine (CI under -race) may miss a few times in a row.
	code, _, errs = cli(t, srv.URL, "", "submit", "-type", "nobody", "-id", "p3", "-models", "nosuch", "-wait", "-wait-timeout", "4s", "-progress", "100ms")
	if code != exitFailed || !strings.Contains(errs, "waiting for p3: no result after") ||
		!strings.Contains(errs, `no live node announces a model for type "nobody" with models nosuch`) {
		t.Errorf("single -wait: code %d, stderr %q: want it to say why it waits", code, errs)
	}
}

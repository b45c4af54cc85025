package dashboard_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/dispatcher"
	"github.com/mlsched/mlsched/dispatcher/dashboard"
	"github.com/mlsched/mlsched/shared/natstest"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// The operator's lookup and actions: a task's result with every attempt is
// open to read; cancelling a task and replaying a dead letter need the token
// of MLSCHED_HTTP_TOKEN_FILE, are refused without it (403 with no token
// file, 401 with a wrong or missing token), and work with it.
func TestDashboardLookupAndActions(t *testing.T) {
	ns := natstest.New(t)
	cfg := dispatcher.DefaultConfig()
	cfg.NATS.URL, cfg.Name, cfg.HTTPAddr = ns.URL, "replica-a", "off"
	cfg.NoNodeWait = 10 * time.Minute // a task of a type nobody serves waits: cancellable
	_, ctx := runDispatcher(t, cfg)
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	serve := func(c dashboard.Config) *httptest.Server {
		c.Interval = 100 * time.Millisecond
		d := dashboard.New(ns.NC, ns.JS, c, zerolog.Nop())
		go d.Run(ctx)
		srv := httptest.NewServer(d)
		t.Cleanup(func() { srv.CloseClientConnections(); srv.Close() })
		return srv
	}
	open, locked := serve(dashboard.Config{}), serve(dashboard.Config{TokenFile: tokenFile})
	post := func(srv *httptest.Server, path, token, body string) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(body))
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	lookup := func(id string) (int, map[string]any) {
		res, err := http.Get(open.URL + "/api/task?id=" + id)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var v map[string]any
		_ = json.NewDecoder(res.Body).Decode(&v)
		return res.StatusCode, v
	}

	// Lookup: a failed task's result and its attempts.
	res := protocol.Result{ID: "f1", Type: "ocr", Status: protocol.StatusFailed, Attempts: 2, ErrorCode: protocol.CodeAttemptsExhausted,
		Error: "all 2 attempts failed", History: []protocol.Attempt{
			{Attempt: 1, Model: "m1", Node: "n1", Status: protocol.OutcomeModelError, Error: "boom", LatencyMs: 3},
			{Attempt: 2, Model: "m2", Node: "n2", Status: protocol.OutcomeTimeout, Error: "timed out", LatencyMs: 2000}}}
	data, _ := json.Marshal(res)
	if _, err := ns.JS.Publish(ctx, topology.ResultSubject("f1"), data); err != nil {
		t.Fatal(err)
	}
	if code, v := lookup("f1"); code != 200 || v["state"] != "finished" || !strings.Contains(mustJSON(v), `"node":"n2"`) ||
		!strings.Contains(mustJSON(v), `"error":"boom"`) {
		t.Fatalf("lookup f1: %d %v", code, v)
	}
	if code, v := lookup("nothing-yet"); code != 200 || v["state"] != "no result yet" {
		t.Fatalf("lookup of a task without a result: %d %v", code, v)
	}
	if code, _ := lookup("a%20b"); code != http.StatusBadRequest {
		t.Fatalf("lookup of a bad id: %d, want 400", code)
	}

	// Refused without a token file, and with a wrong or missing token.
	if code, body := post(open, "/api/cancel", "s3cret", `{"id":"x"}`); code != http.StatusForbidden || !strings.Contains(body, "MLSCHED_HTTP_TOKEN_FILE") {
		t.Fatalf("cancel without a token file: %d %s", code, body)
	}
	for _, tok := range []string{"", "wrong"} {
		if code, body := post(locked, "/api/dlq/replay", tok, `{"seq":1}`); code != http.StatusUnauthorized {
			t.Fatalf("replay with token %q: %d %s, want 401", tok, code, body)
		}
	}

	// Cancel a waiting task with the token.
	task, _ := json.Marshal(protocol.Task{ID: "w1", Type: "nobody"})
	if _, err := ns.JS.Publish(ctx, topology.TaskSubject("nobody"), task); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the cancel of a waiting task", func() bool {
		code, _ := post(locked, "/api/cancel", "s3cret", `{"id":"w1","reason":"test"}`)
		return code == 200
	})
	if _, v := lookup("w1"); !strings.Contains(mustJSON(v), `"status":"cancelled"`) {
		t.Fatalf("w1 after cancel: %v", v)
	}

	// Replay a dead letter with the token: the old result is replaced.
	dl, _ := json.Marshal(protocol.DeadLetter{Reason: "all 2 attempts failed", Code: protocol.CodeAttemptsExhausted,
		Subject: topology.TaskSubject("ocr"), TaskID: "f1", Original: []byte(`{"id":"f1","type":"ocr"}`)})
	ack, err := ns.JS.Publish(ctx, topology.DLQSubject("exhausted"), dl)
	if err != nil {
		t.Fatal(err)
	}
	code, body := post(locked, "/api/dlq/replay", "s3cret", `{"seq":`+jsonNum(ack.Sequence)+`}`)
	if code != 200 || !strings.Contains(body, "replaces it") {
		t.Fatalf("replay: %d %s", code, body)
	}
	eventually(t, "f1's failed result replaced", func() bool {
		_, v := lookup("f1")
		return !strings.Contains(mustJSON(v), `"status":"failed"`)
	})
	if code, body := post(locked, "/api/dlq/replay", "s3cret", `{"seq":`+jsonNum(ack.Sequence)+`}`); code == 200 {
		t.Fatalf("a replayed (deleted) dead letter replayed again: %s", body)
	}
}

func mustJSON(v any) string {
	var b bytes.Buffer
	_ = json.NewEncoder(&b).Encode(v)
	return b.String()
}

func jsonNum(n uint64) string { b, _ := json.Marshal(n); return string(b) }

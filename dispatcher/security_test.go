package dispatcher_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/dispatcher"
	"github.com/mlsched/mlsched/shared/logtest"
	"github.com/mlsched/mlsched/shared/natsconn"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/redisconn"
	"github.com/mlsched/mlsched/shared/redistest"
	"github.com/mlsched/mlsched/shared/topology"
)

func secretFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(p, []byte(content+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// securedRedis is a redis-server with a default-user password and an ACL
// user limited to the statistics keys.
func securedRedis(t *testing.T, defaultPW, user, userPW string) *redistest.Server {
	t.Helper()
	r := redistest.Start(t)
	c := r.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Do(ctx, "ACL", "SETUSER", user, "on", ">"+userPW, "~mlsched:*", "+@all", "-@dangerous", "+info").Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.ConfigSet(ctx, "requirepass", defaultPW).Err(); err != nil {
		t.Fatal(err)
	}
	return r
}

func natsWithUser(t *testing.T, user, pw string) string {
	t.Helper()
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true,
		StoreDir: t.TempDir(), NoLog: true, NoSigs: true, Users: []*server.User{{Username: user, Password: pw}}})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats not ready")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s.ClientURL()
}

// A wrong Redis password stops the dispatcher with a clear error instead of
// leaving it degraded; neither it nor any log line shows a password.
func TestRedisWrongPasswordExits(t *testing.T) {
	const rightPW, userPW = "default-pw-4711", "acl-user-pw-0815"
	r := securedRedis(t, rightPW, "mlsched", userPW)
	for _, tc := range []struct{ name, url, pwFile string }{
		{"password file", "redis://mlsched@" + r.Addr + "/0", secretFile(t, "wrong-pw-1")},
		{"in the URL", "redis://mlsched:wrong-pw-2@" + r.Addr + "/0", ""},
		{"none", "redis://" + r.Addr + "/0", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs logtest.Buffer
			cfg := testConfig(natsWithUser(t, "d", "nats-pw-1234"))
			cfg.NATS.User, cfg.NATS.PasswordFile = "d", secretFile(t, "nats-pw-1234")
			cfg.RedisURL, cfg.RedisPasswordFile = tc.url, tc.pwFile
			d, err := dispatcher.New(cfg, dispatcher.WithLogger(zerolog.New(&logs)))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			err = d.Run(ctx)
			if !errors.Is(err, redisconn.ErrAuth) {
				t.Fatalf("Run = %v, want an authentication error", err)
			}
			if !strings.Contains(err.Error(), "MLSCHED_REDIS_PASSWORD_FILE") {
				t.Errorf("the error does not say what to check: %v", err)
			}
			all := err.Error() + logs.String()
			for _, s := range []string{rightPW, userPW, "wrong-pw-1", "wrong-pw-2", "nats-pw-1234"} {
				if strings.Contains(all, s) {
					t.Errorf("a secret appears: %q in %s", s, all)
				}
			}
		})
	}
}

// With the ACL user's password in a file, the dispatcher keeps its
// statistics in Redis; with Redis down it starts degraded, as before.
func TestRedisACLUserPasswordFile(t *testing.T) {
	const userPW = "acl-user-pw-9999"
	r := securedRedis(t, "default-pw-1", "mlsched", userPW)
	var logs logtest.Buffer
	url := natsWithUser(t, "d", "nats-pw-5678")
	cfg := testConfig(url)
	cfg.NATS.User, cfg.NATS.PasswordFile = "d", secretFile(t, "nats-pw-5678")
	cfg.RedisURL, cfg.RedisPasswordFile = "redis://mlsched@"+r.Addr+"/0", secretFile(t, userPW)
	d, err := dispatcher.New(cfg, dispatcher.WithLogger(zerolog.New(&logs)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	nc, err := natsconn.Connect(natsconn.Config{URL: url, User: "d", PasswordFile: cfg.NATS.PasswordFile}, natsconn.Conn{})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var r protocol.StatsReport
		m, err := nc.Request(protocol.SubjectAdminStats, nil, time.Second)
		if err == nil && json.Unmarshal(m.Data, &r) == nil && r.Store == "redis" && !r.Degraded {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Redis store is not healthy (%+v, %v); logs:\n%s", r, err, logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if s := logs.String(); strings.Contains(s, userPW) || strings.Contains(s, "nats-pw-5678") {
		t.Fatalf("a password in the logs: %s", s)
	}
}

// The measured attack: a success outcome published for an id before the
// task was submitted became its result. Now every outcome that does not
// answer a dispatch a dispatcher sealed, or disagrees with it, is counted
// as forged and ignored.
func TestForgedOutcomesAreRefused(t *testing.T) {
	e := newEnv(t)
	n := e.startNode("n1", []string{"t"}, map[string]behavior{"m": succeed})
	e.submit(protocol.Task{ID: "real", Type: "t"})
	if r := e.result("real"); r.Status != protocol.StatusSucceeded {
		t.Fatalf("real task: %+v", r)
	}
	n.mu.Lock()
	sealed := n.headers[0]
	n.mu.Unlock()

	forge := func(subject string, o protocol.Outcome, h nats.Header) {
		t.Helper()
		data, _ := json.Marshal(o)
		if _, err := e.ns.JS.PublishMsg(e.ctx, &nats.Msg{Subject: subject, Data: data, Header: h}); err != nil {
			t.Fatal(err)
		}
	}
	victim := protocol.Outcome{TaskID: "victim", Type: "t", Attempt: 1, Model: "m", Node: "n1",
		Status: protocol.OutcomeSuccess, Output: json.RawMessage(`{"forged":true}`)}
	unsealed := protocol.Dispatch{TaskID: "victim", Type: "t", Model: "m", Node: "n1", Attempt: 1, MaxAttempts: 3,
		Deadline: time.Now().Add(time.Minute)}
	guessed := unsealed
	guessed.TaskSum = protocol.TaskSum([]byte(`{"id":"victim","type":"t"}`))
	guessed.Seal = dispatcher.SealForTest([]byte("a guessed key, not the dispatchers' one"), &guessed)
	edited := protocol.OutcomeHeader(sealed, "n1")
	edited.Set(protocol.HdrTaskID, "victim") // a real seal on edited headers
	forged := 0
	cases := []struct {
		name    string
		subject string
		o       protocol.Outcome
		h       nats.Header
	}{
		{"no dispatch headers", topology.OutcomeSubject("n1"), victim, nats.Header{}},
		{"unsealed dispatch", topology.OutcomeSubject("n1"), victim, unsealed.Header()},
		{"seal under another key", topology.OutcomeSubject("n1"), victim, guessed.Header()},
		{"edited sealed headers", topology.OutcomeSubject("n1"), victim, edited},
		{"real seal, other task in the body", topology.OutcomeSubject("n1"), victim, protocol.OutcomeHeader(sealed, "n1")},
		{"subject of another node", topology.OutcomeSubject("n2"), protocol.Outcome{TaskID: "real", Type: "t", Attempt: 1, Model: "m", Node: "n2", Status: protocol.OutcomeSuccess}, protocol.OutcomeHeader(sealed, "n2")},
		{"body of another node", topology.OutcomeSubject("n1"), protocol.Outcome{TaskID: "real", Type: "t", Attempt: 1, Model: "m", Node: "n2", Status: protocol.OutcomeSuccess}, protocol.OutcomeHeader(sealed, "n1")},
		{"other model", topology.OutcomeSubject("n1"), protocol.Outcome{TaskID: "real", Type: "t", Attempt: 1, Model: "m2", Node: "n1", Status: protocol.OutcomeSuccess}, protocol.OutcomeHeader(sealed, "n1")},
		{"other attempt", topology.OutcomeSubject("n1"), protocol.Outcome{TaskID: "real", Type: "t", Attempt: 2, Model: "m", Node: "n1", Status: protocol.OutcomeSuccess}, protocol.OutcomeHeader(sealed, "n1")},
		{"other task bytes", topology.OutcomeSubject("n1"), protocol.Outcome{TaskID: "real", Type: "t", Attempt: 1, Model: "m", Node: "n1", Status: protocol.OutcomeModelError, Task: json.RawMessage(`{"id":"real","type":"t","payload":"evil"}`)}, protocol.OutcomeHeader(sealed, "n1")},
		{"dotted subject", "mlsched.outcomes.n1.x", victim, protocol.OutcomeHeader(sealed, "n1")},
	}
	for _, c := range cases {
		forge(c.subject, c.o, c.h)
		forged++
	}
	e.waitFor("every forged outcome counted", func() bool { return e.d.Counters().Forged.Load() == int64(forged) })

	e.submit(protocol.Task{ID: "victim", Type: "t"})
	r := e.result("victim")
	if r.Status != protocol.StatusSucceeded || string(r.Output) != `{"by":"m"}` {
		t.Fatalf("victim's result %+v: not the node's", r)
	}
	if got := e.d.Counters().Forged.Load(); got != int64(forged) {
		t.Fatalf("forged = %d, want %d", got, forged)
	}
	if c := e.resultCount("real"); c != 1 {
		t.Fatalf("real has %d results", c)
	}
	if rep := e.stats(); rep.Counters["forged"] != int64(forged) {
		t.Fatalf("stats report forged = %d", rep.Counters["forged"])
	}
}

// Measured attacks on the node registry: a dotted node id (a legal KV key)
// made a dispatch subject outside the stream, retried for ever; unbounded
// heartbeats drew traffic. Invalid heartbeats are now ignored and counted,
// tasks go to valid nodes, and a task only an invalid node serves gets a
// result instead of looping.
func TestInvalidHeartbeatsAreIgnored(t *testing.T) {
	e := newEnv(t)
	e.startNode("n1", []string{"t"}, map[string]behavior{"m": succeed})
	kv, err := topology.EnsureNodesBucket(e.ctx, e.ns.JS, topology.Config{})
	if err != nil {
		t.Fatal(err)
	}
	many := make([]protocol.ModelInfo, protocol.MaxHeartbeatModels+1)
	for i := range many {
		many[i] = protocol.ModelInfo{Name: fmt.Sprintf("x%d", i), Types: []string{"t"}}
	}
	bad := []protocol.Heartbeat{
		{Node: "a.b", Capacity: 8, Models: []protocol.ModelInfo{{Name: "dot", Types: []string{"t", "only-dotted"}}}},
		{Node: "wide", Capacity: 8, Models: many},
		{Node: "spaced", Capacity: 8, Models: []protocol.ModelInfo{{Name: "a model", Types: []string{"t"}}}},
		{Node: "slowpoke", Capacity: 8, Models: []protocol.ModelInfo{{Name: "m", Types: []string{"t"}, TimeoutMs: int64(48 * time.Hour / time.Millisecond)}}},
	}
	for _, hb := range bad {
		hb.SentAt = time.Now()
		data, _ := json.Marshal(hb)
		if _, err := kv.Put(e.ctx, hb.Node, data); err != nil {
			t.Fatal(err)
		}
	}
	e.waitFor("every invalid heartbeat refused", func() bool {
		return e.stats().Counters["bad_heartbeats"] >= int64(len(bad))
	})
	for i := range 20 {
		e.submit(protocol.Task{ID: fmt.Sprintf("hb-%d", i), Type: "t"})
	}
	for i := range 20 {
		if r := e.result(fmt.Sprintf("hb-%d", i)); r.Status != protocol.StatusSucceeded || r.Node != "n1" {
			t.Fatalf("task %d: %+v", i, r)
		}
	}
	e.submit(protocol.Task{ID: "dotted-only", Type: "only-dotted"})
	if r := e.result("dotted-only"); r.Status != protocol.StatusRejected || r.ErrorCode != protocol.CodeNoModel {
		t.Fatalf("a task only the dotted node serves: %+v", r)
	}
	for _, n := range e.stats().Nodes {
		if n.Node != "n1" {
			t.Errorf("invalid node %q is live", n.Node)
		}
	}
}

// stats asks the dispatcher for its report over NATS, as mlsched stats
// does, waiting until it answers.
func (e *env) stats() protocol.StatsReport {
	e.t.Helper()
	var r protocol.StatsReport
	e.waitFor("a stats report", func() bool {
		m, err := e.ns.NC.Request(protocol.SubjectAdminStats, nil, 5*time.Second)
		return err == nil && json.Unmarshal(m.Data, &r) == nil
	})
	return r
}

// The measured attack: a 6 MiB message without an id looped for ever,
// its dead letter larger than the server allows. Now the dead letter keeps
// a truncated original with the whole message's size and hash, and the
// message leaves the task stream.
func TestOversizedUnkeyableMessageIsDeadLettered(t *testing.T) {
	e := newEnv(t)
	e.waitFor("streams", func() bool { _, err := e.ns.JS.Stream(e.ctx, topology.StreamDLQ); return err == nil })
	big := bytes.Repeat([]byte("x"), 3<<20) // not JSON, no id; within the 4 MiB intake limit
	e.publish(topology.TaskSubject("t"), big, "")
	var got []protocol.DeadLetter
	e.waitFor("the dead letter", func() bool { got = e.deadLetters(); return len(got) == 1 })
	dl := got[0]
	if !dl.Truncated || dl.OriginalBytes != len(big) || dl.OriginalSHA256 != protocol.TaskSum(big) ||
		len(dl.Original) != protocol.MaxDeadLetterOriginal {
		t.Fatalf("dead letter: truncated=%v bytes=%d sha=%s kept=%d", dl.Truncated, dl.OriginalBytes, dl.OriginalSHA256, len(dl.Original))
	}
	e.waitFor("the task stream empties", func() bool {
		s, err := e.ns.JS.Stream(e.ctx, topology.StreamTasks)
		if err != nil {
			return false
		}
		info, err := s.Info(e.ctx)
		return err == nil && info.State.Msgs == 0
	})
	// Above the intake limit the producer gets a clear publish error.
	_, err := e.ns.JS.Publish(e.ctx, topology.TaskSubject("t"), bytes.Repeat([]byte("y"), 5<<20))
	if err == nil || !strings.Contains(strings.ToLower(err.Error()), "message size exceeds") {
		t.Fatalf("a 5 MiB task: %v, want a message size error", err)
	}
}

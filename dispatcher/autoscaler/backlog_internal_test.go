package autoscaler

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/shared/logtest"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// authServer runs a JetStream nats-server with an admin user and a user
// "ro" that may not list the task stream's consumers.
func authServer(t *testing.T) string {
	t.Helper()
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true,
		StoreDir: t.TempDir(), NoLog: true, NoSigs: true, Users: []*server.User{
			{Username: "admin", Password: "admin-pw"},
			{Username: "ro", Password: "ro-pw", Permissions: &server.Permissions{
				Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: []string{"$JS.API.CONSUMER.LIST.>"}}}},
		}})
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

func connect(t *testing.T, url, user, pw string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url, nats.UserInfo(user, pw))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// The consumers' count is spread over the types by the sample, or by the
// stream's subjects when the sample holds nothing.
func TestBacklogSpreadOverTypes(t *testing.T) {
	url := authServer(t)
	_, js := connect(t, url, "admin", "admin-pw")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := topology.Ensure(ctx, js, topology.Config{}); err != nil {
		t.Fatal(err)
	}
	name, filters := topology.BandConsumer(topology.BandNormal)
	if _, err := js.CreateOrUpdateConsumer(ctx, topology.StreamTasks, jetstream.ConsumerConfig{Durable: name,
		FilterSubjects: filters, AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	for i, typ := range []string{"a", "a", "a", "b"} {
		task, _ := json.Marshal(protocol.Task{ID: typ + string(rune('0'+i)), Type: typ, Payload: json.RawMessage(`{}`)})
		if _, err := js.Publish(ctx, topology.TaskSubject(typ), task); err != nil {
			t.Fatal(err)
		}
	}
	r := &backlogReader{js: js, log: zerolog.Nop()}
	if got, ok := r.read(ctx, map[string]int64{"a": 1, "b": 1}); !ok || got["a"] != 2 || got["b"] != 2 {
		t.Fatalf("by the sample (1:1): %v %v, want a 2, b 2", got, ok)
	}
	if got, ok := r.read(ctx, map[string]int64{"a": 0, "b": 0}); !ok || got["a"] != 3 || got["b"] != 1 {
		t.Fatalf("by the stream's subjects: %v %v, want a 3, b 1", got, ok)
	}
	if got, ok := r.read(ctx, map[string]int64{"a": 0}); !ok || got["a"] != 4 {
		t.Fatalf("one type: %v %v, want a 4", got, ok)
	}
}

// A server that refuses the read: the sample stays, the refusal is said
// once with what to do, and no later step waits on a request again.
func TestBacklogRefusedFallsBackToTheSample(t *testing.T) {
	url := authServer(t)
	_, ajs := connect(t, url, "admin", "admin-pw")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := topology.Ensure(ctx, ajs, topology.Config{}); err != nil {
		t.Fatal(err)
	}
	nc, js := connect(t, url, "ro", "ro-pw")
	var logs logtest.Buffer
	r := &backlogReader{js: js, nc: nc, log: zerolog.New(&logs)}
	if _, ok := r.read(ctx, map[string]int64{"a": 5}); ok {
		t.Fatal("a refused read gave a backlog")
	}
	if !strings.Contains(logs.String(), "regenerate auth.conf") && !strings.Contains(logs.String(), "Regenerate auth.conf") {
		t.Fatalf("the refusal not said with its remedy: %s", logs.String())
	}
	start := time.Now()
	for range 3 {
		if _, ok := r.read(ctx, map[string]int64{"a": 5}); ok {
			t.Fatal("a refused read gave a backlog")
		}
	}
	if time.Since(start) > backlogTimeout/2 {
		t.Fatalf("later reads waited %v: the reader should have stopped asking", time.Since(start))
	}
	if n := strings.Count(logs.String(), "refuses"); n != 1 {
		t.Fatalf("refusal said %d times, want once: %s", n, logs.String())
	}
}

package worker

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/shared/natsconn"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// startServer runs a JetStream server on port (0: random) over dir.
func startServer(t *testing.T, dir string, port int) *server.Server {
	t.Helper()
	if port == 0 {
		port = server.RANDOM_PORT
	}
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s
}

// The worker keeps working across a NATS server restart.
func TestSurvivesServerRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s1 := startServer(t, dir, 0)
	port := s1.Addr().(*net.TCPAddr).Port
	url := s1.ClientURL()

	cfg := Config{NATS: natsconn.Config{URL: url}, NodeID: "n-rs", Concurrency: 2, AckWait: 5 * time.Second,
		// File attempt streams, as the test's own Ensure creates them: this
		// test is about streams that survive the restart (memory ones are
		// re-created by a dispatcher, which this test has not).
		HeartbeatInterval: 100 * time.Millisecond, Shared: topology.Shared{NodeTTL: 3 * time.Second, AttemptStorage: "file"}}
	w, err := New(cfg, WithLogger(zerolog.Nop()), WithModels([]ModelSpec{goModel("m", "echo")}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			cancel()
			<-done
		}
	})

	// The test's client reconnects too.
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	// Only the first round creates the topology: after the restart the file
	// streams are back by themselves, and the memory-backed node bucket
	// must be recreated by the worker.
	ensure := true
	roundTrip := func(id string) {
		t.Helper()
		if ensure {
			if err := topology.Ensure(context.Background(), js, topology.Config{}); err != nil {
				t.Fatal(err)
			}
		}
		oc, err := js.CreateOrUpdateConsumer(context.Background(), topology.StreamOutcomes, jetstream.ConsumerConfig{
			Durable: "t", FilterSubject: topology.OutcomeSubject("n-rs"), AckPolicy: jetstream.AckExplicitPolicy})
		if err != nil {
			t.Fatal(err)
		}
		pd := protocol.Dispatch{TaskID: id, Type: "t", Model: "m", Node: "n-rs", Attempt: 1, MaxAttempts: 1,
			Deadline: time.Now().Add(time.Hour)}
		m := &nats.Msg{Subject: topology.DispatchSubject("n-rs"), Data: taskBody(id, `"`+id+`"`), Header: pd.Header()}
		if _, err := js.PublishMsg(context.Background(), m); err != nil {
			t.Fatal(err)
		}
		batch, err := oc.Fetch(1, jetstream.FetchMaxWait(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for msg := range batch.Messages() {
			if o, err := protocol.ParseDispatch(msg.Headers()); string(msg.Data()) == "" || err != nil || o.TaskID != id {
				t.Fatalf("outcome %s", msg.Data())
			}
			_ = msg.Ack()
			return
		}
		t.Fatalf("%s: no outcome (%v)", id, batch.Error())
	}
	roundTrip("before")
	ensure = false
	s1.Shutdown()
	s1.WaitForShutdown()
	startServer(t, dir, port)
	waitFor(t, 10*time.Second, "reconnection", func() bool { return nc.IsConnected() })
	roundTrip("after")

	// The node announces itself again.
	waitFor(t, 10*time.Second, "a heartbeat after the restart", func() bool {
		kv, err := js.KeyValue(context.Background(), topology.BucketNodes)
		if err != nil {
			return false
		}
		_, err = kv.Get(context.Background(), "n-rs")
		return err == nil
	})
	cancel() // before the server stops
	stopped = true
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

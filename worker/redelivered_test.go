package worker

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/shared/natstest"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// A dispatch whose outcome is settled but whose ack was lost (in a cluster
// fault the server drops it, or the dispatcher's ack of a direct report
// never reaches the consumer leader) is delivered again at every ack wait
// until the sweeper deletes it at its deadline. The node ran it: it acks
// the redelivery and does not run the task again (issue 45: plain tasks
// ran 4 times with max_attempts 3 in make chaos-cluster, each run of one
// attempt an ack wait apart).
func TestDispatchBackAfterItsAckWasLostIsNotRunAgain(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "n-lost-ack")
	// The stand-in dispatcher answers "acked, the result is stored" but
	// does not ack the dispatch: its ack is lost.
	answered := make(chan struct{}, 16)
	sub, err := h.srv.NC.QueueSubscribe(topology.ReportSubject(h.node), topology.QueueDispatchers, func(m *nats.Msg) {
		_ = m.Respond([]byte(`{"status":"acked"}`))
		answered <- struct{}{}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := h.srv.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	cfg := h.config()
	cfg.AckWait = 300 * time.Millisecond // redelivered soon after the lost ack
	r := h.start(cfg, WithHandler("count", func(context.Context, Task) (any, error) { runs.Add(1); return "ok", nil }),
		WithModels([]ModelSpec{goModel("m", "count")}))
	h.dispatch("a1", "m", dispatchOpts{})
	select {
	case <-answered:
	case <-time.After(10 * time.Second):
		t.Fatal("no direct report")
	}
	// Either the redelivery is acked by the node (the stream is empty) or
	// the task ran again.
	waitFor(t, 10*time.Second, "the redelivered dispatch acked, or run again", func() bool {
		return h.dispatchesLeft(t) == 0 || runs.Load() > 1
	})
	if n := runs.Load(); n != 1 {
		t.Fatalf("the task ran %d times: a dispatch delivered again after its outcome was settled was run again", n)
	}
	if n := r.w.delivered.acked.Load(); n < 1 {
		t.Fatalf("%d redeliveries acked without a run, want at least 1", n)
	}
	if n := h.pendingOutcomes(); n != 0 {
		t.Fatalf("%d outcomes stored: the redelivery of a settled dispatch reports nothing", n)
	}
}

// ackDeniedServer is an embedded server whose user n1 may publish anything
// but a dispatch's ack subject: the node's acks and progress signals are
// lost, as in a cluster fault, and every dispatch comes back each ack wait.
func ackDeniedServer(t *testing.T) (*harness, string) {
	t.Helper()
	return deniedServer(t, "$JS.ACK."+topology.StreamDispatch+".>")
}

// deniedServer is a harness on an embedded server with the streams, an
// admin user and a node user n1 that may publish anything but deny, and
// the path of n1's password file.
func deniedServer(t *testing.T, deny string) (*harness, string) {
	t.Helper()
	dir := t.TempDir()
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true,
		StoreDir: dir, NoLog: true, NoSigs: true, Users: []*server.User{
			{Username: "admin", Password: "admin-pw"},
			{Username: "n1", Password: "n1-pw", Permissions: &server.Permissions{
				Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: []string{deny}}}},
		}})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats not ready")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	nc, err := nats.Connect(s.ClientURL(), nats.UserInfo("admin", "admin-pw"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := topology.Ensure(ctx, js, topology.Config{}); err != nil {
		t.Fatal(err)
	}
	oc, err := js.CreateOrUpdateConsumer(ctx, topology.StreamOutcomes, jetstream.ConsumerConfig{
		Durable: "test-dispatcher", FilterSubject: topology.OutcomeSubject("n1"), AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	pw := filepath.Join(dir, "pw")
	if err := os.WriteFile(pw, []byte("n1-pw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return &harness{t: t, srv: &natstest.Server{Server: s, URL: s.ClientURL(), NC: nc, JS: js}, node: "n1", outc: oc}, pw
}

// A dispatch delivered again while the node still runs it (its progress
// signals lost) is left to the delivery that runs it, and once its stored
// outcome is settled, a later redelivery is acked without a run: a failed
// attempt, reported through MLSCHED_OUTCOMES, runs once however often its
// dispatch comes back.
func TestDispatchBackWhileRunningOrAfterItsOutcomeIsStoredRunsOnce(t *testing.T) {
	t.Parallel()
	h, pw := ackDeniedServer(t)
	var runs atomic.Int32
	release := make(chan struct{})
	cfg := h.config()
	cfg.NATS.User, cfg.NATS.PasswordFile = "n1", pw
	cfg.AckWait = 300 * time.Millisecond
	r := h.start(cfg, WithLogger(zerolog.Nop()), WithHandler("slow-fail", func(ctx context.Context, _ Task) (any, error) {
		runs.Add(1)
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil, errors.New("model broke")
	}), WithModels([]ModelSpec{goModel("m", "slow-fail")}))
	h.dispatch("b1", "m", dispatchOpts{})
	waitFor(t, 10*time.Second, "the dispatch delivered again while it runs, or run twice", func() bool {
		return r.w.delivered.running.Load() >= 1 || runs.Load() > 1
	})
	if n := runs.Load(); n != 1 {
		t.Fatalf("the task ran %d times while its first run went on", n)
	}
	close(release)
	if o := h.next(10 * time.Second); o.TaskID != "b1" || o.Status != protocol.OutcomeModelError {
		t.Fatalf("outcome %+v", o.Outcome)
	}
	waitFor(t, 10*time.Second, "the dispatch delivered again after its outcome was stored, or run again", func() bool {
		return r.w.delivered.acked.Load() >= 2 || runs.Load() > 1
	})
	if n := runs.Load(); n != 1 {
		t.Fatalf("the task ran %d times: a dispatch delivered again after its outcome was stored was run again", n)
	}
	if n := h.pendingOutcomes(); n != 0 {
		t.Fatalf("%d more outcomes stored for the one attempt", n)
	}
}

// The node remembers a dispatch until its deadline, tells a redelivery
// (the same message) from a new dispatch of the same attempt (another
// message: the attempt streams were lost and it was dispatched again), and
// forgets what went back unsettled.
func TestDeliveriesRemembered(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	ds := newDeliveries()
	ds.now = func() time.Time { return now }
	k1 := deliveryKey{seq: 7, stored: 1}
	until := now.Add(10 * time.Second)
	if v := ds.begin("o:a:1", k1, until); v != deliveryNew {
		t.Fatalf("first delivery: %v", v)
	}
	if v := ds.begin("o:a:1", k1, until); v != deliveryDuplicate {
		t.Fatalf("redelivered while running: %v", v)
	}
	ds.settled("o:a:1")
	if v := ds.begin("o:a:1", k1, until); v != deliveryDone {
		t.Fatalf("redelivered once settled: %v", v)
	}
	if v := ds.begin("o:a:1", deliveryKey{seq: 1, stored: 2}, until); v != deliveryNew {
		t.Fatalf("another message of the same attempt: %v", v)
	}
	ds.forget("o:a:1")
	if v := ds.begin("o:a:1", deliveryKey{seq: 1, stored: 2}, until); v != deliveryNew {
		t.Fatalf("redelivered after going back unsettled: %v", v)
	}
	if v := ds.begin("", k1, until); v != deliveryNew {
		t.Fatalf("no id: %v", v)
	}
	now = until // past its deadline nothing is remembered
	if v := ds.begin("o:b:1", deliveryKey{seq: 8, stored: 3}, now.Add(time.Second)); v != deliveryNew || ds.size() != 1 {
		t.Fatalf("after the deadline: %v, %d remembered", v, ds.size())
	}
}

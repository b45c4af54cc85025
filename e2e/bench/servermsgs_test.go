package bench

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mlsched/mlsched/e2e/harness"
)

// The counts come from a real nats-server's monitoring endpoints: ten
// publishes of one named connection, each delivered to a subscriber of
// another, are one message in and one out per "task", split by role.
func TestServerMsgsCountsARealServer(t *testing.T) {
	g, err := harness.NewGroup(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer g.Stop()
	n, err := g.StartNATS("nats", "")
	if err != nil {
		t.Fatal(err)
	}
	pub, err := nats.Connect(n.URL, nats.Name("mlsched-bench-producer"))
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	sub, err := nats.Connect(n.URL, nats.Name("mlsched-worker-node-1"))
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	s, err := sub.SubscribeSync("x.y")
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	before, err := readServerCounts(ctx, n.MonitorURL)
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		if err := pub.Publish("x.y", []byte("0123456789")); err != nil {
			t.Fatal(err)
		}
	}
	for range 10 {
		if _, err := s.NextMsg(10 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	after, err := readServerCounts(ctx, n.MonitorURL)
	if err != nil {
		t.Fatal(err)
	}
	m := before.perTask(after, 10)
	if m.InMsgs != 1 || m.OutMsgs != 1 || m.InBytes != 10 || m.OutBytes != 10 {
		t.Fatalf("per task: %s, want 1 in and 1 out of 10 bytes", m)
	}
	if p, w := m.ByRole["producer"], m.ByRole["worker"]; p.In != 1 || p.Out != 0 || w.In != 0 || w.Out != 1 {
		t.Fatalf("by role: %+v, want producer 1/0 and worker 0/1", m.ByRole)
	}
	if !strings.Contains(m.String(), "producer 1.00/0.00") {
		t.Fatalf("String() = %q", m.String())
	}
}

func TestConnRole(t *testing.T) {
	for name, want := range map[string]string{"mlsched-dispatcher-d1": "dispatcher", "mlsched-worker-node-3": "worker",
		"bench-sink-node-1": "sink", "mlsched-bench-relay": "relay", "": "other", "nats-cli": "nats"} {
		if got := connRole(name); got != want {
			t.Errorf("connRole(%q) = %q, want %q", name, got, want)
		}
	}
}

package harness_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/e2e/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }

// A message acknowledged by a file-backed stream survives a restart of the
// server, and the cluster's client reconnects by itself.
func TestNATSRestartKeepsStream(t *testing.T) {
	t.Parallel()
	c := harness.New(t)
	n := c.StartNATS()
	if !strings.Contains(n.Logs(), "sync_interval") && !strings.Contains(n.Logs(), "Starting JetStream") {
		t.Errorf("nats log does not show JetStream starting:\n%s", n.Logs())
	}
	_, js := c.Conn()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "t.a", []byte("kept")); err != nil {
		t.Fatal(err)
	}
	pid := n.Pid()
	if err := n.Restart(); err != nil {
		t.Fatal(err)
	}
	if n.Pid() == pid {
		t.Fatalf("restart kept pid %d", pid)
	}
	var got string
	harness.Eventually(t, 30*time.Second, "read back after restart", func() error {
		s, err := js.Stream(ctx, "T")
		if err != nil {
			return err
		}
		m, err := s.GetLastMsgForSubject(ctx, "t.a")
		if err != nil {
			return err
		}
		got = string(m.Data)
		return nil
	})
	if got != "kept" {
		t.Fatalf("after restart got %q, want %q", got, "kept")
	}
}

func TestKillAndStop(t *testing.T) {
	t.Parallel()
	c := harness.New(t)
	n := c.StartNATS()
	n.Kill()
	select {
	case <-n.Exited():
	default:
		t.Fatal("Kill returned before the process exited")
	}
	if n.Running() {
		t.Fatal("killed process still running")
	}
	if err := n.ExitErr(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("exit error after SIGKILL = %v, want signal: killed", err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	if err := n.Stop(); err != nil {
		t.Fatalf("graceful stop: %v", err)
	}
	if n.Running() {
		t.Fatal("stopped process still running")
	}
	if err := n.Stop(); err != nil {
		t.Fatalf("second Stop must be a no-op, got %v", err)
	}
	if got := strings.Count(n.Logs(), "=== harness: nats run"); got != 2 {
		t.Fatalf("log shows %d runs, want 2", got)
	}
}

func TestRedis(t *testing.T) {
	t.Parallel()
	c := harness.New(t)
	r := c.StartRedis()
	if r.Port == 6379 {
		t.Fatal("redis on the default port")
	}
	cl := r.Client(t)
	ctx := context.Background()
	if err := cl.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if v, err := cl.Get(ctx, "k").Result(); err != nil || v != "v" {
		t.Fatalf("get = %q, %v", v, err)
	}
	if err := r.Restart(); err != nil {
		t.Fatal(err)
	}
	// No persistence: the data is gone, which the chaos tests rely on.
	if err := cl.Get(ctx, "k").Err(); err == nil {
		t.Fatal("key survived a restart without persistence")
	}
}

func TestStopTimeout(t *testing.T) {
	t.Parallel()
	c := harness.New(t)
	_ = c
	p := &harness.Process{Name: "stubborn", Path: "/bin/sh", Args: []string{"-c", `trap "" TERM; echo ready; while :; do sleep 0.05; done`},
		Dir: t.TempDir(), LogPath: t.TempDir() + "/log", StopTimeout: 300 * time.Millisecond}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	harness.Eventually(t, 10*time.Second, "shell prints ready", func() error {
		if !strings.Contains(p.Logs(), "\nready\n") { // the header line quotes the script
			return errors.New("not yet")
		}
		return nil
	})
	if err := p.Stop(); !errors.Is(err, harness.ErrStopTimeout) {
		t.Fatalf("Stop = %v, want ErrStopTimeout", err)
	}
	if p.Running() {
		t.Fatal("still running after forced stop")
	}
}

func TestEnvIsolated(t *testing.T) {
	t.Setenv("MLSCHED_LEAK", "yes")
	dir := t.TempDir()
	p := &harness.Process{Name: "env", Path: "/bin/sh", Args: []string{"-c", `echo "leak=$MLSCHED_LEAK own=$MLSCHED_OWN"`},
		Env: []string{"MLSCHED_OWN=1"}, Dir: dir, LogPath: dir + "/log"}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	<-p.Exited()
	if !strings.Contains(p.Logs(), "leak= own=1") {
		t.Fatalf("environment not isolated: %q", p.Logs())
	}
}

// A worker is ready once its heartbeat is in the node bucket; a restart is
// ready only with a heartbeat of the new run; SIGTERM drains it to exit 0.
func TestWorkerLifecycle(t *testing.T) {
	t.Parallel()
	if !harness.Available("worker") {
		t.Skip("worker is not in the checkout yet")
	}
	c := harness.New(t)
	c.StartNATS()
	w := c.StartWorker(harness.WorkerOptions{NodeID: "hw-1", ModelsFile: "../testdata/node-1.yaml", SimSeed: 1})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	hb1, err := w.Heartbeat(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if hb1.Node != "hw-1" || len(hb1.Models) != 2 {
		t.Fatalf("heartbeat %+v, want node hw-1 with 2 models", hb1)
	}
	if err := w.Restart(); err != nil {
		t.Fatal(err)
	}
	hb2, err := w.Heartbeat(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !hb2.StartedAt.After(hb1.StartedAt) {
		t.Fatalf("after restart the heartbeat still says started %v (first run %v)", hb2.StartedAt, hb1.StartedAt)
	}
	if err := w.Stop(); err != nil {
		t.Fatalf("graceful stop: %v", err)
	}
	if got := strings.Count(w.Logs(), "=== harness: worker-hw-1 run"); got != 2 {
		t.Fatalf("log shows %d runs, want 2", got)
	}
}

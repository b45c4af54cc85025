package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/mlsched/mlsched/dispatcher"
	"github.com/mlsched/mlsched/shared/natstest"
	"github.com/mlsched/mlsched/shared/protocol"
)

// startDispatcher runs a dispatcher replica in-process with in-memory
// statistics until the test ends.
func startDispatcher(t *testing.T, srv *natstest.Server) *dispatcher.Dispatcher {
	t.Helper()
	cfg := dispatcher.DefaultConfig()
	cfg.NATS.URL, cfg.Name, cfg.NoNodeWait = srv.URL, "cli-test", time.Minute
	cfg.SnapshotInterval = 50 * time.Millisecond
	cfg.HTTPAddr = "off"
	d, err := dispatcher.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("dispatcher: %v", err)
		}
	})
	eventually(t, "the dispatcher answering", func() bool {
		_, err := srv.NC.Request(protocol.SubjectAdminStats, nil, time.Second)
		return err == nil
	})
	return d
}

func TestCancelCommand(t *testing.T) {
	t.Parallel()
	srv := natstest.New(t)
	startDispatcher(t, srv)
	// No node serves the type: the task waits in the backlog.
	if code, _, errs := cli(t, srv.URL, "", "submit", "-type", "nobody", "-id", "c1", "-payload", `{}`); code != exitOK {
		t.Fatalf("submit: code %d: %s", code, errs)
	}
	code, out, errs := cli(t, srv.URL, "", "cancel", "-reason", "changed my mind", "c1")
	if code != exitOK || !strings.Contains(out, "cancelled c1 (it was waiting)") {
		t.Fatalf("cancel: code %d, stdout %q, stderr %q", code, out, errs)
	}
	code, out, _ = cli(t, srv.URL, "", "result", "c1")
	if code != exitPartial || !strings.Contains(out, `"status":"cancelled"`) || !strings.Contains(out, "changed my mind") { // did not succeed: 3
		t.Fatalf("result: code %d: %s", code, out)
	}
	if code, _, errs = cli(t, srv.URL, "", "cancel", "c1"); code != exitFinished || !strings.Contains(errs, "already finished: its result is cancelled") {
		t.Fatalf("second cancel: code %d, stderr %q", code, errs)
	}
	if code, _, errs = cli(t, srv.URL, "", "cancel", "nope"); code != exitUnknown || !strings.Contains(errs, "no task nope") {
		t.Fatalf("unknown cancel: code %d, stderr %q", code, errs)
	}
	if code, _, errs = cli(t, srv.URL, "", "cancel", "a.b"); code != exitUsage || !strings.Contains(errs, "reserved") {
		t.Fatalf("invalid id: code %d, stderr %q", code, errs)
	}
	if code, _, _ = cli(t, srv.URL, "", "cancel"); code != exitUsage {
		t.Fatalf("no id: code %d", code)
	}
}

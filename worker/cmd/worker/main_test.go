package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/shared/natstest"
	"github.com/mlsched/mlsched/shared/topology"
)

// The test binary doubles as the worker binary when this variable is set.
const asMain = "MLSCHED_WORKER_TEST_AS_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(asMain) == "1" {
		os.Exit(run())
	}
	os.Exit(m.Run())
}

func command(t *testing.T, env ...string) (*exec.Cmd, *bytes.Buffer) {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append([]string{asMain + "=1", "PATH=" + os.Getenv("PATH"), "MLSCHED_NATS_URL=nats://127.0.0.1:1"}, env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	return cmd, &stderr
}

func modelsFile(t *testing.T, yaml string) string {
	p := filepath.Join(t.TempDir(), "models.yaml")
	if err := os.WriteFile(p, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestInvalidConfigurationExits2(t *testing.T) {
	t.Parallel()
	good := modelsFile(t, "models: [{name: m, types: [t], executor: go, go: {handler: echo}}]")
	cases := []struct {
		name string
		env  []string
		want string
	}{
		{"bad number", []string{"MLSCHED_CONCURRENCY=lots", "MLSCHED_MODELS_FILE=" + good}, `invalid MLSCHED_CONCURRENCY="lots"`},
		{"zero concurrency", []string{"MLSCHED_CONCURRENCY=-2", "MLSCHED_MODELS_FILE=" + good}, "invalid MLSCHED_CONCURRENCY=-2"},
		{"negative ack wait", []string{"MLSCHED_ACK_WAIT=-1s", "MLSCHED_MODELS_FILE=" + good}, "invalid MLSCHED_ACK_WAIT=-1s: must be positive"},
		{"bad duration", []string{"MLSCHED_ACK_WAIT=soon", "MLSCHED_MODELS_FILE=" + good}, `invalid MLSCHED_ACK_WAIT="soon"`},
		{"http url", []string{"MLSCHED_NATS_URL=http://127.0.0.1:8222", "MLSCHED_MODELS_FILE=" + good}, "http:// is not a NATS URL; use nats://"},
		{"bad node id", []string{"MLSCHED_NODE_ID=a.b", "MLSCHED_MODELS_FILE=" + good}, "MLSCHED_NODE_ID"},
		{"bad log level", []string{"MLSCHED_LOG_LEVEL=loud", "MLSCHED_MODELS_FILE=" + good}, "MLSCHED_LOG_LEVEL"},
		{"missing models file", []string{"MLSCHED_MODELS_FILE=/nonexistent/models.yaml"}, `MLSCHED_MODELS_FILE="/nonexistent/models.yaml"`},
		{"bad models file", []string{"MLSCHED_MODELS_FILE=" + modelsFile(t, "models: [{name: m1, types: [t], executor: gpu}]")}, `model "m1": executor`},
		{"http model without url", []string{"MLSCHED_MODELS_FILE=" + modelsFile(t, "models: [{name: m3, types: [t], executor: http, http: {mode: oip}}]")}, `model "m3": http.url: missing`},
		{"http bad mode", []string{"MLSCHED_MODELS_FILE=" + modelsFile(t, "models: [{name: m4, types: [t], executor: http, http: {url: \"http://h\", mode: grpc}}]")}, `model "m4": http.mode: "grpc"`},
		{"input naming no tensor", []string{"MLSCHED_MODELS_FILE=" + modelsFile(t, "models: [{name: m5, types: [t], executor: http, http: {url: \"http://h\", mode: oip, inputs: [{datatype: FP32, shape: [1]}]}}]")}, `model "m5": http.inputs[0].name: missing`},
		{"unknown handler", []string{"MLSCHED_MODELS_FILE=" + modelsFile(t, "models: [{name: m2, types: [t], executor: go, go: {handler: nope}}]")}, `"nope" is not registered`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			cmd, stderr := command(t, c.env...)
			err := cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 2 {
				t.Fatalf("exit: %v (stderr %s), want status 2", err, stderr)
			}
			if !strings.Contains(stderr.String(), c.want) {
				t.Fatalf("stderr %q does not name %q", stderr, c.want)
			}
		})
	}
}

func TestSIGTERMDrainsAndExits0(t *testing.T) {
	t.Parallel()
	srv := natstest.New(t)
	models := modelsFile(t, "models: [{name: m, types: [t], executor: go, go: {handler: echo}}]")
	cmd, stderr := command(t, "MLSCHED_NATS_URL="+srv.URL, "MLSCHED_NODE_ID=cmd-1", "MLSCHED_MODELS_FILE="+models,
		"MLSCHED_HEARTBEAT_INTERVAL=100ms", "MLSCHED_LOG_FORMAT=console")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() { _ = cmd.Process.Kill() }()
	// Up once it announces itself.
	deadline := time.Now().Add(15 * time.Second)
	for {
		kv, err := srv.JS.KeyValue(context.Background(), topology.BucketNodes)
		if err == nil {
			if _, err := kv.Get(context.Background(), "cmd-1"); err == nil {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no heartbeat; stderr: %s", stderr)
		}
		time.Sleep(10 * time.Millisecond) // polling interval
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("exit: %v; stderr: %s", err, stderr)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("no exit after SIGTERM; stderr: %s", stderr)
	}
	// Console logs into a file or a pipe carry no ANSI colours.
	if strings.Contains(stderr.String(), "\x1b[") || !strings.Contains(stderr.String(), "worker started") {
		t.Errorf("console log to a pipe: %q, want plain text with the start line", stderr)
	}
	kv, _ := srv.JS.KeyValue(context.Background(), topology.BucketNodes)
	if _, err := kv.Get(context.Background(), "cmd-1"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("heartbeat still there after shutdown: %v", err)
	}
}

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/shared/natstest"
	"github.com/mlsched/mlsched/shared/topology"
)

// cli runs the CLI in-process against url.
func cli(t *testing.T, url string, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	full := append([]string{"-nats", url, "-timeout", "5s"}, args...)
	code = run(ctx, full, strings.NewReader(stdin), &out, &errb)
	return code, out.String(), errb.String()
}

// cluster starts NATS with the protocol v1 streams in memory.
func cluster(t *testing.T) *natstest.Server {
	t.Helper()
	srv := natstest.New(t)
	if err := topology.Ensure(tctx(t), srv.JS, topology.Config{Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	return srv
}

func tctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond) // poll interval
	}
}

func streamMsgs(t *testing.T, js jetstream.JetStream, name string) []*jetstream.RawStreamMsg {
	t.Helper()
	s, err := js.Stream(tctx(t), name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(tctx(t))
	if err != nil {
		t.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(tctx(t), seq)
		if err != nil {
			continue // deleted
		}
		out = append(out, m)
	}
	return out
}

func publishJSON(t *testing.T, js jetstream.JetStream, subject string, v any) uint64 {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	ack, err := js.Publish(tctx(t), subject, data)
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}

func TestUsage(t *testing.T) {
	t.Parallel()
	if code, _, errs := cli(t, "nats://127.0.0.1:1", ""); code != exitUsage || !strings.Contains(errs, "Commands:") {
		t.Errorf("no command: code %d, stderr %q", code, errs)
	}
	code, _, errs := cli(t, "nats://127.0.0.1:1", "", "frobnicate")
	if code != exitUsage || !strings.Contains(errs, `unknown command "frobnicate"`) || !strings.Contains(errs, "submit") {
		t.Errorf("unknown command: code %d, stderr %q", code, errs)
	}
	for _, c := range []struct{ args, want string }{
		{"submit -h", "-max-attempts"}, {"wait -h", "-wait-timeout"}, {"result -h", "result ID"},
		{"stats -h", "-json"}, {"nodes -h", "-json"}, {"dlq -h", "replay"}, {"dlq list -h", "-n"},
		{"dlq show -h", "SEQ"}, {"dlq replay -h", "-all"},
	} {
		// The unreachable URL proves -h needs no connection.
		code, _, errs := cli(t, "nats://127.0.0.1:1", "", strings.Fields(c.args)...)
		if code != exitOK || !strings.Contains(errs, c.want) {
			t.Errorf("%s: code %d, stderr %q", c.args, code, errs)
		}
	}
	if code, _, errs := cli(t, "nats://127.0.0.1:1", "", "-h"); code != exitOK || !strings.Contains(errs, "MLSCHED_NATS_URL") {
		t.Errorf("-h: code %d, stderr %q", code, errs)
	}
	if code, _, errs := cli(t, "nats://127.0.0.1:1", "", "nodes"); code != exitFailed || !strings.Contains(errs, "connect") {
		t.Errorf("unreachable server: code %d, stderr %q", code, errs)
	}
	if code, _, _ := cli(t, "nats://127.0.0.1:1", "", "submit", "-bogus"); code != exitUsage {
		t.Errorf("bad flag: code %d", code)
	}
}

func TestEnvironmentNames(t *testing.T) {
	var b bytes.Buffer
	usage(&b, flag.NewFlagSet("x", flag.ContinueOnError))
	for _, v := range []string{"MLSCHED_NATS_URL", "MLSCHED_STORAGE", "MLSCHED_MAX_PAYLOAD_BYTES", "MLSCHED_LOG_FORMAT", "MLSCHED_LOG_LEVEL"} {
		if !strings.Contains(b.String(), "  "+v+" ") { // aligned columns
			t.Errorf("usage does not list %s:\n%s", v, b.String())
		}
	}
}

func TestVersion(t *testing.T) {
	t.Parallel()
	for _, flag := range []string{"--version", "-version"} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), []string{flag}, strings.NewReader(""), &out, &errb); code != exitOK {
			t.Fatalf("%s: code %d, stderr %q", flag, code, errb.String())
		}
		if !strings.HasPrefix(out.String(), "mlsched ") || !strings.Contains(out.String(), "protocol v1") {
			t.Fatalf("%s printed %q", flag, out.String())
		}
	}
}

func TestProgressBarOnATerminal(t *testing.T) {
	var b bytes.Buffer
	p := newProgress(&b, true, 1000, time.Nanosecond)
	p.print(500, summary{Submitted: 42})
	p.done(1000, summary{Submitted: 84})
	got := b.String()
	for _, want := range []string{"\r[===============               ]  50.0%  42 submitted", "\r[==============================] 100.0%  84 submitted", "\x1b[K"} {
		if !strings.Contains(got, want) {
			t.Errorf("bar lacks %q: %q", want, got)
		}
	}
	if !strings.HasSuffix(got, "\n") {
		t.Errorf("the bar's line is not ended: %q", got)
	}
}

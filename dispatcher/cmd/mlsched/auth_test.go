package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestAuthInit(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "secrets")
	code, out, errs := cli(t, "", "", "auth", "init", "-dir", dir, "-nodes", "n1,n2")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, f := range []string{"auth.conf", "dispatcher.nk", "producer.nk", "admin.nk", "node-n1.nk", "node-n2.nk"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
	if !strings.Contains(out, "created") {
		t.Errorf("output: %s", out)
	}
	if code, _, _ := cli(t, "", "", "auth", "init", "-dir", dir, "-nodes", "bad.id"); code != exitFailed {
		t.Errorf("a dotted node id: exit %d", code)
	}
	if code, _, _ := cli(t, "", "", "auth", "init", "-nodes", "n1"); code != exitUsage {
		t.Errorf("no -dir: exit %d", code)
	}
}

// With -compose (make secrets) the output says compose's nats already
// includes auth.conf, not to include it and restart a server (issue 40).
func TestAuthInitComposeSaysNothingToDo(t *testing.T) {
	t.Parallel()
	dir := t.TempDir() + "/secrets"
	code, out, errs := cli(t, "", "", "auth", "init", "-compose", "-dir", dir)
	if code != exitOK {
		t.Fatalf("code %d, stderr %q", code, errs)
	}
	if strings.Contains(out, "include it from nats.conf") || !strings.Contains(out, "nothing to do before docker compose up") {
		t.Errorf("make secrets output:\n%s\nwant: compose's nats includes auth.conf, nothing to do", out)
	}
	code, out, _ = cli(t, "", "", "auth", "init", "-compose", "-dir", dir, "-rotate", "producer")
	if code != exitOK || !strings.Contains(out, "docker compose kill -s HUP nats") {
		t.Errorf("after a rotation (code %d):\n%s\nwant the reload step", code, out)
	}
}

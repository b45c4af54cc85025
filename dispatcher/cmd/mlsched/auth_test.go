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

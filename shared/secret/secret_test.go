package secret_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mlsched/mlsched/shared/secret"
)

func TestURL(t *testing.T) {
	for in, want := range map[string]string{
		"nats://127.0.0.1:4222":                       "nats://127.0.0.1:4222",
		"nats://alice:s3cret@host:4222":               "nats://REDACTED@host:4222",
		"nats://tok3n@host:4222":                      "nats://REDACTED@host:4222",
		"redis://default:pw@redis:6379/0":             "redis://REDACTED@redis:6379/0",
		"rediss://u:p%40ss@r:6380":                    "rediss://REDACTED@r:6380",
		"nats://a:b@h1:4222,nats://c:d@h2:4222,h3:42": "nats://REDACTED@h1:4222,nats://REDACTED@h2:4222,h3:42",
		"": "",
	} {
		if got := secret.URL(in); got != want {
			t.Errorf("URL(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestTextAndError(t *testing.T) {
	in := `dial "nats://bob:hunter2@10.0.0.1:4222": refused; also redis://:pw@r:1/2`
	got := secret.Text(in)
	for _, s := range []string{"hunter2", "bob", ":pw@"} {
		if strings.Contains(got, s) {
			t.Fatalf("Text left %q in %q", s, got)
		}
	}
	if !strings.Contains(got, "10.0.0.1:4222") || !strings.Contains(got, "r:1/2") {
		t.Fatalf("Text removed the host: %q", got)
	}
	base := errors.New("boom")
	err := secret.Error(fmt.Errorf("connect nats://u:p@h: %w", base))
	if strings.Contains(err.Error(), "u:p") || !errors.Is(err, base) {
		t.Fatalf("Error = %q, Is(base) = %v", err, errors.Is(err, base))
	}
	if secret.Error(nil) != nil {
		t.Fatal("Error(nil) != nil")
	}
}

func TestReadFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "pw")
	if err := os.WriteFile(p, []byte("  s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if s, err := secret.ReadFile(p); err != nil || s != "s3cret" {
		t.Fatalf("ReadFile = %q, %v", s, err)
	}
	empty := filepath.Join(dir, "empty")
	_ = os.WriteFile(empty, []byte("\n"), 0o600)
	if _, err := secret.ReadFile(empty); !errors.Is(err, secret.ErrEmpty) {
		t.Fatalf("empty file: %v", err)
	}
	if _, err := secret.ReadFile(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("missing file: no error")
	}
}

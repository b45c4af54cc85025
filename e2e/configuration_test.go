package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/mlsched/mlsched/e2e/harness"
)

// envLine is one variable of a binary's -h: name, default ("" for none),
// meaning. The binaries print them from their configuration structs' tags.
var envLine = regexp.MustCompile(`^\s+(MLSCHED_[A-Z0-9_]+)\s{2,}(?:default (\S+)|-)\s{2,}(.*)$`)

// configurationReference is docs/configuration.md as the binaries' own -h
// make it: one table per binary.
func configurationReference(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	// § stands for a backquote, which a raw string cannot hold.
	b.WriteString(strings.ReplaceAll(`# Configuration reference

Every variable each binary reads, with its default and meaning, generated from the binaries' own §-h§ (their
configuration structs' tags) by §TestConfigurationReference§ (e2e/configuration_test.go), which fails when this file
and the code disagree. Regenerate it with
§MLSCHED_UPDATE_DOCS=1 go test -run TestConfigurationReference ./e2e/§.

An invalid value stops a process at start with a message naming the variable. Streams and buckets are created by
whichever process starts first: give every process the same §MLSCHED_STORAGE§, §MLSCHED_STREAM_REPLICAS§ and
§MLSCHED_NODE_TTL§. Secrets are only read from files and never logged; credentials, TLS and per-role inbox prefixes
are set up in [security.md](security.md); the models file (§MLSCHED_MODELS_FILE§) is described in
[models.md](models.md). The dispatcher and the worker run Go's collector at §GOGC=200§ unless §GOGC§ is set.
`, "§", "`"))
	for _, bin := range []struct{ name, title string }{
		{"dispatcher", "Dispatcher (`bin/dispatcher`)"},
		{"worker", "Worker (`bin/worker`)"},
		{"mlsched", "CLI (`bin/mlsched`) and the Go SDK (`client.Dial` reads the `MLSCHED_NATS_*` variables)"},
	} {
		cmd := exec.Command(harness.Binary(t, bin.name), "-h")
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
		out, _ := cmd.CombinedOutput() // -h exits 0, usage on stderr
		fmt.Fprintf(&b, "\n## %s\n\n| variable | default | meaning |\n|---|---|---|\n", bin.title)
		n := 0
		for _, l := range strings.Split(string(out), "\n") {
			m := envLine.FindStringSubmatch(l)
			if m == nil {
				continue
			}
			def := "(none)"
			if m[2] != "" {
				def = "`" + m[2] + "`"
			}
			fmt.Fprintf(&b, "| `%s` | %s | %s |\n", m[1], def, strings.ReplaceAll(strings.TrimSpace(m[3]), "|", `\|`))
			n++
		}
		if n < 5 {
			t.Fatalf("%s -h listed %d variables:\n%s", bin.name, n, out)
		}
	}
	return b.String()
}

// docs/configuration.md is what the code says, variable for variable.
func TestConfigurationReference(t *testing.T) {
	requireBinaries(t, "dispatcher", "worker", "mlsched")
	want := configurationReference(t)
	path := repoPath(t, "docs/configuration.md")
	if os.Getenv("MLSCHED_UPDATE_DOCS") == "1" {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		gl, wl := strings.Split(string(got), "\n"), strings.Split(want, "\n")
		for i := 0; i < max(len(gl), len(wl)); i++ {
			var g, w string
			if i < len(gl) {
				g = gl[i]
			}
			if i < len(wl) {
				w = wl[i]
			}
			if g != w {
				t.Fatalf("docs/configuration.md disagrees with the binaries at line %d:\n  file: %s\n  code: %s\n"+
					"regenerate: MLSCHED_UPDATE_DOCS=1 go test -run TestConfigurationReference ./e2e/", i+1, g, w)
			}
		}
	}
}

package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"testing"
)

// EnvDocPath enables TestDocPathIsTheTraceOfOneTask (make docpath, and
// make test, set it): it builds the whole project with coverage counters,
// which takes a minute or two.
const EnvDocPath = "MLSCHED_DOCPATH"

// TestDocPathIsTheTraceOfOneTask holds dispatcher/doc.go's list of the files
// one successful task passes through to the code that really runs (issue
// 37): cmd/mlsched-docpath, built with coverage counters over the project,
// runs a dispatcher and a worker in one process and reports the files whose
// code ran in each of three one-task windows (Submit to Wait) and in none of
// the idle windows between them. doc.go must list every such file, and
// every file it lists must have run for a task.
func TestDocPathIsTheTraceOfOneTask(t *testing.T) {
	if os.Getenv(EnvDocPath) == "" {
		t.Skipf("builds the project with coverage counters: make docpath (or set %s=1)", EnvDocPath)
	}
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "mlsched-docpath")
	build := exec.Command("go", "build", "-cover", "-covermode=atomic", "-coverpkg=github.com/mlsched/mlsched/...", "-o", bin, "./cmd/mlsched-docpath")
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, b)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr[max(0, len(ee.Stderr)-4096):]
		}
		t.Fatalf("mlsched-docpath: %v\n%s", err, stderr)
	}
	var rep struct{ Path, Ran []string }
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("mlsched-docpath printed %q: %v", out, err)
	}
	t.Logf("on the path of one task (%d files): %v", len(rep.Path), rep.Path)
	listed := docPathFiles(t)
	for _, f := range rep.Path {
		if !slices.Contains(listed, f) {
			t.Errorf("dispatcher/doc.go's path leaves out %s, which every task runs through", f)
		}
	}
	for _, f := range listed {
		if !slices.Contains(rep.Ran, f) {
			t.Errorf("dispatcher/doc.go's path lists %s, which no task ran through", f)
		}
	}
}

// docPathFiles are the files dispatcher/doc.go's numbered path names.
func docPathFiles(t *testing.T) []string {
	t.Helper()
	doc, err := os.ReadFile(repoPath(t, "dispatcher/doc.go"))
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, m := range regexp.MustCompile(`(?m)^//\s+\d+\. ([\w./-]+\.go):`).FindAllStringSubmatch(string(doc), -1) {
		files = append(files, m[1])
	}
	return files
}

package e2e

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// goCmd runs the go command at the repository root (the workspace).
func goCmd(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = repoPath(t, dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s (in %s): %v\n%s%s", strings.Join(args, " "), dir, err, out, stderr.String())
	}
	return string(out)
}

// The binaries we ship link neither the testing package (a test helper leaked
// into production code) nor the NATS server (only the demo and the tests
// embed one).
func TestShippedBinariesLinkNoTestCode(t *testing.T) {
	t.Parallel()
	for _, pkg := range []string{"./dispatcher/cmd/dispatcher", "./dispatcher/cmd/mlsched", "./worker/cmd/worker"} {
		deps := strings.Fields(goCmd(t, ".", "list", "-deps", pkg))
		for _, d := range deps {
			if d == "testing" || strings.HasPrefix(d, "github.com/nats-io/nats-server/") ||
				strings.HasSuffix(d, "/natstest") || strings.HasSuffix(d, "/redistest") {
				t.Errorf("%s links %s", pkg, d)
			}
		}
	}
}

// The dispatcher module stands alone: it does not require the worker module
// (the demo, which needs both, lives in e2e). Every module's go.mod is tidy,
// so direct dependencies are listed as direct.
func TestModuleBoundaries(t *testing.T) {
	t.Parallel()
	var mod struct {
		Require []struct{ Path string }
	}
	if err := json.Unmarshal([]byte(goCmd(t, "dispatcher", "mod", "edit", "-json")), &mod); err != nil {
		t.Fatal(err)
	}
	for _, r := range mod.Require {
		if r.Path == "github.com/mlsched/mlsched/worker" {
			t.Errorf("dispatcher/go.mod requires the worker module")
		}
	}
	for _, m := range []string{"shared", "dispatcher", "worker", "e2e"} {
		cmd := exec.Command("go", "mod", "tidy", "-diff")
		cmd.Dir = repoPath(t, m)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("%s/go.mod is not tidy (run go mod tidy there): %v\n%s", m, err, out)
		}
	}
}

// Packages by owner, by `go list -deps` of the shipped binaries: the worker
// links nothing of the dispatcher's and the dispatcher nothing of the
// worker's, and both reach JetStream through the one plumbing package.
func TestPackageOwners(t *testing.T) {
	t.Parallel()
	const plumbing = "github.com/mlsched/mlsched/shared/jsplumb"
	for _, c := range []struct{ dir, pkg, forbid string }{
		{"worker", "./cmd/worker", "github.com/mlsched/mlsched/dispatcher"},
		{"dispatcher", "./cmd/dispatcher", "github.com/mlsched/mlsched/worker"},
	} {
		uses := false
		for _, d := range strings.Fields(goCmd(t, c.dir, "list", "-deps", c.pkg)) {
			if d == c.forbid || strings.HasPrefix(d, c.forbid+"/") {
				t.Errorf("%s/%s links %s", c.dir, c.pkg, d)
			}
			uses = uses || d == plumbing
		}
		if !uses {
			t.Errorf("%s/%s does not use %s", c.dir, c.pkg, plumbing)
		}
	}
}

// shared/ holds what more than the dispatcher uses: every package in it is
// linked by the worker, or is one of the few kept there for others (the
// producer SDK, the Redis client that the test helper also opens, and the
// test and demo infrastructure). A package only the dispatcher uses belongs
// under dispatcher/ (internal where nothing outside it imports it).
func TestSharedHoldsOnlyWhatIsShared(t *testing.T) {
	t.Parallel()
	const prefix = "github.com/mlsched/mlsched/shared/"
	kept := map[string]string{
		"client":    "the producer SDK",
		"redisconn": "the one Redis client, also opened by redistest",
		"natsembed": "the embedded NATS server of the demo and the tests",
		"natstest":  "test infrastructure",
		"redistest": "test infrastructure",
		"tlstest":   "test infrastructure",
		"logtest":   "test infrastructure",
		"freeport":  "test infrastructure",
	}
	worker := map[string]bool{}
	for _, d := range strings.Fields(goCmd(t, "worker", "list", "-deps", "./cmd/worker")) {
		worker[d] = true
	}
	for _, p := range strings.Fields(goCmd(t, "shared", "list", "./...")) {
		name := strings.TrimPrefix(p, prefix)
		if _, ok := kept[name]; !ok && !worker[p] {
			t.Errorf("shared/%s is not linked by the worker: move it under dispatcher/ (or say in this test why it is shared)", name)
		}
	}
}

// The order of held tasks is one package (issue 37): imported by the
// dispatcher's hold and by the simulator, which used to mirror it (and
// drifted), and pure, so that the simulator can run it: it links nothing
// but the standard library, no NATS, no Redis.
func TestFairOrderIsOnePurePackage(t *testing.T) {
	t.Parallel()
	const fair = "github.com/mlsched/mlsched/dispatcher/internal/fairorder"
	for _, d := range strings.Fields(goCmd(t, "dispatcher", "list", "-deps", fair)) {
		if d != fair && strings.Contains(strings.SplitN(d, "/", 2)[0], ".") {
			t.Errorf("%s links %s: it must stay pure (the standard library only)", fair, d)
		}
	}
	for _, pkg := range []string{"github.com/mlsched/mlsched/dispatcher/internal/admission", "github.com/mlsched/mlsched/dispatcher/internal/simulate"} {
		imports := strings.Fields(goCmd(t, "dispatcher", "list", "-f", `{{join .Imports " "}}`, pkg))
		if !slices.Contains(imports, fair) {
			t.Errorf("%s does not import %s: the fair order has a copy again?", pkg, fair)
		}
	}
}

// dispatcher/doc.go lists, in order, the files one successful task passes
// through (issue 18: at most 14 were wanted, 26 at the start): every file it
// names exists, and the count it states is the count it lists, so that the
// list cannot go stale when code moves.
func TestDocPathNamesRealFiles(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile(repoPath(t, "dispatcher/doc.go"))
	if err != nil {
		t.Fatal(err)
	}
	step := regexp.MustCompile(`(?m)^//\s+(\d+)\. ([\w./-]+\.go):`)
	var files []string
	for i, m := range step.FindAllStringSubmatch(string(doc), -1) {
		if m[1] != strconv.Itoa(i+1) {
			t.Errorf("step %s is listed %d-th", m[1], i+1)
		}
		if _, err := os.Stat(repoPath(t, m[2])); err != nil {
			t.Errorf("step %s names %s: %v", m[1], m[2], err)
		}
		files = append(files, m[2])
	}
	stated := regexp.MustCompile(`in this order \((\d+) files`).FindStringSubmatch(string(doc))
	if len(files) == 0 || stated == nil || stated[1] != strconv.Itoa(len(files)) {
		t.Fatalf("doc.go states %v files and lists %d: %v", stated, len(files), files)
	}
}

// The binaries are built with profile-guided optimisation (make pgo): the
// default.pgo beside each main package must be a CPU profile of that binary
// on mlsched's hot path, not an empty file or another program's profile, or
// go build would silently optimise for nothing.
func TestPGOProfilesProfileTheirBinaries(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ profile, hot string }{
		{"dispatcher/cmd/dispatcher/default.pgo", "github.com/mlsched/mlsched/dispatcher/internal/admission.(*Stage).admitFrom"},
		{"worker/cmd/worker/default.pgo", "github.com/mlsched/mlsched/worker.(*Worker).process"},
	} {
		top := goCmd(t, ".", "tool", "pprof", "-top", "-cum", "-nodecount=400", repoPath(t, c.profile))
		if !strings.Contains(top, "Type: cpu") || !strings.Contains(top, c.hot) {
			t.Errorf("%s is not a CPU profile with %s in it (make pgo writes it):\n%.2000s", c.profile, c.hot, top)
		}
	}
}

// stagePath is the dispatcher's stages along a task's path (intake,
// admission, outcome, finish), as packages: each may import only stages
// after it, and none the wiring package.
var stagePath = []string{
	"github.com/mlsched/mlsched/dispatcher/internal/intake",
	"github.com/mlsched/mlsched/dispatcher/internal/admission",
	"github.com/mlsched/mlsched/dispatcher/internal/outcome",
	"github.com/mlsched/mlsched/dispatcher/internal/finish",
}

// The stages import forward along the path only: a stage imports no
// earlier stage and not the wiring package (github.com/.../dispatcher),
// and no package under dispatcher/internal imports the wiring package or
// a stage it does not precede (a helper package like policy or pipeline
// imports no stage at all).
func TestStagesImportForwardOnly(t *testing.T) {
	t.Parallel()
	const wiring = "github.com/mlsched/mlsched/dispatcher"
	internal := strings.Fields(goCmd(t, "dispatcher", "list", "./internal/..."))
	for _, pkg := range internal {
		at := slices.Index(stagePath, pkg)
		for _, d := range strings.Fields(goCmd(t, "dispatcher", "list", "-deps", pkg)) {
			if d == wiring {
				t.Errorf("%s imports the wiring package %s", pkg, wiring)
			}
			if i := slices.Index(stagePath, d); i >= 0 && d != pkg && (at < 0 || i < at) {
				t.Errorf("%s imports the stage %s, which is not after it on the path", pkg, d)
			}
		}
	}
	for _, s := range stagePath {
		if !slices.Contains(internal, s) {
			t.Errorf("stage %s is not a package under dispatcher/internal", s)
		}
	}
}

package harness

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// EnvBin names a directory holding prebuilt binaries (dispatcher, worker,
// mlsched, nats-server), e.g. the repository's bin/ after `make build`.
// When it is set nothing is built.
const EnvBin = "MLSCHED_E2E_BIN"

// target says how to build one binary: the package and the directory (inside
// the workspace) to run go build from.
type target struct {
	pkg string
	dir string // relative to the repository root
	src string // source directory whose presence tells the binary exists; "" = always
}

var targets = map[string]target{
	"dispatcher":  {pkg: "./dispatcher/cmd/dispatcher", dir: ".", src: "dispatcher/cmd/dispatcher"},
	"worker":      {pkg: "./worker/cmd/worker", dir: ".", src: "worker/cmd/worker"},
	"mlsched":     {pkg: "./dispatcher/cmd/mlsched", dir: ".", src: "dispatcher/cmd/mlsched"},
	"nats-server": {pkg: "github.com/nats-io/nats-server/v2", dir: "e2e"},
}

type build struct {
	once sync.Once
	path string
	err  error
}

var (
	buildsMu sync.Mutex
	builds   = map[string]*build{}
	binDir   string
	binOnce  sync.Once
	binErr   error
)

// Main runs the tests of a package that uses the harness and removes the
// build directory afterwards. Call it from TestMain.
func Main(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// RepoRoot returns the repository root: the nearest parent directory of the
// working directory that holds go.work.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.work in any parent directory")
		}
		dir = parent
	}
}

// Available reports whether the source of a binary exists in the checkout
// (always true for nats-server, or when EnvBin holds the binary).
func Available(name string) bool {
	if d := os.Getenv(EnvBin); d != "" {
		_, err := os.Stat(filepath.Join(d, name))
		return err == nil
	}
	tg, ok := targets[name]
	if !ok {
		return false
	}
	if tg.src == "" {
		return true
	}
	root, err := RepoRoot()
	if err != nil {
		return false
	}
	_, err = os.Stat(filepath.Join(root, tg.src))
	return err == nil
}

// Binary returns the path of a binary (dispatcher, worker, mlsched or
// nats-server), building it on first use. It fails the test if the binary
// cannot be built.
func Binary(t testing.TB, name string) string {
	t.Helper()
	p, err := binary(name)
	if err != nil {
		t.Fatalf("binary %s: %v", name, err)
	}
	return p
}

func binary(name string) (string, error) {
	if d := os.Getenv(EnvBin); d != "" {
		p, err := filepath.Abs(filepath.Join(d, name))
		if err != nil {
			return "", err
		}
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%s is set but: %w", EnvBin, err)
		}
		return p, nil
	}
	tg, ok := targets[name]
	if !ok {
		return "", fmt.Errorf("unknown binary %q", name)
	}
	buildsMu.Lock()
	b := builds[name]
	if b == nil {
		b = &build{}
		builds[name] = b
	}
	buildsMu.Unlock()
	b.once.Do(func() { b.path, b.err = goBuild(name, tg) })
	return b.path, b.err
}

func goBuild(name string, tg target) (string, error) {
	binOnce.Do(func() { binDir, binErr = os.MkdirTemp("", "mlsched-e2e-bin-*") })
	if binErr != nil {
		return "", binErr
	}
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	out := filepath.Join(binDir, name)
	cmd := exec.Command("go", "build", "-o", out, tg.pkg)
	cmd.Dir = filepath.Join(root, tg.dir)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build %s: %w\n%s", tg.pkg, err, stderr.String())
	}
	return out, nil
}

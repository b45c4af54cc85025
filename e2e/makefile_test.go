package e2e

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// make bench ends with the hot-path go benchmarks of BENCH_GO_PKGS: a
// package that moved (jspub became jsplumb) fails the whole target after
// its end-to-end half has run.
func TestMakeBenchPackagesExist(t *testing.T) {
	t.Parallel()
	mk, err := os.ReadFile(repoPath(t, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^BENCH_GO_PKGS\s*\?=\s*(.+)$`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("Makefile: no BENCH_GO_PKGS")
	}
	pkgs := strings.Fields(string(m[1]))
	if len(pkgs) == 0 {
		t.Fatal("Makefile: BENCH_GO_PKGS is empty")
	}
	for _, p := range pkgs {
		dir := repoPath(t, strings.TrimSuffix(p, "..."))
		if st, err := os.Stat(dir); err != nil || !st.IsDir() {
			t.Errorf("BENCH_GO_PKGS names %s, which is not a package directory of the repository: %v", p, err)
		}
	}
}

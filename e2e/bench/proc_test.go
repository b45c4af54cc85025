package bench

import (
	"os"
	"testing"
	"time"
)

// TestProcSelf reads our own CPU time and RSS: both must be positive, and
// CPU time must grow while we burn CPU.
func TestProcSelf(t *testing.T) {
	t.Parallel()
	pid := os.Getpid()
	rss, err := RSS(pid)
	if err != nil {
		t.Fatal(err)
	}
	if rss < 1<<20 {
		t.Errorf("RSS %d bytes, want at least 1 MiB", rss)
	}
	c0, err := CPUTime(pid)
	if err != nil {
		t.Fatal(err)
	}
	x := 0
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		for i := range 1_000_000 {
			x += i
		}
		c1, err := CPUTime(pid)
		if err != nil {
			t.Fatal(err)
		}
		if c1 > c0 {
			return
		}
		if x == -1 { // keep the loop
			t.Log(x)
		}
	}
	t.Errorf("CPU time stayed at %v after 10s of work", c0)
}

func TestProcErrors(t *testing.T) {
	t.Parallel()
	if _, err := CPUTime(1 << 30); err == nil {
		t.Error("CPUTime of a pid that does not exist did not fail")
	}
	d := cpuDelta(cpuSample{"a": time.Second}, cpuSample{"a": 3 * time.Second})
	if d["a"] != 2 {
		t.Errorf("cpuDelta = %v, want a:2", d)
	}
}

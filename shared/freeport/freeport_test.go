package freeport

import (
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

func TestTakeIsBelowTheEphemeralRangeAndBindable(t *testing.T) {
	lo, hi := window()
	seen := map[int]bool{}
	for range 50 {
		p, err := Take()
		if err != nil {
			t.Fatal(err)
		}
		if p < lo || p >= hi || reserved[p] {
			t.Fatalf("port %d outside [%d, %d) or reserved", p, lo, hi)
		}
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			t.Fatalf("port %d from Take cannot be bound: %v", p, err)
		}
		l.Close()
	}
}

// Another process never gets a port this one holds: the child process
// takes many ports while this one holds 50, and none may be shared.
func TestTakeIsExclusiveAcrossProcesses(t *testing.T) {
	if os.Getenv("FREEPORT_CHILD") == "1" {
		var out []string
		for range 300 {
			p, err := Take()
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, strconv.Itoa(p))
		}
		os.Stdout.WriteString("PORTS " + strings.Join(out, " ") + "\n")
		return
	}
	mine := map[string]bool{}
	for range 50 {
		p, err := Take()
		if err != nil {
			t.Fatal(err)
		}
		mine[strconv.Itoa(p)] = true
	}
	for p := range held {
		mine[strconv.Itoa(p)] = true
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestTakeIsExclusiveAcrossProcesses$")
	cmd.Env = append(os.Environ(), "FREEPORT_CHILD=1")
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, b)
	}
	var line string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "PORTS ") {
			line = strings.TrimPrefix(l, "PORTS ")
		}
	}
	if line == "" {
		t.Fatalf("child printed no ports:\n%s", b)
	}
	for _, p := range strings.Fields(line) {
		if mine[p] {
			t.Fatalf("the child process got port %s, which this process holds", p)
		}
	}
}

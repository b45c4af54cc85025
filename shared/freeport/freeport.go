// Package freeport hands tests TCP ports that stay theirs until the test
// process exits.
//
// The usual trick, listening on port 0 and closing, returns a port from the
// kernel's ephemeral range. A test that starts its server a minute later
// (TestReadmeCommands builds and runs the demo first) can then find that
// port taken by any outgoing connection or port-0 listener on the machine:
// CI failed on exactly that ("bind: address already in use"). Take picks
// from below the ephemeral range instead, where the kernel never assigns
// ports on its own, and holds an advisory lock file per port so that two
// test processes of the same run (go test runs packages in parallel) never
// take the same one.
package freeport

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

var (
	mu    sync.Mutex
	held  = map[int]*os.File{} // this process's ports, locked until it exits
	tries = 200
)

// reserved are ports the project's docs use; a test never takes them.
var reserved = map[int]bool{4222: true, 6222: true, 8222: true, 6379: true, 26379: true, 9090: true, 9091: true, 9092: true}

// Take returns a TCP port that was free on every interface a moment ago and
// that no other caller of Take on this machine gets while this process runs.
func Take() (int, error) {
	lo, hi := window()
	if lo >= hi {
		return ephemeral()
	}
	mu.Lock()
	defer mu.Unlock()
	dir := filepath.Join(os.TempDir(), "mlsched-freeport")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return 0, fmt.Errorf("freeport: %w", err)
	}
	for range tries {
		p := lo + rand.IntN(hi-lo)
		if reserved[p] || held[p] != nil {
			continue
		}
		f, err := lock(filepath.Join(dir, strconv.Itoa(p)))
		if err != nil {
			continue // another test process holds it
		}
		if !free(p) {
			f.Close()
			continue
		}
		held[p] = f
		return p, nil
	}
	return 0, errors.New("freeport: no free port below the ephemeral range after 200 tries")
}

// window is the range Take draws from: the 12,000 ports under the kernel's
// ephemeral range (20768-32767 with Linux's default 32768-60999).
func window() (lo, hi int) {
	hi = 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				hi = n
			}
		}
	}
	lo = max(hi-12000, 10000)
	return lo, hi
}

func lock(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// free reports whether p can be bound on all interfaces and on loopback.
func free(p int) bool {
	for _, addr := range []string{":" + strconv.Itoa(p), "127.0.0.1:" + strconv.Itoa(p)} {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return false
		}
		l.Close()
	}
	return true
}

// ephemeral is the fallback where the ephemeral range leaves no room below it.
func ephemeral() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("freeport: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

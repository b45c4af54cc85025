package bench

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat.
// It is 100 on every Linux architecture Go supports (getconf CLK_TCK).
const clockTicks = 100

// CPUTime returns the user plus system CPU time a process has used so far,
// from /proc/<pid>/stat (Linux only).
func CPUTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces:
	// count fields from the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: bad utime/stime %q %q", pid, f[11], f[12])
	}
	return time.Duration(ut+st) * time.Second / clockTicks, nil
}

// RSS returns a process's resident set size in bytes (VmRSS of
// /proc/<pid>/status).
func RSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(v) // "12345 kB"
			if len(f) != 2 || f[1] != "kB" {
				return 0, fmt.Errorf("/proc/%d/status: bad VmRSS %q", pid, v)
			}
			kb, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/%d/status: bad VmRSS %q", pid, v)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no VmRSS", pid)
}

// procGroup is a named set of processes whose CPU time is summed (the
// workers), sampled at phase boundaries.
type procGroup struct {
	Name string
	Pids []int
}

// cpuSample maps a group name to its summed CPU time.
type cpuSample map[string]time.Duration

func sampleCPU(groups []procGroup) cpuSample {
	s := cpuSample{}
	for _, g := range groups {
		var sum time.Duration
		for _, pid := range g.Pids {
			if d, err := CPUTime(pid); err == nil {
				sum += d
			}
		}
		s[g.Name] = sum
	}
	return s
}

// cpuDelta returns end-start per group in seconds.
func cpuDelta(start, end cpuSample) map[string]float64 {
	out := map[string]float64{}
	for k, e := range end {
		out[k] = (e - start[k]).Seconds()
	}
	return out
}

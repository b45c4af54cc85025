package redistest

import (
	"os/exec"
	"syscall"
)

// setSysProcAttr makes the kernel kill redis-server if the test process dies
// without running its cleanups, so no server outlives its test.
func setSysProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

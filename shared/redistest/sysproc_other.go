//go:build !linux

package redistest

import "os/exec"

func setSysProcAttr(cmd *exec.Cmd) {}

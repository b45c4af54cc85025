package main

import (
	"fmt"
	"runtime/debug"
)

// version is set at link time (-ldflags "-X main.version=v1.2.3"); without
// it the version comes from the build information Go records.
var version = ""

// versionString names the release (or module version), the commit and the
// Go toolchain the binary was built from.
func versionString() string {
	v, commit, modified, goVersion := version, "", false, ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		goVersion = bi.GoVersion
		if v == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				commit = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	if v == "" {
		v = "devel"
	}
	out := "mlsched " + v
	if commit != "" {
		if len(commit) > 12 {
			commit = commit[:12]
		}
		out += " commit " + commit
		if modified {
			out += " (modified)"
		}
	}
	if goVersion != "" {
		out += fmt.Sprintf(" %s", goVersion)
	}
	return out + " protocol v1"
}

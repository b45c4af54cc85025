package config_test

import (
	"os"
	"runtime/debug"
	"testing"

	"github.com/mlsched/mlsched/shared/config"
)

func TestApplyGCDefault(t *testing.T) {
	prev := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(prev) })

	t.Setenv("GOGC", "150") // the operator's choice wins (the runtime read it at start)
	config.ApplyGCDefault()
	if got := debug.SetGCPercent(100); got != 100 {
		t.Fatalf("with GOGC set the target became %d, want it left alone", got)
	}

	t.Setenv("GOGC", "") // restored by t at the end
	if err := os.Unsetenv("GOGC"); err != nil {
		t.Fatal(err)
	}
	config.ApplyGCDefault()
	if got := debug.SetGCPercent(100); got != config.GCPercent {
		t.Fatalf("without GOGC the target is %d, want %d", got, config.GCPercent)
	}
}

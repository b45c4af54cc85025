package config_test

import (
	"testing"

	"github.com/mlsched/mlsched/shared/config"
)

// A Log built in code (the zero value) works and logs at info; a bad level
// is refused with the variable's name.
func TestLogZeroValueAndBadLevel(t *testing.T) {
	l, err := config.Log{}.Logger("test")
	if err != nil {
		t.Fatalf("zero Log: %v", err)
	}
	if got := l.GetLevel().String(); got != "info" {
		t.Errorf("zero Log level %s, want info", got)
	}
	if _, err := (config.Log{Level: "loud"}).Logger("test"); err == nil {
		t.Error("level loud accepted")
	}
}

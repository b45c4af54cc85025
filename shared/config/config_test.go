package config_test

import (
	"testing"
	"time"

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

func TestFillZero(t *testing.T) {
	type inner struct {
		Level string `envconfig:"LEVEL" default:"info"`
	}
	type spec struct {
		Wait   time.Duration `envconfig:"WAIT" default:"5s"`
		N      int           `envconfig:"N" default:"3"`
		Addr   string        `envconfig:"ADDR" default:":9090" zero:"keep"`
		Name   string        `envconfig:"NAME"`
		Inner  inner
		Shared inner `envconfig:"SHARED"`
	}
	c := spec{N: 7}
	if err := config.FillZero(&c); err != nil {
		t.Fatal(err)
	}
	want := spec{Wait: 5 * time.Second, N: 7, Inner: inner{Level: "info"}, Shared: inner{Level: "info"}}
	if c != want {
		t.Fatalf("got %+v, want %+v", c, want)
	}
}

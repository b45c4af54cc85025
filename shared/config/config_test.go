package config_test

import (
	"strings"
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

// An unreadable value is reported under the variable's own name, once
// prefixed (issue 22: it said MLSCHED_MLSCHED_CONCURRENCY).
func TestLoadNamesTheVariable(t *testing.T) {
	var spec struct {
		Concurrency int           `envconfig:"CONCURRENCY" default:"8"`
		AckWait     time.Duration `envconfig:"ACK_WAIT" default:"30s"`
	}
	for name, value := range map[string]string{"MLSCHED_CONCURRENCY": "abc", "MLSCHED_ACK_WAIT": "soon"} {
		t.Run(name, func(t *testing.T) {
			t.Setenv(name, value)
			err := config.Load(&spec)
			want := "invalid " + name + `="` + value + `"`
			if err == nil || !strings.HasPrefix(err.Error(), want) {
				t.Fatalf("error %v, want one starting %s", err, want)
			}
		})
	}
}

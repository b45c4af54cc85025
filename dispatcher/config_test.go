package dispatcher_test

import (
	"strings"
	"testing"
	"time"

	"github.com/mlsched/mlsched/dispatcher"
	"github.com/mlsched/mlsched/dispatcher/internal/policy"
)

// An invalid value stops start-up with a message naming the variable.
func TestInvalidConfigurationNamesTheVariable(t *testing.T) {
	cases := map[string]string{
		"MLSCHED_STATS_WINDOW":       "banana",
		"MLSCHED_MAX_ATTEMPTS":       "0",
		"MLSCHED_POLICY":             "fastest",
		"MLSCHED_STORAGE":            "tape",
		"MLSCHED_STATS_BUCKET":       "10m",
		"MLSCHED_EXPLORE_SHARE":      "2",
		"MLSCHED_STREAM_REPLICAS":    "0",
		"MLSCHED_LOG_FORMAT":         "xml",
		"MLSCHED_MAX_IN_FLIGHT":      "abc",
		"MLSCHED_ACK_WAIT":           "-1s",
		"MLSCHED_NO_NODE_WAIT":       "-1s",
		"MLSCHED_SWEEP_INTERVAL":     "0s",
		"MLSCHED_TENANT_CONCURRENCY": "a:0",
		"MLSCHED_QUEUE_TARGET":       "-1s",
		"MLSCHED_TENANT_BUDGETS":     "a:100/week",
		"MLSCHED_TYPE_BUDGETS":       "x:-1/hour",
	}
	for name, value := range cases {
		t.Run(name, func(t *testing.T) {
			t.Setenv(name, value)
			cfg, err := dispatcher.LoadConfig()
			if err == nil && name == "MLSCHED_LOG_FORMAT" {
				_, err = cfg.Log.Logger("dispatcher")
			}
			// Named as the variable is spelt (not MLSCHED_MLSCHED_...).
			if err == nil || !strings.Contains(err.Error(), name) || strings.Contains(err.Error(), "MLSCHED_MLSCHED") {
				t.Fatalf("%s=%s: error %v, want one naming %s", name, value, err, name)
			}
		})
	}
	t.Run("defaults are valid", func(t *testing.T) {
		cfg, err := dispatcher.LoadConfig()
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Policy != "reliability" || cfg.MaxAttempts != 3 || cfg.SnapshotInterval.String() != "250ms" || cfg.Name == "" {
			t.Fatalf("defaults = %+v", cfg)
		}
	})
}

// A Config built in code works: its zero fields take the defaults an empty
// environment gives (the listener stays off), while a zero set on purpose
// on DefaultConfig or from the environment is kept.
func TestZeroValueConfigGetsTheDefaults(t *testing.T) {
	d, err := dispatcher.New(dispatcher.Config{MaxAttempts: 5})
	if err != nil {
		t.Fatalf("New(Config{}): %v", err)
	}
	got, def := d.Config(), dispatcher.DefaultConfig()
	if got.MaxAttempts != 5 || got.TaskTimeout != def.TaskTimeout || got.RetryBackoff != def.RetryBackoff ||
		got.ExploreShare != def.ExploreShare || got.NATS.URL != def.NATS.URL || got.Name == "" || got.HTTPAddr != "" {
		t.Fatalf("New(Config{MaxAttempts: 5}).Config() = %+v", got)
	}
	on := dispatcher.DefaultConfig()
	on.RetryBackoff, on.ExploreShare = 0, 0 // meant
	if d, err = dispatcher.New(on); err != nil || d.Config().RetryBackoff != 0 || d.Config().ExploreShare != 0 {
		t.Fatalf("zeros set on DefaultConfig: %v %+v", err, d.Config())
	}
	t.Setenv("MLSCHED_RETRY_BACKOFF", "0s")
	env, err := dispatcher.LoadConfig()
	if err != nil {
		t.Fatal(err)
	}
	if d, err = dispatcher.New(env); err != nil || d.Config().RetryBackoff != 0 {
		t.Fatalf("MLSCHED_RETRY_BACKOFF=0s: %v, backoff %v", err, d.Config().RetryBackoff)
	}
}

// The settings every process must set alike come from one shared struct,
// read from the same variables.
func TestSharedSettingsAreRead(t *testing.T) {
	t.Setenv("MLSCHED_NODE_TTL", "7s")
	t.Setenv("MLSCHED_STORAGE", "memory")
	t.Setenv("MLSCHED_STREAM_REPLICAS", "3")
	cfg, err := dispatcher.LoadConfig()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.NodeTTL.String() != "7s" || cfg.Storage != "memory" || cfg.StreamReplicas != 3 ||
		cfg.Topology().Replicas != 3 || cfg.Topology().NodeTTL.String() != "7s" {
		t.Fatalf("shared settings %+v, topology %+v", cfg.Shared, cfg.Topology())
	}
}

// MLSCHED_QUEUE_TARGET: auto by default (each pair's own), a positive
// duration for every pair, off (or 0, as it always meant) for the
// deadline alone; the engine gets it as 0, the duration, or negative.
func TestQueueTargetSetting(t *testing.T) {
	for value, want := range map[string]string{"": "auto", "auto": "auto", "150ms": "150ms", "off": "off", "0": "off", "0s": "off"} {
		t.Run(value, func(t *testing.T) {
			if value != "" {
				t.Setenv("MLSCHED_QUEUE_TARGET", value)
			}
			cfg, err := dispatcher.LoadConfig()
			if err != nil {
				t.Fatal(err)
			}
			if got := cfg.QueueTarget.String(); got != want {
				t.Fatalf("%q: %s, want %s", value, got, want)
			}
			pc := cfg.PolicyConfig().QueueTarget
			if ok := (want == "auto" && pc == 0) || (want == "off" && pc < 0) || (want == "150ms" && pc == 150*time.Millisecond); !ok {
				t.Fatalf("%q: engine queue target %v", value, pc)
			}
		})
	}
	t.Setenv("MLSCHED_QUEUE_TARGET", "soon")
	if _, err := dispatcher.LoadConfig(); err == nil || !strings.Contains(err.Error(), "MLSCHED_QUEUE_TARGET") {
		t.Fatalf("soon: %v, want an error naming MLSCHED_QUEUE_TARGET", err)
	}
}

// The cost policy's settings refuse bad values naming the variable.
func TestCostPolicyConfigurationErrors(t *testing.T) {
	for name, value := range map[string]string{
		"MLSCHED_MIN_SUCCESS":         "1.5",
		"MLSCHED_MIN_SUCCESS_BY_TYPE": "chat:0",
		"MLSCHED_POLICY_BY_TYPE":      "chat:cheapest",
	} {
		t.Run(name, func(t *testing.T) {
			t.Setenv(name, value)
			if _, err := dispatcher.LoadConfig(); err == nil || !strings.Contains(err.Error(), name) {
				t.Fatalf("%s=%s: error %v, want one naming %s", name, value, err, name)
			}
		})
	}
}

// The cost policy's bars reach the engine: the default for every type,
// overridden per type.
func TestCostPolicyConfiguration(t *testing.T) {
	t.Setenv("MLSCHED_POLICY_BY_TYPE", "chat:cost")
	t.Setenv("MLSCHED_MIN_SUCCESS", "0.98")
	t.Setenv("MLSCHED_MIN_SUCCESS_BY_TYPE", "chat:0.995")
	cfg, err := dispatcher.LoadConfig()
	if err != nil {
		t.Fatal(err)
	}
	e, err := policy.NewEngine(cfg.PolicyConfig())
	if err != nil {
		t.Fatal(err)
	}
	if e.PolicyFor("chat") != policy.Cost || e.MinSuccessFor("chat") != 0.995 || e.MinSuccessFor("tag") != 0.98 {
		t.Fatalf("chat: %s at %g, tag at %g; want cost at 0.995, 0.98", e.PolicyFor("chat"), e.MinSuccessFor("chat"), e.MinSuccessFor("tag"))
	}
}

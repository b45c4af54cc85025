package dispatcher_test

import (
	"strings"
	"testing"

	"github.com/mlsched/mlsched/dispatcher"
)

// An invalid value stops start-up with a message naming the variable.
func TestInvalidConfigurationNamesTheVariable(t *testing.T) {
	cases := map[string]string{
		"MLSCHED_STATS_WINDOW":    "banana",
		"MLSCHED_MAX_ATTEMPTS":    "0",
		"MLSCHED_POLICY":          "fastest",
		"MLSCHED_STORAGE":         "tape",
		"MLSCHED_STATS_BUCKET":    "10m",
		"MLSCHED_EXPLORE_SHARE":   "2",
		"MLSCHED_STREAM_REPLICAS": "0",
		"MLSCHED_LOG_FORMAT":      "xml",
	}
	for name, value := range cases {
		t.Run(name, func(t *testing.T) {
			t.Setenv(name, value)
			cfg, err := dispatcher.LoadConfig()
			if err == nil && name == "MLSCHED_LOG_FORMAT" {
				_, err = cfg.Log.Logger("dispatcher")
			}
			if err == nil || !strings.Contains(err.Error(), name) {
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

package worker

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/mlsched/mlsched/shared/config"
	"github.com/mlsched/mlsched/shared/natsconn"
	"github.com/mlsched/mlsched/shared/opshttp"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// Config configures a worker node. Load it with config.Load (MLSCHED_*
// variables); zero fields of a Config built in code get the same defaults.
type Config struct {
	// NATS is how to reach NATS: servers, credentials, TLS (MLSCHED_NATS_*;
	// default nats://127.0.0.1:4222, no credentials, inbox prefix
	// _INBOX.node.<node id>). Unused with WithConn.
	NATS natsconn.Config
	// NodeID names the node (default: the host name, with characters that
	// are not allowed in a subject token replaced by '-').
	NodeID string `envconfig:"NODE_ID" desc:"node id (default: host name)"`
	// ModelsFile is the models YAML (default models.yaml). Unused with
	// WithModels.
	ModelsFile string `envconfig:"MODELS_FILE" default:"models.yaml" desc:"models YAML file"`
	// Concurrency is how many tasks run at once (default 8); it is also the
	// announced capacity.
	Concurrency int `envconfig:"CONCURRENCY" default:"8" desc:"tasks run at once"`
	// Prefetch is how many dispatches the node takes beyond its running
	// tasks, to start them in priority and tenant order instead of arrival
	// order (default 32). The consumer's MaxAckPending is Concurrency +
	// Prefetch. A code-built Config's 0 takes the default; set the
	// variable to 0 for arrival order.
	Prefetch int `envconfig:"PREFETCH" default:"32" desc:"dispatches taken beyond the running tasks, started in priority and tenant order (0: arrival order)"`
	// AckWait is the dispatch consumer's ack wait (default 30s); running
	// tasks signal progress every AckWait/3.
	AckWait time.Duration `envconfig:"ACK_WAIT" default:"30s" desc:"dispatch ack wait"`
	// HeartbeatInterval is how often the node announces itself (default 1s).
	HeartbeatInterval time.Duration `envconfig:"HEARTBEAT_INTERVAL" default:"1s" desc:"heartbeat interval"`
	// ReadyInterval is how often models that can be unready (http servers,
	// exec processes) are checked (default 1s); the node announces a model
	// only while it is ready.
	ReadyInterval time.Duration `envconfig:"READY_INTERVAL" default:"1s" desc:"how often model readiness is checked"`
	// ShutdownGrace bounds how long in-flight tasks may finish on shutdown
	// (default 20s); the rest are nak'ed for redelivery.
	ShutdownGrace time.Duration `envconfig:"SHUTDOWN_GRACE" default:"20s" desc:"time in-flight tasks get on shutdown"`
	// DefaultTimeout is a task's run timeout when neither the dispatch nor
	// the model sets one (default 30s).
	DefaultTimeout time.Duration `envconfig:"DEFAULT_TIMEOUT" default:"30s" desc:"run timeout of a dispatch that carries none, for a model without its own"`
	// PublishTimeout bounds one outcome publish (default 5s).
	PublishTimeout time.Duration `envconfig:"PUBLISH_TIMEOUT" default:"5s" desc:"outcome publish timeout"`
	// StoredOutcomesOnly stores every outcome in MLSCHED_OUTCOMES (default
	// false: a successful outcome is first reported straight to a
	// dispatcher, which saves a stored message per task; see
	// docs/protocol.md, "Direct reports"). For a NATS account whose
	// permissions predate direct reports.
	StoredOutcomesOnly bool `envconfig:"STORED_OUTCOMES_ONLY" default:"false" desc:"store every outcome in MLSCHED_OUTCOMES instead of reporting successes straight to a dispatcher"`
	// SimSeed seeds sim models (default 0: random).
	SimSeed int64 `envconfig:"SIM_SEED" desc:"seed of sim models (0: random)"`
	// Shared: NodeTTL (the node bucket's entry TTL), Storage and
	// StreamReplicas, which every process must set alike (MLSCHED_NODE_TTL,
	// MLSCHED_STORAGE, MLSCHED_STREAM_REPLICAS).
	topology.Shared
	// PprofAddr, when set, serves net/http/pprof there, for profiling the
	// worker's hot path (default empty: off). Set by cmd/worker only.
	PprofAddr string `envconfig:"PPROF_ADDR" desc:"listen address for net/http/pprof, e.g. 127.0.0.1:6061 (empty: off)"`
	// HTTPAddr is the listen address of /metrics, /healthz and /readyz;
	// "off" or empty disables it. The variable defaults to :9091; a Config
	// built in code has none unless set.
	HTTPAddr string `envconfig:"HTTP_ADDR" default:":9091" zero:"keep" desc:"listen address of /metrics, /healthz and /readyz (off: none)"`
	// OTelEndpoint is the OTLP/HTTP collector spans go to, e.g.
	// http://otel-collector:4318 (default empty: tracing off; the task's
	// traceparent is still sent on to HTTP model servers).
	OTelEndpoint string `envconfig:"OTEL_ENDPOINT" desc:"OTLP/HTTP collector URL for spans, e.g. http://collector:4318 (empty: tracing off)"`
	// Log is the logging configuration (MLSCHED_LOG_FORMAT, MLSCHED_LOG_LEVEL).
	config.Log

	// loaded: read by LoadConfig, so a zero is the environment's (e.g.
	// MLSCHED_PREFETCH=0) and New leaves it; New gives the zero fields of a
	// Config built in code their defaults.
	loaded bool
}

// LoadConfig reads the MLSCHED_* variables: unset ones take their
// defaults, and a variable set to 0 means 0.
func LoadConfig() (Config, error) {
	c := Config{loaded: true}
	err := config.Load(&c)
	return c, err
}

func (c Config) validate() error {
	if err := c.NATS.Validate(); err != nil {
		return err
	}
	if err := protocol.ValidToken(c.NodeID, 64); err != nil {
		return fmt.Errorf("invalid %s_NODE_ID=%q: %v", config.Prefix, c.NodeID, err)
	}
	if err := c.Shared.Validate(config.Prefix); err != nil {
		return err
	}
	if err := opshttp.ValidateAddr(c.HTTPAddr); err != nil {
		return err
	}
	bad := func(name string, v any, why string) error {
		return fmt.Errorf("invalid %s_%s=%v: %s", config.Prefix, name, v, why)
	}
	switch {
	case c.Concurrency < 1:
		return bad("CONCURRENCY", c.Concurrency, "must be at least 1")
	case c.Prefetch < 0:
		return bad("PREFETCH", c.Prefetch, "must not be negative")
	case c.AckWait <= 0:
		return bad("ACK_WAIT", c.AckWait, "must be positive")
	case c.HeartbeatInterval <= 0:
		return bad("HEARTBEAT_INTERVAL", c.HeartbeatInterval, "must be positive")
	case c.ReadyInterval <= 0:
		return bad("READY_INTERVAL", c.ReadyInterval, "must be positive")
	case c.ShutdownGrace < 0:
		return bad("SHUTDOWN_GRACE", c.ShutdownGrace, "must not be negative")
	case c.DefaultTimeout <= 0:
		return bad("DEFAULT_TIMEOUT", c.DefaultTimeout, "must be positive")
	case c.PublishTimeout <= 0:
		return bad("PUBLISH_TIMEOUT", c.PublishTimeout, "must be positive")
	}
	if c.HeartbeatInterval >= c.NodeTTL {
		return fmt.Errorf("invalid %s_HEARTBEAT_INTERVAL=%v: must be shorter than %s_NODE_TTL=%v",
			config.Prefix, c.HeartbeatInterval, config.Prefix, c.NodeTTL)
	}
	return nil
}

// hostNodeID derives a node id from the host name.
func hostNodeID() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "node"
	}
	b := []byte(h)
	for i, c := range b {
		if c <= ' ' || c >= 0x7f || strings.IndexByte(".*>", c) >= 0 {
			b[i] = '-'
		}
	}
	if len(b) > 64 {
		b = b[:64]
	}
	return string(b)
}

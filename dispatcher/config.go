package dispatcher

import (
	"fmt"
	"strings"
	"time"

	"github.com/mlsched/mlsched/dispatcher/internal/admission"
	"github.com/mlsched/mlsched/dispatcher/internal/policy"
	"github.com/mlsched/mlsched/dispatcher/internal/settle"
	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/shared/config"
	"github.com/mlsched/mlsched/shared/natsconn"
	"github.com/mlsched/mlsched/shared/opshttp"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/secret"
	"github.com/mlsched/mlsched/shared/topology"
)

// Config is the dispatcher's configuration, read from MLSCHED_* variables.
// Every field documents its default, stated once in its tag; README.md lists
// them all. A Config built in code (the zero value, or a few fields set)
// gets every default for its zero fields from New; to set a field to zero on
// purpose where its default is not, start from DefaultConfig (or
// LoadConfig), whose zeros are kept.
type Config struct {
	// defaulted: the defaults are applied (LoadConfig, DefaultConfig), so a
	// zero field is meant.
	defaulted bool

	// NATS is how to reach NATS: servers, credentials, TLS (MLSCHED_NATS_*;
	// default nats://127.0.0.1:4222, no credentials).
	NATS natsconn.Config
	// RedisURL of the statistics store: one server, Sentinel or Cluster
	// (forms in package redisconn); empty keeps statistics in memory, which
	// is only right for a single dispatcher (default empty).
	RedisURL string `envconfig:"REDIS_URL" desc:"Redis for shared statistics: redis[s]://host:port/db, redis[s]+sentinel://h:p,h:p/master[/db], redis[s]+cluster://h:p,h:p; empty = in-memory"`
	// RedisPasswordFile holds the Redis password (of the URL's ACL user,
	// or the default user), so that it is in neither the URL nor the
	// environment (default empty).
	RedisPasswordFile string `envconfig:"REDIS_PASSWORD_FILE" desc:"file holding the Redis password (of the URL's ACL user)"`
	// RedisCA verifies a rediss:// server (default: the system pool);
	// RedisCert and RedisKey are the client certificate for mutual TLS
	// (default empty).
	RedisCA   string `envconfig:"REDIS_CA" desc:"PEM CA file for rediss:// (default: system pool)"`
	RedisCert string `envconfig:"REDIS_CERT" desc:"PEM client certificate for rediss:// (mutual TLS), with MLSCHED_REDIS_KEY"`
	RedisKey  string `envconfig:"REDIS_KEY" desc:"PEM client key for rediss://"`
	// Name identifies this replica in logs and stats reports (default: hostname).
	Name string `envconfig:"DISPATCHER_NAME" desc:"replica name (default hostname)"`

	// Policy is the default policy (default reliability).
	Policy string `envconfig:"POLICY" default:"reliability" desc:"default policy: reliability, thompson, latency, least-loaded, round-robin, random, cost"`
	// PolicyByType overrides the policy per task type: "type:policy,...".
	PolicyByType map[string]string `envconfig:"POLICY_BY_TYPE" desc:"per-type policies, e.g. fraud:thompson,ocr:latency"`
	// MinSuccess is the cost policy's success bar (default 0.99), and
	// MinSuccessByType overrides it per task type; a task's own
	// min_success_rate overrides both (docs/policies.md).
	MinSuccess       float64            `envconfig:"MIN_SUCCESS" default:"0.99" desc:"cost policy: the success a model must clear to be bought, in (0, 1)"`
	MinSuccessByType map[string]float64 `envconfig:"MIN_SUCCESS_BY_TYPE" desc:"cost policy: per-type success bars, e.g. chat:0.995,tag:0.97"`
	// MinSamples below which a model is explored (default 20).
	MinSamples int `envconfig:"MIN_SAMPLES" default:"20" desc:"judged outcomes below which a model is explored, not excluded"`
	// ExploreShare of decisions spent on under-sampled models (default 0.05).
	ExploreShare float64 `envconfig:"EXPLORE_SHARE" default:"0.05" desc:"share of decisions spent exploring under-sampled models"`

	// LatencyWeight makes thompson prefer faster models among similar ones
	// (default 0: success only).
	LatencyWeight float64 `envconfig:"LATENCY_WEIGHT" default:"0" desc:"thompson: weight of latency against success (0: success only)"`
	// BreakerProbes: tasks a half-open breaker lets through (default 3).
	BreakerProbes int `envconfig:"BREAKER_PROBES" default:"3" desc:"tasks a half-open breaker lets through per cooldown"`
	// BreakerFailures: consecutive failures that open a breaker (default 5).
	BreakerFailures int `envconfig:"BREAKER_FAILURES" default:"5" desc:"consecutive failures that open a breaker"`
	// BreakerFailureRate opens a breaker above it (default 0.5).
	BreakerFailureRate float64 `envconfig:"BREAKER_FAILURE_RATE" default:"0.5" desc:"failure rate in the window that opens a breaker"`
	// BreakerMinRequests before the rate rule applies (default 20).
	BreakerMinRequests int `envconfig:"BREAKER_MIN_REQUESTS" default:"20" desc:"outcomes needed before the failure-rate rule applies"`
	// BreakerCooldown before half-open (default 10s).
	BreakerCooldown time.Duration `envconfig:"BREAKER_COOLDOWN" default:"10s" desc:"time an open breaker waits before going half-open"`

	// StatsWindow is the rolling window (default 5m).
	StatsWindow time.Duration `envconfig:"STATS_WINDOW" default:"5m" desc:"rolling statistics window"`
	// StatsBucket is the window's granularity (default 10s).
	StatsBucket time.Duration `envconfig:"STATS_BUCKET" default:"10s" desc:"granularity of the window"`
	// StatsRecent is the recent span compared with the rest of the window to
	// notice a model that changed (default 0: two buckets).
	StatsRecent time.Duration `envconfig:"STATS_RECENT" default:"0s" desc:"recent span used to detect a changed model (0: two buckets)"`
	// StatsReseed re-seeds a Redis store found reset (restarted empty, or a
	// failover to a replica that missed writes) from this replica's last
	// snapshot, so the cluster keeps what it learned (default true).
	StatsReseed bool `envconfig:"STATS_RESEED" default:"true" desc:"re-seed a reset Redis store (restart, failover) from the last snapshot; false: learn again from nothing"`
	// StatsForgetAfter is how long a model, or a model on a node, may go
	// without a dispatch or an outcome before Redis forgets its gauges and
	// breaker, so that the names of models and nodes that are gone do not
	// stay for ever (default 24h; 0 keeps them). Keep it longer than the
	// longest task timeout.
	StatsForgetAfter time.Duration `envconfig:"STATS_FORGET_AFTER" default:"24h" desc:"Redis forgets the gauges and breaker of a model or node idle this long (0: never); keep it above the longest task timeout"`
	// SnapshotInterval between statistics refreshes (default 250ms).
	SnapshotInterval time.Duration `envconfig:"SNAPSHOT_INTERVAL" default:"250ms" desc:"how often statistics and the decision table are refreshed"`
	// StatsBuffer bounds statistics updates buffered while Redis is down;
	// beyond it the oldest are dropped (default 100000).
	StatsBuffer int `envconfig:"STATS_BUFFER" default:"100000" desc:"statistics updates buffered while Redis is down (oldest dropped beyond)"`

	// TaskTimeout is the per-attempt timeout when neither the task nor the
	// model sets one (default 30s).
	TaskTimeout time.Duration `envconfig:"TASK_TIMEOUT" default:"30s" desc:"per-attempt timeout when neither task nor model sets one"`
	// DeadlineSlack is added to the timeout to form the dispatch deadline,
	// covering queueing on the node (default 10s).
	DeadlineSlack time.Duration `envconfig:"DEADLINE_SLACK" default:"10s" desc:"added to the timeout to form the dispatch deadline (queueing on the node)"`
	// MaxAttempts when the task sets none (default 3).
	MaxAttempts int `envconfig:"MAX_ATTEMPTS" default:"3" desc:"attempts per task when the task sets none"`
	// RetryBackoff is the first retry's delay, doubled per attempt up to
	// RetryBackoffMax (defaults 100ms, 5s).
	RetryBackoff    time.Duration `envconfig:"RETRY_BACKOFF" default:"100ms" desc:"delay before the first retry, doubled per attempt"`
	RetryBackoffMax time.Duration `envconfig:"RETRY_BACKOFF_MAX" default:"5s" desc:"cap of the retry delay"`
	// NoNodeWait is how long a task whose type no live node serves waits
	// for one before it is rejected (default 30s), counted from when its
	// attempt first found none: a retry after a lost attempt gets it whole.
	NoNodeWait time.Duration `envconfig:"NO_NODE_WAIT" default:"30s" desc:"how long a task no live node serves waits for one, from when its attempt first found none, before it is rejected"`
	// UnservedMax bounds the tasks no live node serves that a replica keeps
	// waiting (up to NoNodeWait) at once: each holds one of the consumer's
	// MaxAckPending slots, which all types share. Beyond it, the type
	// keeping the most gives way and a task is rejected at once with code
	// no_model. It is capped at MaxInFlight, half the consumers'
	// MaxAckPending (default 256; 0 rejects such tasks without waiting, but
	// only a Config from DefaultConfig or the environment keeps a zero).
	UnservedMax int `envconfig:"UNSERVED_MAX" default:"256" desc:"tasks no live node serves that a replica keeps waiting at once, capped at MLSCHED_MAX_IN_FLIGHT (beyond: the type keeping most gives way, rejected at once with no_model)"`
	// SweepInterval between scans for lost attempts (default 1s).
	SweepInterval time.Duration `envconfig:"SWEEP_INTERVAL" default:"1s" desc:"how often the stored dispatches are scanned for lost attempts"`

	// TypeDeadlines is the default deadline_ms per task type, for tasks
	// that set none: "type:duration,..." (docs/policies.md, "Flow control").
	TypeDeadlines map[string]string `envconfig:"TYPE_DEADLINES" desc:"per-type default task deadline (deadline_ms, queueing included) of tasks that set none, e.g. fraud:200ms,report:1h; none: no deadline"`
	// TenantWeights are the tenants' shares inside a priority band.
	TenantWeights map[string]string `envconfig:"TENANT_WEIGHTS" desc:"tenants' weights inside a priority band of held tasks, e.g. a:3,b:1 (default 1 each)"`
	// TenantRates are the tenants' rate quotas, shared by every replica
	// through Redis (dispatcher/internal/quota).
	TenantRates map[string]string `envconfig:"TENANT_RATES" desc:"tenants' rate quotas in tasks/s, shared by every replica through Redis, e.g. a:200,b:50 (a tenant absent: none); over it a task is held until its deadline"`
	// TenantConcurrency caps the tenants' tasks in flight, shared by every
	// replica through Redis (dispatcher/internal/quota).
	TenantConcurrency map[string]string `envconfig:"TENANT_CONCURRENCY" desc:"tenants' concurrency caps, tasks in flight (dispatched, not yet finished), shared by every replica through Redis, e.g. a:64,b:8 (a tenant absent: none); over it a task is held until its deadline"`
	// QueueTarget bounds what a node queues; the rest waits in the hold,
	// in priority and fair order (policy.Config.QueueTarget).
	QueueTarget QueueTarget `envconfig:"QUEUE_TARGET" default:"auto" desc:"flow control: a (model, node) counts as saturated once a task would wait plus run longer than this there, so the rest waits in the dispatcher's hold, in priority and tenant order; auto: 3x the model's mean latency on that node over the statistics window (at least 20ms; while the node has fewer than 20 attempts of the model, at least a tenth of the timeout, at most 1s); a duration: that for every pair; off (or 0): only the attempt's deadline"`
	// ParkAbove is how many tasks of one tenant a replica holds in a band
	// before it parks the tenant's next ones (internal/intake/park.go).
	ParkAbove int `envconfig:"PARK_ABOVE" default:"256" desc:"flow control: once a replica holds this many tasks of one tenant in a priority band while other tenants send to it, the tenant's next tasks are parked on a subject of their own and come back as its held ones leave, so one tenant's backlog never stands before another's in the stream (at most half MLSCHED_MAX_IN_FLIGHT; 0: off)"`
	// TenantBudgets and TypeBudgets are cost budgets per period, shared by
	// every replica through Redis (dispatcher/internal/budget).
	TenantBudgets map[string]string `envconfig:"TENANT_BUDGETS" desc:"tenants' cost budgets, LIMIT/PERIOD[/refuse|degrade] each (PERIOD: minute, hour, day or a duration; UTC calendar periods), shared by every replica through Redis, e.g. a:100/hour,b:5000/day/degrade; charged per attempt with the model's declared cost; at the limit a task is refused with budget_exceeded and retry_after_ms (refuse, the default) or sent to the cheapest model that clears its type's success bar (degrade)"`
	TypeBudgets   map[string]string `envconfig:"TYPE_BUDGETS" desc:"task types' cost budgets, as MLSCHED_TENANT_BUDGETS, e.g. classify:2000/day"`
	// QuotaReject rejects an over-quota task at once instead of holding it.
	QuotaReject bool `envconfig:"QUOTA_REJECT" default:"false" desc:"reject a task over its tenant's rate quota or concurrency cap at once with quota_exceeded and retry_after_ms, instead of holding it until its deadline"`

	// MaxPayloadBytes bounds a task message (default 1048576).
	MaxPayloadBytes int `envconfig:"MAX_PAYLOAD_BYTES" default:"1048576" desc:"largest task message accepted"`
	// MaxInFlight bounds tasks being dispatched but not yet acknowledged by
	// JetStream, and the consumers' MaxAckPending (default 1024).
	MaxInFlight int `envconfig:"MAX_IN_FLIGHT" default:"1024" desc:"publishes awaiting acknowledgement; consumers pull at most this many"`
	// GroupCommit stores the results, and the parked tasks, published
	// while their stream is busy as one atomic batch, one fsync for many
	// (jsplumb.GroupCommit), when that stream is on disk and takes atomic
	// batches (default true).
	// It pays where nats-server fsyncs every write (sync_interval always,
	// the production setting); with a lazy sync_interval turn it off: a
	// batch, staged and synced on its own, then costs more than it saves.
	GroupCommit bool `envconfig:"GROUP_COMMIT" default:"true" desc:"store results (and parked tasks) published while their stream is busy as one atomic batch, one fsync for many (file storage, nats-server 2.12+); false when nats-server's sync_interval is not always"`
	// AckWait of the dispatcher's consumers (default 30s).
	AckWait time.Duration `envconfig:"ACK_WAIT" default:"30s" desc:"ack wait of the dispatcher consumers"`
	// TasksMaxBytes bounds the task stream: beyond it producers get a
	// publish error (default 134217728, 128 MiB); TasksMaxMsgSize bounds
	// one task message (default 4194304, 4 MiB). Applied to an existing
	// stream at start.
	TasksMaxBytes   int64 `envconfig:"TASKS_MAX_BYTES" default:"134217728" desc:"bytes the task stream may hold; beyond, producers get a publish error (applied to an existing stream at start)"`
	TasksMaxMsgSize int32 `envconfig:"TASKS_MAX_MSG_SIZE" default:"4194304" desc:"largest message the task stream accepts (applied to an existing stream at start)"`
	// ResultsMaxAge, ResultsMaxMsgs and ResultsMaxBytes bound the results
	// stream: a result is kept until the first of them discards it (the
	// results window, docs/operations.md). The count bounds nats-server's
	// memory (an index entry per task); applied to an existing stream at
	// start.
	ResultsMaxAge   time.Duration `envconfig:"RESULTS_MAX_AGE" default:"24h" desc:"how long results are kept at most (applied to an existing stream at start)"`
	ResultsMaxMsgs  int64         `envconfig:"RESULTS_MAX_MSGS" default:"1000000" desc:"results kept at most, oldest discarded first; bounds nats-server memory (applied to an existing stream at start)"`
	ResultsMaxBytes int64         `envconfig:"RESULTS_MAX_BYTES" default:"1073741824" desc:"bytes the results stream may hold, oldest discarded first (applied to an existing stream at start)"`
	// DLQMaxBytes bounds the dead-letter stream (oldest discarded first).
	DLQMaxBytes int64 `envconfig:"DLQ_MAX_BYTES" default:"268435456" desc:"bytes the dead-letter stream may hold, oldest discarded first (applied to an existing stream at start)"`
	// Shared: NodeTTL, Storage and StreamReplicas, which every process must
	// set alike (MLSCHED_NODE_TTL, MLSCHED_STORAGE, MLSCHED_STREAM_REPLICAS).
	topology.Shared
	// PprofAddr, when set, serves net/http/pprof there (default empty: off).
	PprofAddr string `envconfig:"PPROF_ADDR" desc:"listen address for net/http/pprof, e.g. 127.0.0.1:6060 (empty: off)"`

	// HTTPAddr is the listen address of /metrics, /healthz, /readyz and the
	// dashboard; "off" disables the listener (default :9090; a Config built
	// in code keeps it empty, off, unless set).
	HTTPAddr string `envconfig:"HTTP_ADDR" default:":9090" zero:"keep" desc:"listen address of /metrics, /healthz, /readyz and the dashboard (off: none)"`
	// HTTPTokenFile holds the token the dashboard's actions (replay a dead
	// letter, cancel a task) require as "Authorization: Bearer <token>";
	// re-read at each action, so it rotates without a restart (default
	// empty: the actions are refused; the read-only views stay open).
	HTTPTokenFile string `envconfig:"HTTP_TOKEN_FILE" desc:"file holding the token the dashboard's actions (replay a dead letter, cancel a task) require; empty: actions refused, views open"`
	// OTelEndpoint is the OTLP/HTTP collector spans go to, e.g.
	// http://otel-collector:4318 (default empty: tracing off; the task's
	// traceparent is still carried through).
	OTelEndpoint string `envconfig:"OTEL_ENDPOINT" desc:"OTLP/HTTP collector URL for spans, e.g. http://collector:4318 (empty: tracing off)"`
	// DashboardRefresh is how often the dashboard at / gathers every
	// replica's view (default 2s); 0 turns the dashboard off.
	DashboardRefresh time.Duration `envconfig:"DASHBOARD_REFRESH" default:"2s" desc:"how often the dashboard gathers every replica's view (0: no dashboard)"`

	config.Log
}

// LoadConfig reads the environment.
func LoadConfig() (Config, error) {
	c := Config{defaulted: true}
	if err := config.Load(&c); err != nil {
		return c, err
	}
	c, _ = c.withDefaults() // the name, as the configuration is already defaulted
	return c, c.Validate()
}

// Validate checks values envconfig cannot.
func (c Config) Validate() error {
	bad := func(name string, v any, why string) error {
		return fmt.Errorf("invalid %s_%s=%v: %s", config.Prefix, name, v, why)
	}
	switch {
	case c.DashboardRefresh < 0:
		return bad("DASHBOARD_REFRESH", c.DashboardRefresh, "must not be negative (0 turns the dashboard off)")
	case c.StatsWindow <= 0:
		return bad("STATS_WINDOW", c.StatsWindow, "must be positive")
	case c.StatsBucket <= 0 || c.StatsBucket > c.StatsWindow:
		return bad("STATS_BUCKET", c.StatsBucket, "must be positive and at most the window")
	case c.StatsRecent < 0 || c.StatsRecent > c.StatsWindow:
		return bad("STATS_RECENT", c.StatsRecent, "must be 0..the window")
	case c.StatsForgetAfter != 0 && c.StatsForgetAfter < c.StatsWindow:
		return bad("STATS_FORGET_AFTER", c.StatsForgetAfter, "must be 0 (never) or at least the window")
	case c.SnapshotInterval <= 0:
		return bad("SNAPSHOT_INTERVAL", c.SnapshotInterval, "must be positive")
	case c.AckWait <= 0:
		return bad("ACK_WAIT", c.AckWait, "must be positive")
	case c.SweepInterval <= 0:
		return bad("SWEEP_INTERVAL", c.SweepInterval, "must be positive")
	case c.NoNodeWait < 0:
		return bad("NO_NODE_WAIT", c.NoNodeWait, "must not be negative")
	case c.ParkAbove < 0:
		return bad("PARK_ABOVE", c.ParkAbove, "must not be negative (0: off)")
	case c.DeadlineSlack < 0:
		return bad("DEADLINE_SLACK", c.DeadlineSlack, "must not be negative")
	case c.RetryBackoff < 0:
		return bad("RETRY_BACKOFF", c.RetryBackoff, "must not be negative")
	case c.BreakerCooldown <= 0:
		return bad("BREAKER_COOLDOWN", c.BreakerCooldown, "must be positive")
	case c.TaskTimeout <= 0:
		return bad("TASK_TIMEOUT", c.TaskTimeout, "must be positive")
	case c.MaxAttempts < 1 || c.MaxAttempts > protocol.DefaultLimits.MaxAttempts:
		return bad("MAX_ATTEMPTS", c.MaxAttempts, fmt.Sprintf("must be 1..%d", protocol.DefaultLimits.MaxAttempts))
	case c.MaxInFlight < 1:
		return bad("MAX_IN_FLIGHT", c.MaxInFlight, "must be at least 1")
	case c.UnservedMax < 0:
		return bad("UNSERVED_MAX", c.UnservedMax, "must not be negative (0 rejects such tasks without waiting)")
	case c.TasksMaxBytes < 1:
		return bad("TASKS_MAX_BYTES", c.TasksMaxBytes, "must be positive")
	case c.TasksMaxMsgSize < 1:
		return bad("TASKS_MAX_MSG_SIZE", c.TasksMaxMsgSize, "must be positive")
	case c.ResultsMaxMsgs < 1:
		return bad("RESULTS_MAX_MSGS", c.ResultsMaxMsgs, "must be positive")
	case c.ResultsMaxBytes < 1:
		return bad("RESULTS_MAX_BYTES", c.ResultsMaxBytes, "must be positive")
	case c.DLQMaxBytes < 1:
		return bad("DLQ_MAX_BYTES", c.DLQMaxBytes, "must be positive")
	case c.MaxPayloadBytes < 1:
		return bad("MAX_PAYLOAD_BYTES", c.MaxPayloadBytes, "must be at least 1")
	case c.StatsBuffer < 1:
		return bad("STATS_BUFFER", c.StatsBuffer, "must be at least 1")
	case c.ExploreShare < 0 || c.ExploreShare > 1:
		return bad("EXPLORE_SHARE", c.ExploreShare, "must be in 0..1")
	case c.MinSuccess != 0 && !(c.MinSuccess > 0 && c.MinSuccess < 1): // NaN too
		return bad("MIN_SUCCESS", c.MinSuccess, "must be a share in (0, 1), e.g. 0.99")
	case c.MinSamples < 0:
		return bad("MIN_SAMPLES", c.MinSamples, "must not be negative")
	case c.LatencyWeight < 0:
		return bad("LATENCY_WEIGHT", c.LatencyWeight, "must not be negative")
	}
	if err := c.NATS.Validate(); err != nil {
		return err
	}
	if err := opshttp.ValidateAddr(c.HTTPAddr); err != nil {
		return err
	}
	if c.HTTPTokenFile != "" {
		if _, err := secret.ReadFile(c.HTTPTokenFile); err != nil {
			return fmt.Errorf("invalid %s_HTTP_TOKEN_FILE=%q: %w", config.Prefix, c.HTTPTokenFile, err)
		}
	}
	if err := c.Shared.Validate(config.Prefix); err != nil {
		return err
	}
	// What is left for the engine to refuse is a policy name.
	if _, err := parseFlowRules(&c); err != nil {
		return err
	}
	if _, err := policy.NewEngine(c.PolicyConfig()); err != nil {
		return fmt.Errorf("invalid %s_POLICY, %s_POLICY_BY_TYPE, %s_MIN_SUCCESS or %s_MIN_SUCCESS_BY_TYPE: %w", config.Prefix, config.Prefix, config.Prefix, config.Prefix, err)
	}
	return nil
}

// PolicyConfig is the decision engine's configuration.
func (c *Config) PolicyConfig() policy.Config {
	per := map[string]string{}
	for k, v := range c.PolicyByType {
		per[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	bars := map[string]float64{}
	if c.MinSuccess != 0 {
		bars["*"] = c.MinSuccess
	}
	for k, v := range c.MinSuccessByType {
		bars[strings.TrimSpace(k)] = v
	}
	return policy.Config{
		Default: c.Policy, PerType: per, MinSamples: c.MinSamples, ExploreShare: c.ExploreShare, MinSuccess: bars,
		LatencyWeight: c.LatencyWeight, QueueTarget: c.QueueTarget.policy(),
		Timeout: c.TaskTimeout, Deadline: c.TaskTimeout + c.DeadlineSlack,
		Breaker: policy.BreakerConfig{
			ConsecutiveFailures: c.BreakerFailures, FailureRate: c.BreakerFailureRate,
			MinRequests: c.BreakerMinRequests, Cooldown: c.BreakerCooldown, HalfOpenProbes: c.BreakerProbes,
		},
	}
}

// Window is the statistics window.
func (c *Config) Window() stats.Window {
	return stats.Window{Size: c.StatsWindow, Bucket: c.StatsBucket, Recent: c.StatsRecent}
}

// Topology is the stream configuration.
func (c *Config) Topology() topology.Config {
	t := c.Shared.Config()
	t.ResultsMaxAge, t.ResultsMaxMsgs, t.ResultsMaxBytes = c.ResultsMaxAge, c.ResultsMaxMsgs, c.ResultsMaxBytes
	t.DLQMaxBytes = c.DLQMaxBytes
	t.TasksMaxBytes, t.TasksMaxMsgSize = c.TasksMaxBytes, c.TasksMaxMsgSize
	t.UpdateLimits = true // the dispatcher owns the streams
	return t
}

// Retry is the retry rules.
func (c *Config) Retry() settle.Rules {
	return settle.Rules{Backoff: c.RetryBackoff, BackoffMax: c.RetryBackoffMax}
}

// admission is the configuration admission reads. Its UnservedMax is
// capped at MaxInFlight, so that tasks waiting for a node leave at least
// half the consumers' MaxAckPending to the rest.
func (c *Config) admission() admission.Config {
	return admission.Config{TaskTimeout: c.TaskTimeout, DeadlineSlack: c.DeadlineSlack, MaxAttempts: c.MaxAttempts,
		AckWait: c.AckWait, NoNodeWait: c.NoNodeWait, NodeTTL: c.NodeTTL, UnservedMax: min(c.UnservedMax, c.MaxInFlight),
		QueueTargetOn: c.QueueTarget.On(), QuotaReject: c.QuotaReject}
}

// Limits are the task validation limits.
func (c *Config) Limits() protocol.Limits {
	return protocol.Limits{MaxPayloadBytes: c.MaxPayloadBytes}
}

// DefaultConfig returns the configuration with every default applied and
// nothing read from the environment.
func DefaultConfig() Config {
	c := Config{defaulted: true}
	_ = config.Defaults(&c)
	return c
}

// withDefaults fills what a Config built in code left zero.
func (c Config) withDefaults() (Config, error) {
	if !c.defaulted {
		if err := config.FillZero(&c); err != nil {
			return c, err
		}
		c.defaulted = true
	}
	if c.Name == "" {
		c.Name = hostname()
	}
	return c, nil
}

// QueueTarget is MLSCHED_QUEUE_TARGET: 0 automatic (each (model, node)'s
// own, from its measured latency), > 0 a fixed target, < 0 off.
type QueueTarget time.Duration

// Decode parses "auto", "off", "0" (off, as it always meant) or a
// positive duration.
func (q *QueueTarget) Decode(v string) error {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "", "auto":
		*q = 0
		return nil
	case "off", "none", "0":
		*q = -1
		return nil
	}
	d, err := time.ParseDuration(strings.TrimSpace(v))
	if err != nil {
		return fmt.Errorf("queue target %q: want auto, off or a duration: %w", v, err)
	}
	if d < 0 {
		return fmt.Errorf("queue target %q: want auto, off or a positive duration", v)
	}
	if d == 0 {
		d = -1
	}
	*q = QueueTarget(d)
	return nil
}

// String is the setting as Decode reads it.
func (q QueueTarget) String() string {
	switch {
	case q == 0:
		return "auto"
	case q < 0:
		return "off"
	}
	return time.Duration(q).String()
}

// On reports whether a queue target applies (automatic or fixed).
func (q QueueTarget) On() bool { return q >= 0 }

func (q QueueTarget) policy() time.Duration { return time.Duration(q) }

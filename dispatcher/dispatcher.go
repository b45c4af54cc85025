package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/dispatcher/dashboard"
	"github.com/mlsched/mlsched/dispatcher/internal/admission"
	"github.com/mlsched/mlsched/dispatcher/internal/finish"
	"github.com/mlsched/mlsched/dispatcher/internal/outcome"
	"github.com/mlsched/mlsched/dispatcher/internal/policy"
	"github.com/mlsched/mlsched/dispatcher/internal/registry"
	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/dispatcher/stats/redisstats"
	"github.com/mlsched/mlsched/shared/jsplumb"
	"github.com/mlsched/mlsched/shared/lifecycle"
	"github.com/mlsched/mlsched/shared/natsconn"
	"github.com/mlsched/mlsched/shared/opshttp"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/redisconn"
	"github.com/mlsched/mlsched/shared/topology"
	"github.com/mlsched/mlsched/shared/tracing"
)

// Dispatcher is one dispatcher replica: the wiring of its components and
// their lifecycle. Everything that handles a message is a stage of its own
// (internal/intake, internal/admission, internal/outcome, internal/finish),
// built by run from what it needs.
type Dispatcher struct {
	cfg      Config
	log      zerolog.Logger
	engine   *policy.Engine
	tracer   *tracing.Tracer
	metrics  *metrics
	counters Counters
	given    given         // what the options supplied
	http     *httpListener // /metrics, /healthz, /readyz, the dashboard (observe.go)
	live     atomic.Bool   // started and not draining: what /readyz needs first
	// parts is what run built, nil until it has set up the store, the
	// registry and the stages: what Report, Ready, Cancel and the metrics
	// read.
	parts atomic.Pointer[parts]
}

// given is what the options supplied instead of the configuration.
type given struct {
	nc    *nats.Conn // the caller closes it
	store stats.Store
	kind  string
}

// parts are the components run builds that the operator-facing code reads.
type parts struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	store   stats.Store
	kind    string // "redis" or "memory"
	batch   *stats.Batcher
	reg     *registry.Registry
	snaps   *refresher // statistics snapshot and decision table
	adm     *admission.Stage
	cancel  *canceller
	backlog *backlogSampler // streams.go
	streams *streamSampler  // streams.go
	rolls   *rollouts       // rollouts.go
}

// Counters are cumulative, per replica.
type Counters struct {
	// Counts are the finish stage's: results by status, suppressed second
	// results, flow control's endings, results per type.
	finish.Counts
	// Counts are the outcome stage's: forged, late and lost attempts,
	// expired tasks, direct reports.
	outcome.Counters
	// Tallies are admission's: dispatches, holds, flow control's
	// refusals.
	admission.Tallies
	DeadLettered atomic.Int64
	// Cancelled counts the cancel requests this replica carried out.
	Cancelled atomic.Int64
	// StoreResets counts the times this replica found the Redis statistics
	// store reset (restarted empty, or failed over) and re-seeded it.
	StoreResets atomic.Int64
	// Parked counts the tasks parked over their tenant's share of a band
	// (internal/intake/park.go).
	Parked atomic.Int64
}

// Option configures a Dispatcher.
type Option func(*Dispatcher)

// WithConn uses an existing NATS connection (the caller closes it).
func WithConn(nc *nats.Conn) Option { return func(d *Dispatcher) { d.given.nc = nc } }

// WithStore uses the given statistics store instead of one built from the
// configuration.
func WithStore(s stats.Store, kind string) Option {
	return func(d *Dispatcher) { d.given.store, d.given.kind = s, kind }
}

// WithLogger sets the logger.
func WithLogger(l zerolog.Logger) Option { return func(d *Dispatcher) { d.log = l } }

// New validates the configuration and builds a dispatcher; Run starts it.
func New(cfg Config, opts ...Option) (*Dispatcher, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	engine, err := policy.NewEngine(cfg.PolicyConfig())
	if err != nil {
		return nil, err
	}
	d := &Dispatcher{cfg: cfg, engine: engine, log: zerolog.Nop()}
	for _, o := range opts {
		o(d)
	}
	d.log = d.log.With().Str("dispatcher", cfg.Name).Logger()
	d.http = &httpListener{addr: cfg.HTTPAddr, log: d.log, dashboard: cfg.DashboardRefresh > 0}
	d.metrics = newMetrics(d)
	if d.tracer, err = tracing.New(tracing.Config{Endpoint: cfg.OTelEndpoint, Service: "mlsched-dispatcher",
		Instance: cfg.Name}); err != nil {
		return nil, err
	}
	return d, nil
}

// Counters returns the replica's counters.
func (d *Dispatcher) Counters() *Counters { return &d.counters }

// Store returns the statistics store in use (after Run has started).
func (d *Dispatcher) Store() stats.Store {
	if p := d.parts.Load(); p != nil {
		return p.store
	}
	return d.given.store
}

// Config returns the dispatcher's configuration (defaults applied).
func (d *Dispatcher) Config() Config { return d.cfg }

// Report builds this replica's view of the cluster (admin.go).
func (d *Dispatcher) Report() *protocol.StatsReport {
	p := d.parts.Load()
	if p == nil { // still starting: nothing to report but the name
		return &protocol.StatsReport{Dispatcher: d.cfg.Name, Window: d.cfg.StatsWindow}
	}
	r := p.report(d.cfg, &d.counters)
	r.Cost = d.metrics.costReport()
	return r
}

// Backlog is the last sample of tasks waiting per type (nil before the
// first); the map must not be modified.
func (d *Dispatcher) Backlog() map[string]int64 {
	if p := d.parts.Load(); p != nil {
		return p.backlog.get()
	}
	return nil
}

// Cancel cancels a task that has no result yet (cancel.go).
func (d *Dispatcher) Cancel(ctx context.Context, req protocol.CancelRequest) protocol.CancelReply {
	p := d.parts.Load()
	if p == nil {
		return protocol.CancelReply{ID: req.ID, Outcome: protocol.CancelInvalid, Error: "the dispatcher is starting"}
	}
	return p.cancel.Cancel(ctx, req)
}

// Ready reports readiness (observe.go): connected to NATS, every stream
// present, the statistics store reachable; degraded mode says why.
func (d *Dispatcher) Ready(ctx context.Context) opshttp.Status {
	p := d.parts.Load()
	if !d.live.Load() || p == nil {
		return notLive
	}
	return p.ready(ctx)
}

// HandleHTTP mounts h on the replica's HTTP listener (MLSCHED_HTTP_ADDR), next
// to /metrics, /healthz and /readyz: the dashboard and its API. Call it before
// or after Run; with the listener off it does nothing. Use ServeMux patterns
// that match exactly what they serve ("GET /{$}" for the root page), so that
// unknown paths stay 404.
func (d *Dispatcher) HandleHTTP(pattern string, h http.Handler) { d.http.handle(pattern, h) }

// HTTPAddr is the listener's bound address, nil when it is off or not
// started yet.
func (d *Dispatcher) HTTPAddr() net.Addr { return d.http.bound() }

// Metrics is the replica's Prometheus registry (what /metrics serves).
func (d *Dispatcher) Metrics() prometheus.Gatherer { return d.metrics.reg }

func hostname() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "dispatcher"
	}
	return h
}

// connect opens the NATS connection (unless WithConn gave one: own is then
// false) and ensures the topology.
func (d *Dispatcher) connect(ctx context.Context) (nc *nats.Conn, own bool, js jetstream.JetStream, err error) {
	nc = d.given.nc
	if nc == nil {
		if nc, err = natsconn.ConnectContext(ctx, d.cfg.NATS, natsconn.Conn{ // waits for a server at start
			Name: "mlsched-dispatcher-" + d.cfg.Name, Inbox: natsconn.InboxDispatcher, Log: &d.log, Retry: true,
		}); err != nil {
			return nil, false, nil, err
		}
		own = true
	}
	fail := func(err error) (*nats.Conn, bool, jetstream.JetStream, error) {
		if own {
			nc.Close()
		}
		return nil, false, nil, err
	}
	if js, err = jetstream.New(nc); err != nil {
		return fail(fmt.Errorf("jetstream: %w", err))
	}
	// Retried while JetStream is unavailable (a cluster election): a
	// dispatcher restarted then waits instead of exiting.
	if err := jsplumb.Retry(ctx, d.log, "topology", func(ctx context.Context) error {
		t := d.cfg.Topology()
		t.Notice = func(msg string) { d.log.Warn().Msg(msg) }
		return topology.Ensure(ctx, js, t)
	}); err != nil {
		return fail(err)
	}
	return nc, own, js, nil
}

// openStore opens the statistics store the configuration names, unless
// WithStore gave one; rc is the Redis client it opened (nil otherwise),
// for the caller to close.
func (d *Dispatcher) openStore(ctx context.Context) (store stats.Store, kind string, rc redis.UniversalClient, err error) {
	if d.given.store != nil {
		return d.given.store, d.given.kind, nil, nil
	}
	if d.cfg.RedisURL == "" {
		return stats.NewMemory(d.cfg.Window()), "memory", nil, nil
	}
	c, err := redisconn.Open(redisconn.Config{URL: d.cfg.RedisURL, ClientName: "mlsched-dispatcher-" + d.cfg.Name,
		PasswordFile: d.cfg.RedisPasswordFile, CA: d.cfg.RedisCA, Cert: d.cfg.RedisCert, Key: d.cfg.RedisKey})
	if err != nil {
		return nil, "", nil, fmt.Errorf("MLSCHED_REDIS_URL: %w", err)
	}
	// A refused password or certificate is a configuration error, not an
	// outage: stop with it rather than run degraded for ever. Redis being
	// down is an outage.
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err = redisconn.Ping(pctx, c)
	cancel()
	switch {
	case errors.Is(err, redisconn.ErrAuth):
		_ = c.Close()
		return nil, "", nil, fmt.Errorf("connect to Redis at %s: %w (check MLSCHED_REDIS_URL's user and MLSCHED_REDIS_PASSWORD_FILE)", redisconn.Redact(d.cfg.RedisURL), err)
	case errors.Is(err, redisconn.ErrTLS):
		_ = c.Close()
		return nil, "", nil, fmt.Errorf("connect to Redis at %s: %w (check MLSCHED_REDIS_CA, MLSCHED_REDIS_CERT and MLSCHED_REDIS_KEY)", redisconn.Redact(d.cfg.RedisURL), err)
	case err != nil:
		d.log.Warn().Err(err).Str("redis", redisconn.Redact(d.cfg.RedisURL)).Msg("Redis does not answer at start: running degraded until it does")
	}
	return redisstats.New(c, d.cfg.Window(), redisstats.WithReseed(d.cfg.StatsReseed),
		redisstats.WithForgetAfter(d.cfg.StatsForgetAfter),
		redisstats.WithOnReset(func(r redisstats.ResetInfo) {
			d.counters.StoreResets.Add(1)
			if r.Skipped {
				d.log.Warn().Str("old_generation", r.OldGeneration).Str("generation", r.NewGeneration).
					Msg("statistics store was reset; MLSCHED_STATS_RESEED=false: learning again from what it holds")
				return
			}
			d.log.Warn().Str("old_generation", r.OldGeneration).Str("generation", r.NewGeneration).Bool("first", r.First).
				Int("buckets", r.Buckets).Int("fields", r.Fields).Dur("took", r.Took).
				Msg("statistics store was reset: re-seeded it from this replica's last snapshot")
		})), "redis", c, nil
}

// Run starts the dispatcher and blocks until ctx is cancelled, then drains:
// it stops consuming, waits for publishes in flight to settle their
// messages, and flushes statistics.
func (d *Dispatcher) Run(ctx context.Context) error {
	err := d.run(ctx)
	if ctx.Err() != nil && errors.Is(err, context.Canceled) {
		return nil // stopped while starting
	}
	return err
}

func (d *Dispatcher) run(ctx context.Context) error {
	stopHTTP, err := d.http.start(d.metrics.reg, d.Ready)
	if err != nil {
		return err
	}
	defer stopHTTP()
	defer func() { // spans not exported yet
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = d.tracer.Shutdown(ctx)
	}()
	nc, own, js, err := d.connect(ctx)
	if err != nil {
		return err
	}
	if own {
		defer nc.Close()
	}
	gr := &ground{nc: nc, js: js}
	if err := d.openGround(ctx, gr); err != nil {
		return err
	}
	defer gr.store.Close()
	if gr.rc != nil {
		defer gr.rc.Close()
	}
	w, err := d.wire(gr)
	if err != nil {
		return err
	}
	d.parts.Store(&parts{nc: nc, js: js, store: gr.store, kind: gr.kind, batch: w.batch, reg: w.reg, snaps: w.snaps,
		adm: w.adm, cancel: w.cn, backlog: w.backlog, streams: w.streams, rolls: w.rolls})
	batchCtx, cancelBatch := context.WithCancel(context.Background())
	defer cancelBatch()
	return d.serve(ctx, d.components(gr, w, batchCtx), w)
}

// runDashboard mounts the web dashboard at / on the HTTP listener and
// gathers its view until ctx ends (see package dashboard): only when the
// listener is on.
func (d *Dispatcher) runDashboard(ctx context.Context, nc *nats.Conn, js jetstream.JetStream) {
	if d.http.bound() == nil || d.cfg.DashboardRefresh <= 0 {
		return
	}
	dash := dashboard.New(nc, js, dashboard.Config{Interval: d.cfg.DashboardRefresh, TokenFile: d.cfg.HTTPTokenFile}, d.log)
	for _, p := range dashboard.Patterns {
		d.http.handle(p, dash)
	}
	dash.Run(ctx)
}

// subscription serves a core-NATS subscription while running.
func subscription(serve func() (*nats.Subscription, error)) lifecycle.Service {
	var sub *nats.Subscription
	return &lifecycle.Func{
		OnStart: func(context.Context) (err error) { sub, err = serve(); return err },
		OnStop:  func() error { return sub.Unsubscribe() },
	}
}

// newTaskConsumer consumes one priority band of the task stream through the
// band's durable consumer (topology.BandConsumer). Each band has its own
// MaxAckPending, so held tasks of one band never stop another's pulls.
func newTaskConsumer(js jetstream.JetStream, cfg Config, log zerolog.Logger, band int, h jetstream.MessageHandler) *jsplumb.Consumer {
	c := newConsumer(js, cfg, log, topology.StreamTasks, h)
	c.Config.Durable, c.Config.FilterSubjects = topology.BandConsumer(band)
	c.Log = c.Log.With().Int("band", band).Logger()
	return c
}

// newConsumer consumes one stream through the durable consumer all replicas
// share (shared/jsplumb.Consumer re-creates it when it is deleted under us). A
// consumer that exists with an incompatible configuration ends it with
// topology.ErrIncompatible.
func newConsumer(js jetstream.JetStream, cfg Config, log zerolog.Logger, stream string, h jetstream.MessageHandler) *jsplumb.Consumer {
	return &jsplumb.Consumer{JS: js, Stream: stream, Handle: h,
		Config: jetstream.ConsumerConfig{
			Durable:       topology.ConsumerDispatcher,
			AckPolicy:     jetstream.AckExplicitPolicy,
			AckWait:       cfg.AckWait,
			MaxAckPending: 2 * cfg.MaxInFlight,
			MaxDeliver:    -1, // work-queue streams keep what hits MaxDeliver: we settle every message ourselves
		},
		Pull: min(cfg.MaxInFlight, 256), Heartbeat: 5 * time.Second, Check: 5 * time.Second,
		Log: log.With().Str("stream", stream).Logger()}
}

// groupCommit returns what publishes to stream through pub: a group commit
// (those published while the stream is busy are stored as one atomic batch,
// with one fsync) when MLSCHED_GROUP_COMMIT is on and the stream is on disk
// and allows atomic batches, else pub itself; and the group commit's
// service (nothing to run for pub).
func groupCommit(cfg Config, pub *jsplumb.Publisher, stream jetstream.Stream) (jsplumb.Sender, lifecycle.Service) {
	if !cfg.GroupCommit || !topology.GroupCommits(stream.CachedInfo()) {
		return pub, &lifecycle.Func{}
	}
	g := jsplumb.NewGroupCommit(pub, jsplumb.GroupCommitConfig{MaxWaiting: cfg.MaxInFlight})
	return g, &lifecycle.Func{OnStart: g.Start, OnStop: g.Stop}
}

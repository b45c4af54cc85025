package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/shared/jspub"
	"github.com/mlsched/mlsched/shared/jsretry"
	"github.com/mlsched/mlsched/shared/lifecycle"
	"github.com/mlsched/mlsched/shared/natsconn"
	"github.com/mlsched/mlsched/shared/opshttp"
	"github.com/mlsched/mlsched/shared/policy"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/redisconn"
	"github.com/mlsched/mlsched/shared/registry"
	"github.com/mlsched/mlsched/shared/stats"
	"github.com/mlsched/mlsched/shared/stats/redisstats"
	"github.com/mlsched/mlsched/shared/topology"
	"github.com/mlsched/mlsched/shared/tracing"
)

// Dispatcher is one dispatcher replica.
type Dispatcher struct {
	cfg   Config
	log   zerolog.Logger
	nc    *nats.Conn
	ownNC bool
	js    jetstream.JetStream
	store stats.Store
	kind  string // "redis" or "memory"
	// redis is the client the dispatcher opened for its store (nil when it
	// was given a store); closed on exit.
	redis  redis.UniversalClient
	batch  *stats.Batcher
	engine *policy.Engine
	reg    *registry.Registry
	// superseded attempts: their late outcomes are counted, never final.
	superseded *supersededSet

	dispatchStream jetstream.Stream
	resultsStream  jetstream.Stream

	// The components, each with the same lifecycle (shared/lifecycle); run
	// starts them in this order and stops them in reverse.
	snaps *refresher       // statistics snapshot and decision table
	pub   *jspub.Publisher // dispatches: publish-then-ack by callback
	// resPub publishes results, with room of its own: a backlog of
	// dispatches awaiting their acknowledgements must not hold back the
	// results that finish tasks.
	resPub  *jspub.Publisher
	settler *settler // publish-then-ack
	dlq     *deadLetters
	sweeper *sweeper  // lost attempts
	held    *holdRoom // tasks held back for want of capacity (hold.go)
	// tasks waiting for a node to serve them (unserved.go)
	unserved *unservedRoom

	counters Counters
	wired    atomic.Bool // the components are built (Report reads them)

	metrics      *metrics
	tracer       *tracing.Tracer
	live         atomic.Bool // started and not draining: what /readyz needs first
	backlog      atomic.Pointer[map[string]int64]
	httpMu       sync.Mutex
	http         *opshttp.Server
	httpHandlers []httpHandler // mounted once the listener starts

	initDone  chan struct{}    // closed once run has set up the store, registry and snapshots
	sealer    *protocol.Sealer // seals dispatches under the key every replica shares (trust.go)
	forgedLog sometimes        // bounded-rate log of refused outcomes
	badHBLog  sometimes        // bounded-rate log of refused heartbeats
}

// Counters are cumulative, per replica.
type Counters struct {
	Dispatched, Redispatched, Results, Rejected, DeadLettered atomic.Int64
	// Suppressed counts results refused because the task already had one.
	Suppressed atomic.Int64
	// Late counts outcomes of attempts that had been superseded.
	Late atomic.Int64
	// Lost counts attempts found unanswered at their deadline.
	Lost atomic.Int64
	// Panic counts decisions made in panic mode: every candidate's breaker
	// was open and the engine routed among all of them anyway.
	Panic atomic.Int64
	// Cancelled counts the cancel requests this replica carried out.
	Cancelled atomic.Int64
	// Saturated counts tasks held back because every candidate was
	// saturated (hold.go).
	Saturated atomic.Int64
	// StoreResets counts the times this replica found the Redis statistics
	// store reset (restarted empty, or failed over) and re-seeded it.
	StoreResets atomic.Int64
	// UnservedRefused counts tasks no node served that were rejected at
	// once because MLSCHED_UNSERVED_MAX tasks were waiting (unserved.go).
	UnservedRefused atomic.Int64
	// Forged counts outcomes refused because they answer no dispatch a
	// dispatcher made, or disagree with it (trust.go).
	Forged atomic.Int64
	// Reports counts the direct reports this replica settled (reports.go);
	// ReportsDeferred those it sent back to be stored as outcomes.
	Reports, ReportsDeferred atomic.Int64
	// Succeeded and Failed count the stored results by status (Rejected,
	// above, the rejected ones); Shed the failed ones that waited their
	// deadline with every candidate saturated (code saturated).
	Succeeded, Failed, Shed atomic.Int64
	// types counts results per task type (types.go).
	types typeCounts
}

// Option configures a Dispatcher.
type Option func(*Dispatcher)

// WithConn uses an existing NATS connection (the caller closes it).
func WithConn(nc *nats.Conn) Option { return func(d *Dispatcher) { d.nc = nc } }

// WithStore uses the given statistics store instead of one built from the
// configuration.
func WithStore(s stats.Store, kind string) Option {
	return func(d *Dispatcher) { d.store, d.kind = s, kind }
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
	d.snaps = &refresher{engine: engine, interval: cfg.SnapshotInterval, log: d.log}
	d.settler = newSettler(cfg.MaxInFlight, d.log)
	d.metrics = newMetrics(d)
	if d.tracer, err = tracing.New(tracing.Config{Endpoint: cfg.OTelEndpoint, Service: "mlsched-dispatcher",
		Instance: cfg.Name}); err != nil {
		return nil, err
	}
	d.held = newHoldRoom()
	d.unserved = &unservedRoom{}

	d.forgedLog.every, d.badHBLog.every = 10*time.Second, 10*time.Second
	d.initDone = make(chan struct{})
	return d, nil
}

// Counters returns the replica's counters.
func (d *Dispatcher) Counters() *Counters { return &d.counters }

// Store returns the statistics store in use (after Run has started).
func (d *Dispatcher) Store() stats.Store { return d.store }

func hostname() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "dispatcher"
	}
	return h
}

func (d *Dispatcher) connect(ctx context.Context) error {
	if d.nc == nil {
		nc, err := natsconn.ConnectContext(ctx, d.cfg.NATS, natsconn.Conn{ // waits for a server at start
			Name: "mlsched-dispatcher-" + d.cfg.Name, Inbox: natsconn.InboxDispatcher, Log: &d.log, Retry: true,
		})
		if err != nil {
			return err
		}
		d.nc, d.ownNC = nc, true
	}
	js, err := jetstream.New(d.nc, jetstream.WithPublishAsyncMaxPending(d.cfg.MaxInFlight),
		jetstream.WithPublishAsyncTimeout(10*time.Second))
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	d.js = js
	d.pub = jspub.New(d.nc, jspub.Config{MaxPending: d.cfg.MaxInFlight, Timeout: 10 * time.Second})
	d.resPub = jspub.New(d.nc, jspub.Config{MaxPending: d.cfg.MaxInFlight, Timeout: 10 * time.Second})
	// Retried while JetStream is unavailable (a cluster election): a
	// dispatcher restarted then waits instead of exiting.
	if err := jsretry.Do(ctx, d.log, "topology", func(ctx context.Context) error {
		return topology.Ensure(ctx, js, d.cfg.Topology())
	}); err != nil {
		return err
	}
	if err := jsretry.Do(ctx, d.log, "streams", func(ctx context.Context) (err error) {
		if d.dispatchStream, err = js.Stream(ctx, topology.StreamDispatch); err != nil {
			return fmt.Errorf("stream %s: %w", topology.StreamDispatch, err)
		}
		if d.resultsStream, err = js.Stream(ctx, topology.StreamResults); err != nil {
			return fmt.Errorf("stream %s: %w", topology.StreamResults, err)
		}
		return nil
	}); err != nil {
		return err
	}
	return nil
}

func (d *Dispatcher) openStore(ctx context.Context) error {
	if d.store != nil {
		return nil
	}
	if d.cfg.RedisURL == "" {
		d.store, d.kind = stats.NewMemory(d.cfg.Window()), "memory"
		return nil
	}
	c, err := redisconn.Open(redisconn.Config{URL: d.cfg.RedisURL, ClientName: "mlsched-dispatcher-" + d.cfg.Name,
		PasswordFile: d.cfg.RedisPasswordFile, CA: d.cfg.RedisCA, Cert: d.cfg.RedisCert, Key: d.cfg.RedisKey})
	if err != nil {
		return fmt.Errorf("MLSCHED_REDIS_URL: %w", err)
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
		return fmt.Errorf("connect to Redis at %s: %w (check MLSCHED_REDIS_URL's user and MLSCHED_REDIS_PASSWORD_FILE)", redisconn.Redact(d.cfg.RedisURL), err)
	case errors.Is(err, redisconn.ErrTLS):
		_ = c.Close()
		return fmt.Errorf("connect to Redis at %s: %w (check MLSCHED_REDIS_CA, MLSCHED_REDIS_CERT and MLSCHED_REDIS_KEY)", redisconn.Redact(d.cfg.RedisURL), err)
	case err != nil:
		d.log.Warn().Err(err).Str("redis", redisconn.Redact(d.cfg.RedisURL)).Msg("Redis does not answer at start: running degraded until it does")
	}
	d.redis = c
	d.store, d.kind = redisstats.New(c, d.cfg.Window(), redisstats.WithReseed(d.cfg.StatsReseed),
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
		})), "redis"
	return nil
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
	stopHTTP, err := d.startHTTP()
	if err != nil {
		return err
	}
	defer stopHTTP()
	defer func() { // spans not exported yet
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = d.tracer.Shutdown(ctx)
	}()
	if err := d.connect(ctx); err != nil {
		return err
	}
	if d.ownNC {
		defer d.nc.Close()
	}
	if err := d.openStore(ctx); err != nil {
		return err
	}
	defer d.store.Close()
	if d.redis != nil {
		defer d.redis.Close()
	}

	var kv, skv jetstream.KeyValue
	if err := jsretry.Do(ctx, d.log, "buckets", func(ctx context.Context) (err error) {
		if kv, err = topology.EnsureNodesBucket(ctx, d.js, d.cfg.Topology()); err != nil {
			return err
		}
		skv, err = topology.EnsureSupersededBucket(ctx, d.js, d.cfg.Topology())
		return err
	}); err != nil {
		return err
	}
	// On a cluster the bucket's stream may still be electing its leader
	// (its reads get no responders): wait, as for the other buckets.
	if err := jsretry.Do(ctx, d.log, "seal key", func(ctx context.Context) error {
		pkv, err := topology.EnsureDispatcherBucket(ctx, d.js, d.cfg.Topology())
		if err != nil {
			return err
		}
		key, err := loadSealKey(ctx, pkv)
		if err == nil {
			d.sealer = protocol.NewSealer(key)
		}
		return err
	}); err != nil {
		return err
	}
	d.batch = stats.NewBatcher(d.store, stats.BatcherConfig{MaxBuffer: d.cfg.StatsBuffer})
	d.superseded = newSupersededSet(skv, d.log)
	d.reg = registry.New(kv, d.cfg.NodeTTL, d.log)
	d.wired.Store(true) // Report may read batch and reg from now on
	d.snaps.store, d.snaps.reg = d.store, d.reg
	d.dlq = &deadLetters{js: d.js, log: d.log, count: &d.counters.DeadLettered,
		onStored: func(kind string) { d.metrics.dead.Get(kind).Inc() }}
	d.sweeper = &sweeper{js: d.js, dispatch: d.dispatchStream, results: d.resultsStream, dlq: d.dlq,
		every: d.cfg.SweepInterval, slack: d.cfg.DeadlineSlack, log: d.log}
	tasks := d.newConsumer(topology.StreamTasks, d.handleTask)
	outcomes := d.newConsumer(topology.StreamOutcomes, d.handleOutcome)

	close(d.initDone) // Report may read what run set up
	var g lifecycle.Group
	start := func(name string, s lifecycle.Service) error {
		err := g.Start(ctx, name, s)
		if err != nil {
			err = errors.Join(err, g.Stop())
		}
		return err
	}
	components := []struct {
		name string
		s    lifecycle.Service
	}{
		{"statistics batcher", d.batcherService()},
		{"superseded set", d.superseded},
		{"node registry", d.registryService()},
		{"snapshot refresher", d.snaps},
		// stopped after everything that dispatches or settles outcomes: their
		// Stop waits for the dispatches and results in flight, which settle
		// their messages
		{"dispatch publisher", &lifecycle.Func{OnStart: d.pub.Start, OnStop: d.pub.Stop}},
		{"result publisher", &lifecycle.Func{OnStart: d.resPub.Start, OnStop: d.resPub.Stop}},
		{"settler", d.settler},
		{"sweeper", d.sweeper},
		{"backlog sampler", d.backlogService()},
		{"dashboard", lifecycle.Run(func(ctx context.Context, ready func()) error { ready(); d.runDashboard(ctx); return nil })},
		{"admin", d.subscription(d.serveAdmin)},
		{"cancel", d.subscription(d.serveCancel)},
		// after the settler (a held task's dispatch settles through it),
		// before the consumers (which hold tasks): stopping, it naks them
		{"hold room", d.holdService()},
		{"unserved room", d.unservedService()},
		// before the task consumer: a dispatch's report finds a replica
		{"direct reports", d.reportsService()},
		{"task consumer", tasks},
		{"outcome consumer", outcomes},
	}
	for _, c := range components {
		if err := start(c.name, c.s); err != nil {
			return err
		}
	}
	d.live.Store(true)
	d.log.Info().Str("store", d.kind).Str("policy", d.cfg.Policy).Msg("dispatcher started")

	select {
	case <-ctx.Done():
	case <-tasks.Done(): // a consumer ends on its own only when it cannot go on
	case <-outcomes.Done():
	}
	d.live.Store(false)
	d.log.Info().Msg("dispatcher draining")
	// In reverse: the consumers drain, then every publish in flight settles
	// its message, then the loops stop and the statistics are flushed.
	err = g.Stop()
	if err != nil {
		d.log.Error().Err(err).Msg("dispatcher stopped with errors")
	} else {
		d.log.Info().Msg("dispatcher stopped")
	}
	return err
}

// batcherService runs the statistics batcher; its Stop flushes what is
// buffered and reports what could not be written.
func (d *Dispatcher) batcherService() lifecycle.Service {
	bg, cancel := context.WithCancel(context.Background())
	return &lifecycle.Func{
		OnStart: func(context.Context) error { d.batch.Start(bg); return nil },
		OnStop: func() error {
			defer cancel()
			flush, cancelFlush := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancelFlush()
			return d.batch.Stop(flush)
		},
	}
}

// backlogService samples the task backlog for the metrics.
func (d *Dispatcher) backlogService() lifecycle.Service {
	return lifecycle.Run(func(ctx context.Context, ready func()) error {
		ready()
		d.backlogLoop(ctx)
		return nil
	})
}

// registryService follows the nodes bucket; it is started once the bucket's
// contents are loaded (or after 2s), so that the first decisions see every
// node.
func (d *Dispatcher) registryService() lifecycle.Service {
	return lifecycle.Run(func(ctx context.Context, ready func()) error {
		go func() {
			select {
			case <-d.reg.Ready():
			case <-time.After(2 * time.Second):
			case <-ctx.Done():
			}
			ready()
		}()
		return d.reg.Run(ctx)
	})
}

// subscription serves a core-NATS subscription while running.
func (d *Dispatcher) subscription(serve func() (*nats.Subscription, error)) lifecycle.Service {
	var sub *nats.Subscription
	return &lifecycle.Func{
		OnStart: func(context.Context) (err error) { sub, err = serve(); return err },
		OnStop:  func() error { return sub.Unsubscribe() },
	}
}

// Config returns the dispatcher's configuration (defaults applied).
func (d *Dispatcher) Config() Config { return d.cfg }

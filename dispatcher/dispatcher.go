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

	"github.com/mlsched/mlsched/shared/natsconn"
	"github.com/mlsched/mlsched/shared/opshttp"
	"github.com/mlsched/mlsched/shared/policy"
	"github.com/mlsched/mlsched/shared/redisconn"
	"github.com/mlsched/mlsched/shared/registry"
	"github.com/mlsched/mlsched/shared/stats"
	"github.com/mlsched/mlsched/shared/stats/redisstats"
	"github.com/mlsched/mlsched/shared/topology"
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

	table    atomic.Pointer[policy.Table]
	snap     atomic.Pointer[stats.Snapshot]
	degraded atomic.Pointer[string] // nil when the store answers
	// timeouts maps model names to their announced per-task timeout (ms).
	timeouts atomic.Pointer[map[string]int64]

	sweeper sweeper // state of the lost-attempt sweep loop

	// pending publishes whose acknowledgement settles a consumed message.
	pending chan pendingAck
	wg      sync.WaitGroup

	counters Counters

	metrics      *metrics
	live         atomic.Bool // started and not draining: what /readyz needs first
	backlog      atomic.Pointer[map[string]int64]
	httpMu       sync.Mutex
	http         *opshttp.Server
	httpHandlers []httpHandler // mounted once the listener starts
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
	d.pending = make(chan pendingAck, cfg.MaxInFlight)
	d.metrics = newMetrics(d)
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
		nc, err := natsconn.Connect(d.cfg.NATS, natsconn.Conn{
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
	if err := topology.Ensure(ctx, js, d.cfg.Topology()); err != nil {
		return err
	}
	if d.dispatchStream, err = js.Stream(ctx, topology.StreamDispatch); err != nil {
		return fmt.Errorf("stream %s: %w", topology.StreamDispatch, err)
	}
	if d.resultsStream, err = js.Stream(ctx, topology.StreamResults); err != nil {
		return fmt.Errorf("stream %s: %w", topology.StreamResults, err)
	}
	return nil
}

func (d *Dispatcher) openStore() error {
	if d.store != nil {
		return nil
	}
	if d.cfg.RedisURL == "" {
		d.store, d.kind = stats.NewMemory(d.cfg.Window()), "memory"
		return nil
	}
	c, err := redisconn.Open(redisconn.Config{URL: d.cfg.RedisURL, ClientName: "mlsched-dispatcher-" + d.cfg.Name})
	if err != nil {
		return fmt.Errorf("MLSCHED_REDIS_URL: %w", err)
	}
	d.redis = c
	d.store, d.kind = redisstats.New(c, d.cfg.Window(), redisstats.WithOnReset(func(r redisstats.ResetInfo) {
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
	if err := d.connect(ctx); err != nil {
		return err
	}
	if d.ownNC {
		defer d.nc.Close()
	}
	if err := d.openStore(); err != nil {
		return err
	}
	defer d.store.Close()
	if d.redis != nil {
		defer d.redis.Close()
	}

	kv, err := topology.EnsureNodesBucket(ctx, d.js, d.cfg.Topology())
	if err != nil {
		return err
	}
	bg, stopBG := context.WithCancel(context.Background())
	defer stopBG()

	d.batch = stats.NewBatcher(d.store, stats.BatcherConfig{MaxBuffer: d.cfg.StatsBuffer})
	d.batch.Start(bg)

	skv, err := topology.EnsureSupersededBucket(ctx, d.js, d.cfg.Topology())
	if err != nil {
		return err
	}
	d.superseded = newSupersededSet(skv, d.log)
	d.goRun(func() { d.superseded.Run(bg) })

	d.reg = registry.New(kv, d.cfg.NodeTTL, d.log)
	d.goRun(func() { _ = d.reg.Run(bg) })
	select { // the bucket's current contents, so the first decisions see every node
	case <-d.reg.Ready():
	case <-time.After(2 * time.Second):
	case <-ctx.Done():
	}
	d.refresh(ctx)
	d.goRun(func() { d.snapshotLoop(bg) })
	settled := make(chan struct{})
	go func() { defer close(settled); d.settleLoop() }()
	d.goRun(func() { d.sweepLoop(bg) })
	d.goRun(func() { d.backlogLoop(bg) })
	d.startDashboard(bg)

	admin, err := d.serveAdmin()
	if err != nil {
		return err
	}
	defer admin.Unsubscribe()
	cancelSub, err := d.serveCancel()
	if err != nil {
		return err
	}
	defer cancelSub.Unsubscribe()

	tasks := d.newConsumer(topology.StreamTasks, d.handleTask)
	outcomes := d.newConsumer(topology.StreamOutcomes, d.handleOutcome)
	consumeCtx, stopConsume := context.WithCancel(context.Background())
	var cwg sync.WaitGroup
	errs := make(chan error, 2)
	for _, c := range []*consumer{tasks, outcomes} {
		cwg.Add(1)
		go func() { defer cwg.Done(); errs <- c.run(consumeCtx) }()
	}
	d.live.Store(true)
	d.log.Info().Str("store", d.kind).Str("policy", d.cfg.Policy).Msg("dispatcher started")

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errs:
	}
	d.live.Store(false)
	d.log.Info().Msg("dispatcher draining")
	stopConsume()
	cwg.Wait()
	close(d.pending) // every handler has returned: no more sends
	<-settled        // every publish in flight has settled its message
	stopBG()
	d.wg.Wait()
	flush, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d.batch.Stop(flush)
	d.log.Info().Msg("dispatcher stopped")
	if errors.Is(runErr, context.Canceled) {
		runErr = nil
	}
	return runErr
}

func (d *Dispatcher) goRun(f func()) {
	d.wg.Add(1)
	go func() { defer d.wg.Done(); f() }()
}

// Config returns the dispatcher's configuration (defaults applied).
func (d *Dispatcher) Config() Config { return d.cfg }

package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/mlsched/mlsched/dispatcher/internal/admission"
	"github.com/mlsched/mlsched/dispatcher/internal/budget"
	"github.com/mlsched/mlsched/dispatcher/internal/finish"
	"github.com/mlsched/mlsched/dispatcher/internal/intake"
	"github.com/mlsched/mlsched/dispatcher/internal/loadshare"
	"github.com/mlsched/mlsched/dispatcher/internal/outcome"
	"github.com/mlsched/mlsched/dispatcher/internal/quota"
	"github.com/mlsched/mlsched/dispatcher/internal/registry"
	"github.com/mlsched/mlsched/dispatcher/stats"
	"github.com/mlsched/mlsched/shared/jsplumb"
	"github.com/mlsched/mlsched/shared/lifecycle"
	"github.com/mlsched/mlsched/shared/opshttp"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// The wiring, in three parts that run calls in order: openGround opens what
// every component stands on (streams, store, buckets, the seal key), wire
// builds each component from what it needs, and components lists them in
// the order they start (serve stops them in reverse).

// ground is what the components stand on, opened with retries before any
// is built.
type ground struct {
	nc                       *nats.Conn
	js                       jetstream.JetStream
	dispatch, results, tasks jetstream.Stream
	store                    stats.Store
	kind                     string                // "redis" or "memory"
	rc                       redis.UniversalClient // nil without Redis
	nodes, superseded, rolls jetstream.KeyValue
	pipeline                 jetstream.KeyValue // ensemble members' outputs
	seals                    *sealer            // seals dispatches under the key every replica shares (trust.go)
}

// openGround opens the streams, the statistics store, the buckets and the
// seal key. On a cluster a stream or bucket may still be electing its
// leader (its reads get no responders): each waits, with retries.
func (d *Dispatcher) openGround(ctx context.Context, g *ground) error {
	if err := jsplumb.Retry(ctx, d.log, "streams", func(ctx context.Context) (err error) {
		for _, s := range []struct {
			to   *jetstream.Stream
			name string
		}{{&g.dispatch, topology.StreamDispatch}, {&g.tasks, topology.StreamTasks}, {&g.results, topology.StreamResults}} {
			if *s.to, err = g.js.Stream(ctx, s.name); err != nil {
				return fmt.Errorf("stream %s: %w", s.name, err)
			}
		}
		return nil
	}); err != nil {
		return err
	}
	var err error
	if g.store, g.kind, g.rc, err = d.openStore(ctx); err != nil {
		return err
	}
	err = jsplumb.Retry(ctx, d.log, "buckets", func(ctx context.Context) (err error) {
		if g.nodes, err = topology.EnsureNodesBucket(ctx, g.js, d.cfg.Topology()); err != nil {
			return err
		}
		if g.rolls, err = topology.EnsureRolloutsBucket(ctx, g.js, d.cfg.Topology()); err != nil {
			return err
		}
		if g.pipeline, err = topology.EnsurePipelineBucket(ctx, g.js, d.cfg.Topology()); err != nil {
			return err
		}
		g.superseded, err = topology.EnsureSupersededBucket(ctx, g.js, d.cfg.Topology())
		return err
	})
	if err == nil {
		err = jsplumb.Retry(ctx, d.log, "seal key", func(ctx context.Context) error {
			pkv, err := topology.EnsureDispatcherBucket(ctx, g.js, d.cfg.Topology())
			if err != nil {
				return err
			}
			key, err := loadSealKey(ctx, pkv)
			if err == nil {
				g.seals = newSealer(key)
			}
			return err
		})
	}
	if err != nil {
		g.store.Close()
		if g.rc != nil {
			g.rc.Close()
		}
	}
	return err
}

// wiring is every component run builds (a record: wire fills it,
// components lists it).
type wiring struct {
	batch             *stats.Batcher
	superseded        *supersededSet // superseded attempts and cancelled tasks
	reg               *registry.Registry
	snaps             *refresher
	share             *loadshare.Sharer
	rolls             *rollouts
	pub, resPub       *jsplumb.Publisher
	sweep             *sweeper
	complete          *jsplumb.Completer
	prune             *taskPruner
	keeper            *taskKeeper
	resGroup, parkGrp lifecycle.Service
	in                *intake.Stage
	adm               *admission.Stage
	out               *outcome.Stage
	cn                *canceller
	backlog           *backlogSampler
	streams           *streamSampler
	bands             [len(topology.Bands)]*jsplumb.Consumer // band 0 first
	outcomes          *jsplumb.Consumer
}

// wire builds the components, each from what it needs.
func (d *Dispatcher) wire(g *ground) (*wiring, error) {
	w := &wiring{}
	w.batch = stats.NewBatcher(g.store, stats.BatcherConfig{MaxBuffer: d.cfg.StatsBuffer})
	w.superseded = newSupersededSet(g.superseded, d.log)
	w.reg = registry.New(g.nodes, d.cfg.NodeTTL, d.log)
	w.snaps = &refresher{store: g.store, engine: d.engine, reg: w.reg, interval: d.cfg.SnapshotInterval, log: d.log}
	// every replica's tables count every replica's dispatches and settled
	// outcomes, not only their own (internal/loadshare)
	w.share = loadshare.New(loadshare.Params{NC: g.nc, Tables: w.snaps, Log: d.log.With().Str("component", "loadshare").Logger()})
	w.snaps.share = w.share.Note
	w.rolls = newRollouts(g.rolls, d.engine, w.snaps.breakerOpen, rolloutFlush, d.log.With().Str("component", "rollouts").Logger())
	// Dispatches and results each have a publisher with room of its own: a
	// backlog of dispatches awaiting their acknowledgements must not hold
	// back the results that finish tasks.
	w.pub = jsplumb.NewPublisher(g.nc, jsplumb.PublisherConfig{MaxPending: d.cfg.MaxInFlight, Timeout: 10 * time.Second})
	w.resPub = jsplumb.NewPublisher(g.nc, jsplumb.PublisherConfig{MaxPending: d.cfg.MaxInFlight, Timeout: 10 * time.Second})
	dlq := &finish.DeadLetters{JS: g.js, Log: d.log, Count: &d.counters.DeadLettered,
		OnStored: func(kind string) { d.metrics.dead.Get(kind).Inc() }}
	w.sweep = &sweeper{js: g.js, dispatch: g.dispatch, results: g.results, dlq: dlq, live: w.reg.Live, nodes: g.nodes, ttl: d.cfg.NodeTTL,
		every: d.cfg.SweepInterval, slack: d.cfg.DeadlineSlack, log: d.log,
		created:    g.dispatch.CachedInfo().Created, // a loss before the first sweep is seen too
		reconnects: func() uint64 { return g.nc.Stats().Reconnects }}
	// complete is publish-then-ack, the one place a consumed message is
	// settled.
	w.complete = &jsplumb.Completer{NakDelay: time.Second}
	w.prune = newTaskPruner(g.js, d.log)
	w.complete.Acked = w.prune.noteAcked
	w.keeper = newTaskKeeper(g.nc, w.complete, d.cfg.AckWait, lostGrace(d.cfg.SweepInterval)+d.cfg.SweepInterval)
	w.sweep.onRecreated = func(ctx context.Context, created time.Time) {
		n, err := recordLost(ctx, w.keeper, w.superseded, created)
		ev := d.log.Warn()
		if err != nil {
			ev = d.log.Error().Err(err)
		}
		ev.Int("attempts", n).Msg("the attempt streams were re-created (a nats-server restart): recorded the attempts dispatched here before, so that their tasks go on from them")
	}
	if err := d.wireStages(g, w, dlq); err != nil {
		return nil, err
	}
	d.wireConsumers(g, w)
	return w, nil
}

// wireStages builds the stages: intake (with admission and parking), the
// outcome stage and finish, and the canceller and samplers beside them.
func (d *Dispatcher) wireStages(g *ground, w *wiring, dlq *finish.DeadLetters) error {
	flow, err := parseFlowRules(&d.cfg)
	if err != nil {
		return err
	}
	limiter := quota.New(quota.Params{Rates: flow.rates, Caps: flow.caps, Redis: g.rc, Replica: d.cfg.Name})
	var budgets *budget.Ledger
	if len(flow.budgets) > 0 {
		budgets = budget.New(budget.Params{Budgets: flow.budgets, Redis: g.rc, Replicas: limiter.Replicas})
	}
	// Results on disk are group-committed: those published while the
	// stream is busy are stored as one batch, with one fsync. So are parked
	// tasks: a flooding tenant's are parked by the thousand a second, and a
	// store that fsyncs each one on its own delays every other tenant's
	// delivery from the same stream.
	results, resGroup := groupCommit(d.cfg, w.resPub, g.results)
	parked, parkGroup := groupCommit(d.cfg, w.pub, g.tasks)
	w.resGroup, w.parkGrp = resGroup, parkGroup
	fin := finish.New(finish.Params{Log: d.log, Results: results, ResPub: w.resPub, Complete: w.complete, DLQ: dlq,
		ResultsStream: g.results, Counts: &d.counters.Counts, Metrics: d.metrics, Tracer: d.tracer, Quota: limiter,
		Keeper: w.keeper, Pipelines: pipelineSeal{s: g.seals, kv: g.pipeline}})
	nc := g.nc
	w.adm = admission.New(admission.Params{Config: d.cfg.admission(), Log: d.log, Engine: d.engine, Tables: w.snaps,
		Reg: w.reg, Pub: w.pub, Complete: w.complete, Batch: w.batch, Sealer: g.seals, Superseded: w.superseded,
		Keeper: w.keeper, Fin: fin, Counters: &d.counters.Tallies, Metrics: d.metrics, Tracer: d.tracer, Rules: flow,
		Quota: limiter, Budgets: budgets, Reconnects: func() uint64 { return nc.Stats().Reconnects }})
	w.in = intake.New(intake.Params{Limits: d.cfg.Limits(), MaxAttempts: d.cfg.MaxAttempts, AckWait: d.cfg.AckWait,
		Log: d.log, Admission: w.adm, Fin: fin, Complete: w.complete, Pipelines: pipelineSeal{s: g.seals, kv: g.pipeline}, Tracer: d.tracer,
		Superseded: w.superseded, Metrics: d.metrics, Lost: &d.counters.Lost, Parked: &d.counters.Parked,
		Parking: intake.Parking{Above: min(d.cfg.ParkAbove, d.cfg.MaxInFlight/2), JS: g.js, Pub: parked,
			Log: d.log.With().Str("component", "parking").Logger()}})
	w.prune.parked = w.in.Parked
	w.share.Freed = w.adm.Wake // another replica's outcomes free slots too
	w.out = outcome.New(outcome.Params{Rules: d.cfg.Retry(), Limits: d.cfg.Limits(), AckWait: d.cfg.AckWait, Log: d.log,
		NC: nc, Complete: w.complete, Batch: w.batch, Sealer: g.seals, Pipelines: pipelineSeal{s: g.seals, kv: g.pipeline},
		Superseded: w.superseded, Keeper: w.keeper, Retry: w.adm, Fin: fin, Counts: &d.counters.Counters,
		Observer: attemptObserver{metrics: d.metrics, snaps: w.snaps, rolls: w.rolls}, Expiry: flow.Expiry})
	w.cn = &canceller{cfg: d.cfg, log: d.log, nc: nc, js: g.js, results: g.results, superseded: w.superseded,
		counters: &d.counters, metrics: d.metrics}
	w.backlog = &backlogSampler{js: g.js, reg: w.reg, log: d.log, prune: w.prune}
	w.streams = &streamSampler{js: g.js, log: d.log}
	return nil
}

// wireConsumers builds the consumers that feed the stages: one task
// consumer per priority band, band 0 first (it narrows the unfiltered
// consumer of an earlier version, which the others' filters would overlap:
// topology.BandConsumer), and the outcome consumer.
func (d *Dispatcher) wireConsumers(g *ground, w *wiring) {
	for i, band := range []int{topology.BandNormal, topology.BandHigh, topology.BandLow} {
		w.bands[i] = newTaskConsumer(g.js, d.cfg, d.log, band, w.in.HandleTask)
	}
	w.outcomes = newConsumer(g.js, d.cfg, d.log, topology.StreamOutcomes, w.out.HandleOutcome)
	// The attempt streams are memory-backed by default, and a single
	// nats-server restarted has lost them: the outcome consumer notices
	// and re-creates both (their tasks are still in MLSCHED_TASKS).
	w.outcomes.Recreate = func(ctx context.Context) error {
		for _, sc := range topology.Streams(d.cfg.Topology()) {
			if topology.IsAttemptStream(sc.Name) {
				if _, err := topology.EnsureStream(ctx, g.js, sc); err != nil {
					return err
				}
			}
		}
		return nil
	}
}

// component is one part of a running dispatcher, named for its errors.
type component struct {
	name string
	s    lifecycle.Service
}

// components lists the components in the order they start; they stop in
// reverse.
func (d *Dispatcher) components(g *ground, w *wiring, batchCtx context.Context) []component {
	return []component{
		{"statistics batcher", batcherService(batchCtx, w.batch)}, // flushed at Stop
		{"superseded set", w.superseded},
		{"node registry", registryService(w.reg)},
		{"snapshot refresher", w.snaps},
		{"load share", w.share.Service()},
		// before the stages: the first decisions obey the rollouts' caps
		{"rollouts", w.rolls},
		// stopped after everything that dispatches or settles outcomes: their
		// Stop waits for the dispatches and results in flight, which settle
		// their messages
		{"dispatch publisher", &lifecycle.Func{OnStart: w.pub.Start, OnStop: w.pub.Stop}},
		{"result publisher", &lifecycle.Func{OnStart: w.resPub.Start, OnStop: w.resPub.Stop}},
		{"result group commit", w.resGroup},
		{"parking group commit", w.parkGrp},
		// waits for the slow follow-ups of results (an exhausted task's dead
		// letter), which settle their messages
		{"completer", &lifecycle.Func{OnStop: func() error { w.complete.Wait(); return nil }}},
		{"sweeper", w.sweep},
		{"task pruner", loop(w.prune.run)},
		{"task keeper", loop(w.keeper.run)},
		{"backlog sampler", loop(w.backlog.run)},
		{"stream sampler", loop(w.streams.run)},
		{"dashboard", loop(func(ctx context.Context) { d.runDashboard(ctx, g.nc, g.js) })},
		{"admin", subscription(func() (*nats.Subscription, error) { return serveAdmin(g.nc, d.Report) })},
		{"cancel", subscription(w.cn.serve)},
		// after the completer (a held task's dispatch settles through it),
		// before the consumers (which hold tasks): stopping, it naks them
		{"hold room", w.adm.HoldService()},
		{"unserved room", w.adm.UnservedService()},
		// after the rooms (a check's task may wait in one), before the
		// consumers: stopping, it waits for the lookups under way
		{"redelivery checks", w.in.RedeliveryService()},
		// before the task consumer: a dispatch's report finds a replica
		{"direct reports", w.out.ReportsService()},
		// the parked tasks' consumers, stopped before the hold room
		{"parked tasks", w.in.ParkingService()},
		{"task consumer", w.bands[0]},
		{"task consumer (high band)", w.bands[1]},
		{"task consumer (low band)", w.bands[2]},
		{"outcome consumer", w.outcomes},
	}
}

// serve starts the components in order, runs until ctx ends or a consumer
// cannot go on, then stops them in reverse: the consumers drain, every
// publish in flight settles its message, then the loops stop and the
// statistics are flushed.
func (d *Dispatcher) serve(ctx context.Context, cs []component, w *wiring) error {
	var g lifecycle.Group
	for _, c := range cs {
		if err := g.Start(ctx, c.name, c.s); err != nil {
			return errors.Join(err, g.Stop())
		}
	}
	d.live.Store(true)
	d.log.Info().Str("store", d.parts.Load().kind).Str("policy", d.cfg.Policy).Msg("dispatcher started")
	select {
	case <-ctx.Done():
	case <-w.bands[0].Done(): // a consumer ends on its own only when it cannot go on
	case <-w.bands[1].Done():
	case <-w.bands[2].Done():
	case <-w.outcomes.Done():
	}
	d.live.Store(false)
	d.log.Info().Msg("dispatcher draining")
	err := g.Stop()
	if err != nil {
		d.log.Error().Err(err).Msg("dispatcher stopped with errors")
	} else {
		d.log.Info().Msg("dispatcher stopped")
	}
	return err
}

// batcherService runs the statistics batcher; Stop flushes it, reporting
// what could not be written.
func batcherService(ctx context.Context, batch *stats.Batcher) lifecycle.Service {
	return &lifecycle.Func{
		OnStart: func(context.Context) error { batch.Start(ctx); return nil },
		OnStop: func() error {
			flush, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			return batch.Stop(flush)
		}}
}

// registryService runs the node registry, started once the bucket's
// contents are loaded (or after 2s), so that the first decisions see every
// node.
func registryService(reg *registry.Registry) lifecycle.Service {
	return lifecycle.Run(func(ctx context.Context, ready func()) error {
		go func() {
			select {
			case <-reg.Ready():
			case <-time.After(2 * time.Second):
			case <-ctx.Done():
			}
			ready()
		}()
		return reg.Run(ctx)
	})
}

// loop runs f as a component until its context ends.
func loop(f func(context.Context)) lifecycle.Service {
	return lifecycle.Run(func(ctx context.Context, ready func()) error { ready(); f(ctx); return nil })
}

// attemptObserver tells the metrics, the load model and the rollouts of
// each attempt the outcome stage records (outcome.Observer).
type attemptObserver struct {
	metrics *metrics
	snaps   *refresher
	rolls   *rollouts
}

func (a attemptObserver) Observed(o *protocol.Outcome, kind stats.Kind, attempt int) {
	a.metrics.attempts.Get(opshttp.L3{A: o.Model, B: o.Node, C: string(o.Status)}).Inc()
	a.snaps.table.Load().Completed(o.Model, o.Node) // the slot is free: tell the load model now
	a.rolls.observe(o.Model, kind, attempt)
}

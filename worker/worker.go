package worker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/shared/config"
	"github.com/mlsched/mlsched/shared/jsplumb"
	"github.com/mlsched/mlsched/shared/lifecycle"
	"github.com/mlsched/mlsched/shared/natsconn"
	"github.com/mlsched/mlsched/shared/opshttp"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
	"github.com/mlsched/mlsched/shared/tracing"
	"github.com/mlsched/mlsched/worker/executor"
	"github.com/mlsched/mlsched/worker/model"
)

// ErrRunning is returned by a second concurrent Run.
var ErrRunning = errors.New("worker is already running")

// errShutdown is the cancel cause of tasks still running when the shutdown
// grace ends: they are nak'ed, not reported.
var errShutdown = errors.New("worker shut down before the task finished")

// Option customises New.
type Option func(*Worker)

// WithConn reuses a NATS connection (it is not closed by Run).
func WithConn(nc *nats.Conn) Option { return func(w *Worker) { w.nc = nc } }

// WithModels hosts these models instead of reading Config.ModelsFile.
func WithModels(specs []ModelSpec) Option {
	return func(w *Worker) { w.specs = append([]ModelSpec(nil), specs...); w.specsSet = true }
}

// WithHandler registers a Go handler under name, for models with
// executor "go" and go.handler name. It replaces a built-in of that name.
func WithHandler(name string, h Handler) Option {
	return func(w *Worker) { w.handlers[name] = h }
}

// WithBatchHandler registers the batch variant of the Go handler name:
// a batching model (batch: in its spec) with go.handler name runs each of
// its batches in one call of h. Without one, a batching go model runs each
// task of a batch on its handler.
func WithBatchHandler(name string, h BatchHandler) Option {
	return func(w *Worker) { w.batchHandlers[name] = h }
}

// WithLogger sets the logger (default: built from Config.Log).
func WithLogger(l zerolog.Logger) Option { return func(w *Worker) { w.log = l; w.logSet = true } }

// Worker is one node. Create it with New and start it with Run.
type Worker struct {
	cfg      Config
	node     string
	log      zerolog.Logger
	logSet   bool
	specs    []ModelSpec
	specsSet bool
	handlers map[string]Handler
	// batchHandlers are the batch variants of handlers, by the same names.
	batchHandlers map[string]BatchHandler
	nc            *nats.Conn

	running  atomic.Bool
	admit    sync.Mutex // orders tasks.Add before the shutdown's Wait
	inFlight atomic.Int64
	// waiting counts dispatches received and waiting for a slot.
	waiting  atomic.Int64
	draining atomic.Bool

	// set by Run
	// complete settles every dispatch: the one place the worker acks,
	// naks or keeps one in progress (publish-then-ack, shared/jsplumb).
	complete  *jsplumb.Completer
	outcomes  *outcomePublisher
	unstored  *unreported // outcomes not stored, reported again on redelivery
	delivered *deliveries // the dispatches the node has: a redelivery is not run again (redelivered.go)
	models    map[string]*hosted
	tasks     sync.WaitGroup // each dispatch from delivery until its goroutine ends (task.go); its outcome then counts in outcomes
	slots     *slots
	batchers  sync.WaitGroup // each batching model's batcher.run
	taskCtx   context.Context
	cancelRun context.CancelCauseFunc

	metrics  *metrics
	tracer   *tracing.Tracer
	liveConn atomic.Pointer[conns] // set while consuming, for /readyz
	httpMu   sync.Mutex
	http     *opshttp.Server
}

// hosted is a model this node runs.
type hosted struct {
	spec    ModelSpec
	exec    executor.Executor
	timeout time.Duration
	// limit holds a token per running task when the model has its own
	// max_concurrency (nil otherwise); inFlight counts its tasks running or
	// waiting for a slot, as announced.
	limit    chan struct{}
	inFlight atomic.Int64
	// meanRun is the moving mean of the model's successful runs here (ns;
	// 0 until the first), by which a dispatch too close to its deadline is
	// not started (task.go). A batching model's is its batches' mean run.
	meanRun atomic.Int64
	// batch gathers the model's dispatches into batches (batch.go); nil
	// when the model does not batch.
	batch *batcher
}

// observeRun folds a successful run's duration into the mean (weight 1/8).
func (h *hosted) observeRun(d time.Duration) {
	for {
		old := h.meanRun.Load()
		next := int64(d)
		if old > 0 {
			next = old + (int64(d)-old)/8
		}
		if h.meanRun.CompareAndSwap(old, next) {
			return
		}
	}
}

// typicalRun is the mean of the model's successful runs here (0: none yet).
func (h *hosted) typicalRun() time.Duration { return time.Duration(h.meanRun.Load()) }

// New validates the configuration and the models. It does not connect.
func New(cfg Config, opts ...Option) (*Worker, error) {
	if !cfg.loaded {
		if err := config.FillZero(&cfg); err != nil { // zero fields take their defaults, as from an empty environment
			return nil, err
		}
	}
	if cfg.NATS.PoolKey != "" {
		// A pool member's node id is the public key of the user key it
		// makes for itself: the server binds its permissions to that key,
		// so the id cannot be another's (natsconn/pool.go).
		if cfg.NodeID != "" {
			return nil, fmt.Errorf("%s_NODE_ID=%q cannot be set with %s_NATS_POOL_KEY: a pool member's node id is its own user key",
				config.Prefix, cfg.NodeID, config.Prefix)
		}
		id, err := cfg.NATS.PoolIdentity()
		if err != nil {
			return nil, fmt.Errorf("%s_NATS_POOL_KEY: %w", config.Prefix, err)
		}
		cfg.NodeID = id
	}
	if cfg.NodeID == "" {
		cfg.NodeID = hostNodeID()
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	w := &Worker{cfg: cfg, node: cfg.NodeID, handlers: executor.Builtins(), batchHandlers: executor.BatchBuiltins(), unstored: newUnreported(),
		delivered: newDeliveries()}
	w.metrics = newMetrics(w)
	var err error
	if w.tracer, err = tracing.New(tracing.Config{Endpoint: cfg.OTelEndpoint, Service: "mlsched-worker", Instance: cfg.NodeID}); err != nil {
		return nil, err
	}
	for _, o := range opts {
		o(w)
	}
	if !w.logSet {
		l, err := cfg.Log.Logger("worker")
		if err != nil {
			return nil, err
		}
		w.log = l
	}
	w.log = w.log.With().Str("node", w.node).Logger()
	if !w.specsSet {
		specs, err := model.LoadFile(cfg.ModelsFile)
		if err != nil {
			return nil, fmt.Errorf("%s_MODELS_FILE=%q: %w", config.Prefix, cfg.ModelsFile, err)
		}
		w.specs = specs
	} else if err := model.Validate(w.specs); err != nil {
		return nil, err
	} else {
		w.specs = model.Qualify(w.specs)
	}
	for _, s := range w.specs {
		if s.Executor == model.ExecutorGo {
			if _, ok := w.handlers[s.Go.Handler]; !ok {
				return nil, fmt.Errorf("%w: model %q: go.handler: %q is not registered", model.ErrInvalid, s.Name, s.Go.Handler)
			}
		}
	}
	return w, nil
}

// PoolConsumerInactive is how long a pool member's dispatch consumer
// outlives its last pull.
const PoolConsumerInactive = time.Hour

func poolConsumerInactive(pool bool) time.Duration {
	if pool {
		return PoolConsumerInactive
	}
	return 0
}

// Node returns the node id.
func (w *Worker) Node() string { return w.node }

// queued returns how the heartbeat reads the work sent to the node and not
// started: dispatches waiting in the node's stream (its consumer's pending
// count) plus those received and waiting for a slot.
func (w *Worker) queued(js jetstream.JetStream, durable string) func(context.Context) int {
	return func(ctx context.Context) int {
		n := w.waiting.Load()
		if c, err := js.Consumer(ctx, topology.StreamDispatch, durable); err == nil { // one info request
			if ci := c.CachedInfo(); ci != nil {
				n += int64(ci.NumPending)
			}
		}
		return int(max(n, 0))
	}
}

// InFlight returns how many tasks are running.
func (w *Worker) InFlight() int { return int(w.inFlight.Load()) }

// Models returns what the node announces: its models, less those not ready
// while it runs.
func (w *Worker) Models() []protocol.ModelInfo { return w.announced() }

func (w *Worker) topology() topology.Config {
	return w.cfg.Shared.Config()
}

// Run connects, makes sure the topology exists, announces the node and
// processes dispatches until ctx ends. It then drains: the node is marked
// draining, pulling stops, in-flight tasks get ShutdownGrace to finish and
// be reported (the rest are nak'ed for redelivery), and the heartbeat is
// deleted. It returns nil after a graceful shutdown, or the error that kept
// the node from starting (e.g. topology.ErrIncompatible).
func (w *Worker) Run(ctx context.Context) error {
	if !w.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer w.running.Store(false)
	w.draining.Store(false)

	// The components, started in order and stopped in reverse (the
	// dispatcher's lifecycle): the node drains first, then the task
	// context ends, the executors close, the outcomes in flight settle
	// their dispatches, and the connection drains.
	var g lifecycle.Group
	start := func(name string, s lifecycle.Service) error {
		if err := g.Start(ctx, name, s); err != nil {
			return errors.Join(startErr(ctx, err), g.Stop())
		}
		return nil
	}
	var stopHTTP func()
	var nc *nats.Conn
	var js jetstream.JetStream
	if err := start("http", &lifecycle.Func{
		OnStart: func(context.Context) (err error) { stopHTTP, err = w.startHTTP(); return err },
		OnStop:  func() error { stopHTTP(); return nil }}); err != nil {
		return err
	}
	if err := start("tracer", &lifecycle.Func{OnStop: func() error { // spans not exported yet
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return w.tracer.Shutdown(ctx)
	}}); err != nil {
		return err
	}
	if err := start("connection", &lifecycle.Func{
		OnStart: func(context.Context) (err error) {
			nc = w.nc
			own := nc == nil
			if own {
				if nc, err = natsconn.ConnectContext(ctx, w.cfg.NATS, natsconn.Conn{ // waits for a server at start
					Name: "mlsched-worker-" + w.node, Inbox: natsconn.InboxNode(w.node), Log: &w.log, Retry: true,
				}, nats.ReconnectWait(500*time.Millisecond)); err != nil {
					return err
				}
			}
			if js, err = jetstream.New(nc, jetstream.WithPublishAsyncTimeout(w.cfg.PublishTimeout)); err != nil {
				if own {
					nc.Close()
				}
				return fmt.Errorf("jetstream: %w", err)
			}
			return nil
		},
		OnStop: func() error {
			if w.nc == nil { // ours: what is buffered goes out first
				_ = nc.Drain()
			}
			return nil
		}}); err != nil {
		return err
	}
	// Outcomes in flight count, in the outcome publisher, until their
	// dispatch is acked, so that a shutdown waits for them. MaxAckPending
	// already bounds them by Concurrency + Prefetch; the window makes the
	// bound explicit. Only the publisher's stored publishes settle through
	// the Completer's callback: its Settled hook is theirs.
	w.complete = &jsplumb.Completer{NakDelay: nakDelay, Settled: func() { w.outcomes.settled() },
		Failed: func(op string, err error) { w.log.Warn().Err(err).Str("op", op).Msg("settling a dispatch failed") }}
	if err := start("outcome publisher", &lifecycle.Func{
		OnStart: func(ctx context.Context) (err error) {
			w.outcomes, err = newOutcomePublisher(ctx, nc, w.complete, w.unstored, w.delivered, w.pull(), w.cfg.PublishTimeout,
				!w.cfg.StoredOutcomesOnly)
			return err
		},
		OnStop: func() error { w.outcomes.close(); return nil }}); err != nil {
		return err
	}
	kv, err := w.awaitTopology(ctx, js)
	if err == nil {
		err = jsplumb.Retry(ctx, w.log, "dispatch stream", func(ctx context.Context) error {
			_, err := js.Stream(ctx, topology.StreamDispatch)
			if err != nil {
				err = fmt.Errorf("stream %s: %w", topology.StreamDispatch, err)
			}
			return err
		})
	} else {
		err = fmt.Errorf("topology: %w", err)
	}
	if err != nil {
		return errors.Join(startErr(ctx, err), g.Stop())
	}

	poke := make(chan struct{}, 1)
	pokeReadiness := func() {
		select {
		case poke <- struct{}{}:
		default:
		}
	}
	if err := start("executors", &lifecycle.Func{
		OnStart: func(context.Context) error { return w.openExecutors(pokeReadiness) },
		OnStop:  func() error { w.closeExecutors(); return nil }}); err != nil {
		return err
	}
	// Tasks run under their own context, cancelled only when the shutdown
	// grace ends, so that in-flight work survives ctx's cancellation.
	if err := start("task context", &lifecycle.Func{
		OnStart: func(context.Context) error {
			w.taskCtx, w.cancelRun = context.WithCancelCause(context.WithoutCancel(ctx))
			w.slots = newSlots(w.cfg.Concurrency)
			for _, h := range w.models {
				if h.batch != nil {
					w.batchers.Go(func() { h.batch.run(w.taskCtx) })
				}
			}
			return nil
		},
		OnStop: func() error { w.cancelRun(nil); w.batchers.Wait(); return nil }}); err != nil {
		return err
	}
	if err := start("node", w.nodeService(js, kv, poke)); err != nil {
		return err
	}
	w.liveConn.Store(&conns{nc: nc, js: js})
	ev := w.log.Info().Int("concurrency", w.cfg.Concurrency).Int("models", len(w.specs))
	if un := w.unready(); len(un) > 0 {
		names := make([]string, len(un))
		for i, u := range un {
			names[i] = u.Name
		}
		ev = w.log.Warn().Int("concurrency", w.cfg.Concurrency).Int("models", len(w.specs)).
			Int("ready", len(w.specs)-len(un)).Strs("unready", names)
	}
	ev.Msg("worker started")

	<-ctx.Done()
	w.liveConn.Store(nil)
	if err := g.Stop(); err != nil {
		w.log.Warn().Err(err).Msg("worker stopped with errors")
	}
	return nil
}

// pull is how many dispatches the node holds at once: its slots and its
// prefetch, and room for every slot a batching model can use to hold a
// full batch (max_size - 1 more tasks each), else its batches could never
// fill past the prefetch.
func (w *Worker) pull() int {
	extra := 0
	for _, s := range w.specs {
		if b := s.BatchSize(); b > 1 {
			slots := w.cfg.Concurrency
			if l := s.Limit(); l > 0 && l < slots {
				slots = l
			}
			extra = max(extra, slots*(b-1))
		}
	}
	return w.cfg.Concurrency + w.cfg.Prefetch + extra
}

// openExecutors builds one executor per hosted model.
func (w *Worker) openExecutors(pokeReadiness func()) error {
	w.models = map[string]*hosted{}
	for _, s := range w.specs {
		ex, err := executor.New(s, executor.Options{Handlers: w.handlers, BatchHandlers: w.batchHandlers, Seed: w.cfg.SimSeed, Log: w.log,
			Concurrency: w.cfg.Concurrency, ReadinessChanged: pokeReadiness})
		if err != nil {
			w.closeExecutors()
			return err
		}
		ex = newGate(ex, pokeReadiness)
		t := s.Timeout.D()
		if t <= 0 {
			t = w.cfg.DefaultTimeout
		}
		h := &hosted{spec: s, exec: ex, timeout: t}
		if n := s.Limit(); n > 0 {
			h.limit = make(chan struct{}, n)
		}
		if s.BatchSize() > 0 {
			h.batch = newBatcher(w, h)
		}
		w.models[s.Name] = h
	}
	return nil
}

// nodeService consumes the node's dispatches and announces the node, only
// once it consumes, with the models ready by then. Stopping drains the
// node (shutdown), then stops the heartbeat and deletes it.
func (w *Worker) nodeService(js jetstream.JetStream, kv jetstream.KeyValue, poke chan struct{}) lifecycle.Service {
	cons := &jsplumb.Consumer{JS: js, Stream: topology.StreamDispatch, Handle: w.onMessage,
		Config: jetstream.ConsumerConfig{
			Durable:       topology.NodeConsumer(w.node),
			FilterSubject: topology.DispatchSubject(w.node),
			AckPolicy:     jetstream.AckExplicitPolicy,
			AckWait:       w.cfg.AckWait,
			MaxAckPending: w.pull(),
			MaxDeliver:    -1,
			// A pool member's consumer belongs to an identity that dies
			// with its process (natsconn/pool.go): the server deletes it an
			// hour after its last pull, instead of keeping a durable for
			// every container ever started. A named node's stays.
			InactiveThreshold: poolConsumerInactive(w.cfg.NATS.PoolKey != ""),
		},
		// It never has more than Concurrency + Prefetch messages outstanding.
		Pull: w.pull(), Expiry: consumerExpiry, Heartbeat: consumerHeartbeat, Check: consumerCheck,
		Log: w.log.With().Str("consumer", topology.NodeConsumer(w.node)).Logger(),
		// A memory-backed dispatch stream is gone after a restart of a
		// single server: re-create it (on a node key the server may refuse,
		// and a dispatcher re-creates it).
		Recreate: func(ctx context.Context) error {
			for _, sc := range topology.Streams(w.topology()) {
				if sc.Name == topology.StreamDispatch {
					_, err := topology.EnsureStream(ctx, js, sc)
					return err
				}
			}
			return nil
		}}
	hb := &heartbeat{kv: kv, node: w.node, every: w.cfg.HeartbeatInterval, models: w.announced, unready: w.unready, kick: make(chan struct{}, 1),
		capacity: w.cfg.Concurrency, prefetch: w.cfg.Prefetch, inFlight: w.InFlight, queued: w.queued(js, topology.NodeConsumer(w.node)), draining: &w.draining,
		started: time.Now().UTC(), host: hostName(), log: w.log,
		ensure: func(ctx context.Context) (jetstream.KeyValue, error) {
			return topology.EnsureNodesBucket(ctx, js, w.topology())
		}}
	beating := lifecycle.Run(func(ctx context.Context, ready func()) error { ready(); hb.Run(ctx); return nil })
	readiness := lifecycle.Run(func(ctx context.Context, ready func()) error {
		ready()
		w.watchReadiness(ctx, poke, hb)
		return nil
	})
	var g lifecycle.Group
	return &lifecycle.Func{
		OnStart: func(ctx context.Context) error {
			if err := g.Start(ctx, "dispatch consumer", cons); err != nil {
				return err
			}
			w.checkReadiness(ctx)
			if err := g.Start(ctx, "heartbeat", beating); err != nil {
				return errors.Join(err, cons.Stop())
			}
			if err := g.Start(ctx, "readiness", readiness); err != nil {
				return errors.Join(err, g.Stop())
			}
			return nil
		},
		OnStop: func() error {
			w.shutdown(hb, cons)
			err := errors.Join(beating.Stop(), readiness.Stop())
			if err != nil {
				w.log.Warn().Err(err).Msg("stopping the heartbeat")
			}
			dctx, cancel := context.WithTimeout(context.Background(), w.cfg.PublishTimeout)
			defer cancel()
			if err := hb.Remove(dctx); err != nil {
				w.log.Warn().Err(err).Msg("could not delete the node's heartbeat")
			}
			return err
		},
	}
}

// startErr turns a startup failure caused by ctx's end (a shutdown request
// while starting) into a clean stop.
func startErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// shutdown drains the node; see Run.
func (w *Worker) shutdown(hb *heartbeat, cons lifecycle.Service) {
	w.log.Info().Int("in_flight", w.InFlight()).Msg("worker draining")
	w.admit.Lock()
	w.draining.Store(true)
	w.admit.Unlock()
	bctx, cancel := context.WithTimeout(context.Background(), w.cfg.PublishTimeout)
	if err := hb.Beat(bctx); err != nil {
		w.log.Warn().Err(err).Msg("could not announce draining")
	}
	cancel()
	if err := cons.Stop(); err != nil {
		w.log.Warn().Err(err).Msg("stopping the dispatch consumer")
	}

	done := make(chan struct{})
	go func() {
		// Every task's goroutine ends first: none hands the publisher an
		// outcome after.
		w.tasks.Wait()
		w.outcomes.wait()
		close(done)
	}()
	grace := time.NewTimer(w.cfg.ShutdownGrace)
	defer grace.Stop()
	select {
	case <-done:
	case <-grace.C:
		w.log.Warn().Int("in_flight", w.InFlight()).Msg("shutdown grace over: unfinished tasks are nak'ed for redelivery")
		w.cancelRun(errShutdown)
		<-done
	}
	w.log.Info().Msg("worker stopped")
}

func (w *Worker) closeExecutors() {
	for _, h := range w.models {
		if err := h.exec.Close(); err != nil {
			w.log.Warn().Err(err).Str("model", h.spec.Name).Msg("closing model executor")
		}
	}
}

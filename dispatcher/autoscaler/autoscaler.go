// Package autoscaler runs a scaling policy (dispatcher/autoscale) against a
// live cluster: every interval it observes the cluster through NATS (every
// dispatcher replica's report: arrival counts, backlog, model statistics,
// worker heartbeats), asks the backend which pools run how many replicas,
// decides, scales through the backend (unless dry-run), and publishes each
// pool's decision in the MLSCHED_AUTOSCALE bucket (for the dashboard and
// `mlsched top`) and as Prometheus gauges (for KEDA or an HPA to act on).
//
// The backend is an interface: Compose scales compose services with the
// docker compose CLI; Heartbeats only recommends (pools are the sets of
// workers announcing the same models); the replay harness (e2e) starts and
// stops worker processes.
package autoscaler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/dispatcher/autoscale"
	"github.com/mlsched/mlsched/dispatcher/clusterview"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// Backend runs the pools' replicas.
type Backend interface {
	// Name is what the logs and the decisions call it: compose, process,
	// heartbeats.
	Name() string
	// Pools lists the pools it can see and their replicas now. Hosts are
	// the host names of each pool's replicas, as their heartbeats announce
	// them (nil when the backend cannot tell: the heartbeats are then
	// matched by Match).
	Pools(ctx context.Context) ([]BackendPool, error)
	// Scale sets a pool's replicas. A scale-in must stop workers
	// gracefully (SIGTERM: the worker drains, its running tasks finish).
	Scale(ctx context.Context, pool string, replicas int) error
}

// BackendPool is one pool as a backend sees it.
type BackendPool struct {
	Name     string
	Replicas int
	Hosts    []string
	// Match, when set, says whether a heartbeat is one of the pool's
	// workers (instead of Hosts).
	Match func(hb protocol.Heartbeat) bool
}

// ErrCannotScale is returned by a backend that only recommends.
var ErrCannotScale = errors.New("this backend cannot scale (recommendation only)")

// Params configure an Autoscaler.
type Params struct {
	NC      *nats.Conn
	JS      jetstream.JetStream
	Backend Backend
	Policy  autoscale.Policy
	// DryRun decides and publishes, but does not scale; each decision is
	// printed on Out.
	DryRun bool
	Out    io.Writer
	Log    zerolog.Logger
	// Registerer receives the gauges (nil: none).
	Registerer prometheus.Registerer
	// Lag reads the task consumers' pending + ack pending (KEDA's input).
	Lag bool
	// Wait bounds the gathering of the dispatchers' reports (default 2s).
	Wait time.Duration
	// Topology configures the decisions bucket's creation.
	Topology topology.Config
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Autoscaler observes, decides, scales and publishes.
type Autoscaler struct {
	p Params

	kvMu   sync.Mutex // the bucket; never held with mu while waiting on NATS
	kv     jetstream.KeyValue
	loaded bool

	backlog *backlogReader // the unfinished tasks, read at every step

	mu sync.Mutex
	// remembered models of each pool, so that a pool at zero replicas
	// (no heartbeat) can still be woken for its types.
	models map[string][]autoscale.Model
	last   []autoscale.Decision

	gCurrent, gTarget, gNeeded, gHeld *prometheus.GaugeVec
	cScale                            *prometheus.CounterVec
	cErrors                           prometheus.Counter
}

// New makes an Autoscaler.
func New(p Params) (*Autoscaler, error) {
	if p.Backend == nil || p.Policy == nil {
		return nil, errors.New("autoscaler: a backend and a policy are needed")
	}
	if p.Now == nil {
		p.Now = time.Now
	}
	if p.Wait <= 0 {
		p.Wait = 2 * time.Second
	}
	if p.Out == nil {
		p.Out = io.Discard
	}
	a := &Autoscaler{p: p, models: map[string][]autoscale.Model{}, backlog: &backlogReader{js: p.JS, nc: p.NC, log: p.Log}}
	a.gCurrent = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "mlsched_autoscale_replicas",
		Help: "Worker replicas each pool runs now, as the autoscaler's backend reports them."}, []string{"pool"})
	a.gTarget = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "mlsched_autoscale_recommended_replicas",
		Help: "Replicas the autoscaler recommends for each pool now (after rate limits and cooldown): what KEDA or an HPA can act on."}, []string{"pool"})
	a.gNeeded = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "mlsched_autoscale_needed_replicas",
		Help: "Replicas the formula asks for each pool, before rate limits and cooldown."}, []string{"pool"})
	a.gHeld = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "mlsched_autoscale_held",
		Help: "1 while the autoscaler holds a pool's replicas for want of statistics (NATS or every dispatcher unreachable)."}, []string{"pool"})
	a.cScale = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mlsched_autoscale_scalings_total",
		Help: "Scalings the autoscaler made, by pool and direction (up, in)."}, []string{"pool", "direction"})
	a.cErrors = prometheus.NewCounter(prometheus.CounterOpts{Name: "mlsched_autoscale_errors_total",
		Help: "Failed observations, scalings and publications."})
	if p.Registerer != nil {
		for _, c := range []prometheus.Collector{a.gCurrent, a.gTarget, a.gNeeded, a.gHeld, a.cScale, a.cErrors} {
			if err := p.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("autoscaler metrics: %w", err)
			}
		}
	}
	return a, nil
}

// stepTimeout bounds one step of Run.
const stepTimeout = 3 * time.Minute

// Run steps every interval until ctx ends. A failed step is logged and the
// next one tried: nothing is scaled on a step that could not observe.
func (a *Autoscaler) Run(ctx context.Context, interval time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		// A step is bounded: a compose scale-in waits for the workers to
		// drain (stop_grace_period), nothing longer.
		sctx, cancel := context.WithTimeout(ctx, stepTimeout)
		_, err := a.Step(sctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			a.p.Log.Warn().Err(err).Msg("autoscale step failed: holding")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Last is the last step's decisions.
func (a *Autoscaler) Last() []autoscale.Decision {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]autoscale.Decision(nil), a.last...)
}

// Step observes, decides, scales and publishes once. An error from the
// backend's listing ends the step before any decision (the replicas stay
// as they are); statistics that cannot be read make every pool hold.
func (a *Autoscaler) Step(ctx context.Context) ([]autoscale.Decision, error) {
	return a.step(ctx, false)
}

// Warm observes and lets the policy see the observation, without acting,
// printing or publishing: a first observation gives no arrival rate, so a
// one-off decision (mlsched autoscale -once) warms up first.
func (a *Autoscaler) Warm(ctx context.Context) error {
	_, err := a.step(ctx, true)
	return err
}

func (a *Autoscaler) step(ctx context.Context, warm bool) ([]autoscale.Decision, error) {
	pools, err := a.p.Backend.Pools(ctx)
	if err != nil {
		a.cErrors.Inc()
		return nil, fmt.Errorf("list the pools (%s): %w", a.p.Backend.Name(), err)
	}
	obs := a.observe(ctx, pools)
	ds := a.p.Policy.Decide(obs)
	if warm {
		return ds, nil
	}
	for i := range ds {
		d := &ds[i]
		if d.Change() && !a.p.DryRun {
			if err := a.p.Backend.Scale(ctx, d.Pool, d.Target); err != nil {
				a.cErrors.Inc()
				d.Reason += fmt.Sprintf("; scaling failed: %v", err)
				a.p.Log.Warn().Err(err).Str("pool", d.Pool).Int("target", d.Target).Msg("scaling failed")
				d.Target = d.Current
			} else {
				dir := "up"
				if d.Target < d.Current {
					dir = "in"
				}
				a.cScale.WithLabelValues(d.Pool, dir).Inc()
				a.p.Log.Info().Str("pool", d.Pool).Int("from", d.Current).Int("to", d.Target).Str("reason", d.Reason).Msg("scaled")
			}
		}
		a.gCurrent.WithLabelValues(d.Pool).Set(float64(d.Current))
		a.gTarget.WithLabelValues(d.Pool).Set(float64(d.Target))
		a.gNeeded.WithLabelValues(d.Pool).Set(float64(d.Needed))
		held := 0.0
		if d.Held {
			held = 1
		}
		a.gHeld.WithLabelValues(d.Pool).Set(held)
		if a.p.DryRun {
			verb := "keep"
			if d.Change() {
				verb = "would scale"
			}
			fmt.Fprintf(a.p.Out, "%s pool %s: %s %d→%d (needed %d): %s\n", d.At.Format(time.TimeOnly), d.Pool, verb,
				d.Current, d.Target, d.Needed, d.Reason)
		}
	}
	if obs.Missing == "" {
		if err := a.publish(ctx, ds); err != nil {
			a.cErrors.Inc()
			a.p.Log.Debug().Err(err).Msg("publishing the decisions failed")
		}
	}
	a.mu.Lock()
	a.last = ds
	a.mu.Unlock()
	return ds, nil
}

// observe builds the policy's observation from the dispatchers' reports
// and the backend's pools.
func (a *Autoscaler) observe(ctx context.Context, bps []BackendPool) autoscale.Observation {
	now := a.p.Now()
	obs := autoscale.Observation{At: now, Types: map[string]autoscale.TypeLoad{}, Models: map[string]autoscale.ModelStats{}}
	var reports []protocol.StatsReport
	var err error
	if a.p.NC == nil || !a.p.NC.IsConnected() {
		err = errors.New("not connected to NATS")
	} else {
		rctx, cancel := context.WithTimeout(ctx, a.p.Wait)
		reports, _, err = clusterview.Reports(rctx, a.p.NC, 200*time.Millisecond)
		cancel()
	}
	if err == nil && a.p.JS != nil {
		a.loadRemembered(ctx) // once, when the bucket is first reached
	}
	var fresh map[string]int64 // the backlog read now (backlog.go), before any lock is taken
	freshOK := false
	if err == nil {
		fresh, freshOK = a.backlog.read(ctx, typesOf(clusterview.Merge(reports, now).Backlog, reports))
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	hbs := map[string]protocol.Heartbeat{}
	for _, r := range reports {
		for _, hb := range r.Nodes {
			if old, ok := hbs[hb.Node]; !ok || hb.SentAt.After(old.SentAt) {
				hbs[hb.Node] = hb
			}
		}
	}
	for _, bp := range bps {
		p := autoscale.Pool{Name: bp.Name, Current: bp.Replicas}
		hosts := map[string]bool{}
		for _, h := range bp.Hosts {
			hosts[h] = true
		}
		models := map[string]map[string]bool{}
		seen := false
		for _, hb := range hbs {
			mine := hosts[hb.Host] || hosts[hb.HostName()] && hb.HostName() != ""
			if bp.Match != nil {
				mine = bp.Match(hb)
			}
			if !mine || hb.Draining {
				continue
			}
			seen = true
			p.Capacity = max(p.Capacity, hb.Capacity)
			for _, m := range hb.Models {
				if models[m.Name] == nil {
					models[m.Name] = map[string]bool{}
				}
				for _, t := range m.Types {
					models[m.Name][t] = true
				}
			}
		}
		if seen {
			a.models[bp.Name] = toModels(models)
		}
		p.Models = a.models[bp.Name]
		if len(p.Models) == 0 && !seen {
			continue // no worker announced itself: not a worker pool (nats, redis...)
		}
		obs.Pools = append(obs.Pools, p)
	}
	sort.Slice(obs.Pools, func(i, j int) bool { return obs.Pools[i].Name < obs.Pools[j].Name })
	if err != nil {
		obs.Missing = err.Error()
		return obs
	}
	v := clusterview.Merge(reports, now)
	for t, c := range v.Types {
		l := obs.Types[t]
		l.Finished = int64(c.Succeeded + c.Failed + c.Rejected + c.Cancelled)
		obs.Types[t] = l
	}
	backlog := v.Backlog
	if freshOK {
		backlog = fresh
	}
	for t, n := range backlog {
		l := obs.Types[t]
		l.Backlog = n
		obs.Types[t] = l
	}
	// What runs now, per type: each model's in-flight attempts on the
	// live workers, split evenly over the types it serves.
	for _, hb := range hbs {
		for _, m := range hb.Models {
			if m.InFlight <= 0 || len(m.Types) == 0 {
				continue
			}
			for _, t := range m.Types {
				l := obs.Types[t]
				l.Running += int64(m.InFlight / len(m.Types))
				obs.Types[t] = l
			}
		}
	}
	for _, m := range v.Models {
		obs.Models[m.Name] = autoscale.ModelStats{ServiceTime: time.Duration(m.P50Ms * float64(time.Millisecond)),
			SuccessRate: m.SuccessRate, Share: m.TrafficShare}
	}
	if a.p.Lag {
		if err := a.addLag(ctx, &obs); err != nil {
			obs.Missing = "consumer lag: " + err.Error()
		}
	}
	return obs
}

// typesOf is the dispatchers' backlog sample with every type a reported
// worker serves (at 0 where the sample has not listed it yet).
func typesOf(sampled map[string]int64, reports []protocol.StatsReport) map[string]int64 {
	out := make(map[string]int64, len(sampled))
	for t, n := range sampled {
		out[t] = n
	}
	for _, r := range reports {
		for _, hb := range r.Nodes {
			for _, m := range hb.Models {
				for _, t := range m.Types {
					if _, ok := out[t]; !ok {
						out[t] = 0
					}
				}
			}
		}
	}
	return out
}

func toModels(m map[string]map[string]bool) []autoscale.Model {
	out := make([]autoscale.Model, 0, len(m))
	for name, types := range m {
		mm := autoscale.Model{Name: name}
		for t := range types {
			mm.Types = append(mm.Types, t)
		}
		sort.Strings(mm.Types)
		out = append(out, mm)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// addLag reads num_pending + num_ack_pending of the band consumers on
// MLSCHED_TASKS (KEDA's metric) and spreads it over the task types in
// proportion to their backlog (exact with one type).
func (a *Autoscaler) addLag(ctx context.Context, obs *autoscale.Observation) error {
	ctx, cancel := context.WithTimeout(ctx, bucketTimeout)
	defer cancel()
	st, err := a.p.JS.Stream(ctx, topology.StreamTasks)
	if err != nil {
		return err
	}
	var lag int64
	for _, b := range topology.Bands {
		name, _ := topology.BandConsumer(b)
		c, err := st.Consumer(ctx, name)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		info, err := c.Info(ctx)
		if err != nil {
			return err
		}
		lag += int64(info.NumPending) + int64(info.NumAckPending)
	}
	var total int64
	for _, l := range obs.Types {
		total += l.Backlog
	}
	for t, l := range obs.Types {
		if total > 0 {
			l.Lag = lag * l.Backlog / total
		} else if len(obs.Types) == 1 {
			l.Lag = lag
		}
		obs.Types[t] = l
	}
	return nil
}

// KVKey is a pool's key in MLSCHED_AUTOSCALE: the name with every
// character a key may not hold replaced by '_'.
func KVKey(pool string) string {
	b := []byte(pool)
	for i, c := range b {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '='
		if !ok {
			b[i] = '_'
		}
	}
	if len(b) == 0 {
		return "_"
	}
	return string(b)
}

// bucketTimeout bounds every request on the decisions bucket: a request
// the server refuses (a permission missing) gets no reply, and must not
// stall the scaler.
const bucketTimeout = 5 * time.Second

// bucket returns the decisions bucket, creating it the first time. Called
// with kvMu held.
func (a *Autoscaler) bucket(ctx context.Context) (jetstream.KeyValue, error) {
	if a.kv != nil {
		return a.kv, nil
	}
	if a.p.JS == nil {
		return nil, errors.New("no JetStream")
	}
	ctx, cancel := context.WithTimeout(ctx, bucketTimeout)
	defer cancel()
	kv, err := topology.EnsureAutoscaleBucket(ctx, a.p.JS, a.p.Topology)
	if err != nil {
		return nil, err
	}
	a.kv = kv
	return kv, nil
}

// loadRemembered reads the pools' models from the last decisions (a
// restarted scaler still knows what a pool at zero serves), once.
func (a *Autoscaler) loadRemembered(ctx context.Context) {
	a.kvMu.Lock()
	defer a.kvMu.Unlock()
	if a.loaded {
		return
	}
	kv, err := a.bucket(ctx)
	if err != nil {
		return
	}
	a.loaded = true
	ctx, cancel := context.WithTimeout(ctx, bucketTimeout)
	defer cancel()
	ds, _ := clusterview.ReadAutoscaleFrom(ctx, kv)
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, d := range ds {
		if len(d.Models) > 0 && a.models[d.Pool] == nil {
			a.models[d.Pool] = d.Models
		}
	}
}

func (a *Autoscaler) publish(ctx context.Context, ds []autoscale.Decision) error {
	a.kvMu.Lock()
	kv, err := a.bucket(ctx)
	a.kvMu.Unlock()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, bucketTimeout)
	defer cancel()
	var errs []error
	for _, d := range ds {
		data, err := json.Marshal(d)
		if err != nil {
			return err
		}
		if _, err := kv.Put(ctx, KVKey(d.Pool), data); err != nil {
			errs = append(errs, fmt.Errorf("pool %s: %w", d.Pool, err))
		}
	}
	return errors.Join(errs...)
}

// ReadDecisions reads every pool's last decision from MLSCHED_AUTOSCALE
// (none when the bucket does not exist: no autoscaler ever ran).
func ReadDecisions(ctx context.Context, js jetstream.JetStream) ([]autoscale.Decision, error) {
	return clusterview.ReadAutoscale(ctx, js)
}

// Summary is one line per decision, for logs and tests.
func Summary(ds []autoscale.Decision) string {
	var b strings.Builder
	for _, d := range ds {
		fmt.Fprintf(&b, "%s %d→%d (needed %d): %s\n", d.Pool, d.Current, d.Target, d.Needed, d.Reason)
	}
	return b.String()
}

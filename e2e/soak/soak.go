// Package soak runs mlsched under a steady rate for a long time against real
// processes (bin/ nats-server, dispatcher, worker and redis-server) and
// watches that nothing grows without bound: it samples the RSS of every
// process and the messages and bytes of every stream once a second, and
// reports the slope after warm-up, each stream's peak against its bound,
// lost and duplicate results, and latency percentiles per minute
// (`make soak`, docs/operations.md "Soak").
//
// The short run of `make test` (e2e/soak_test.go) fails only on loss,
// duplicates or a store over its configured bound: timing is reported,
// never asserted.
package soak

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/e2e/bench"
	"github.com/mlsched/mlsched/e2e/harness"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// Options of a soak. The zero value is completed by Defaults.
type Options struct {
	// Rate is the tasks per second offered (0: calibrate: the highest rate
	// the pipeline completes here, see Calibrate).
	Rate int `json:"rate"`
	// Duration of the paced run (default 30m).
	Duration time.Duration `json:"duration"`
	// Warmup is excluded from the slopes (default a sixth of Duration).
	Warmup time.Duration `json:"warmup"`
	// Drain: after the last submission, results are awaited while they keep
	// coming; the tasks without one when none came for Drain are lost
	// (default 60s).
	Drain time.Duration `json:"drain"`
	// Workers is the number of worker processes (default 2).
	Workers int `json:"workers"`
	// ClusterNodes > 0 runs a cluster of that many nats-servers and R3
	// streams (replicas = min(3, nodes)); 0 runs one server.
	ClusterNodes int `json:"cluster_nodes"`
	// SyncInterval is nats-server's sync_interval (default "always", as
	// deployments/nats/nats.conf).
	SyncInterval string `json:"sync_interval"`
	// Payload is the size of a task's JSON payload (default 64 bytes); the
	// echo model returns it, so results carry it too.
	Payload int `json:"payload"`
	// DispatcherEnv and WorkerEnv add or override variables.
	DispatcherEnv map[string]string `json:"dispatcher_env,omitempty"`
	WorkerEnv     map[string]string `json:"worker_env,omitempty"`
	// Dir holds the processes' files (default a temporary directory,
	// removed at the end).
	Dir string `json:"-"`
	// HeapProfile, when set, is where nats-server's heap profile (from its
	// prof_port) is written at the end of the run (single server only).
	HeapProfile string `json:"-"`
	// Log receives progress lines (default none).
	Log func(format string, args ...any) `json:"-"`
}

// Defaults fills the zero fields.
func (o Options) Defaults() Options {
	if o.Duration <= 0 {
		o.Duration = 30 * time.Minute
	}
	if o.Warmup <= 0 {
		o.Warmup = o.Duration / 6
	}
	if o.Drain <= 0 {
		o.Drain = time.Minute
	}
	if o.Workers <= 0 {
		o.Workers = 2
	}
	if o.SyncInterval == "" {
		o.SyncInterval = "always"
	}
	if o.Payload <= 0 {
		o.Payload = 64
	}
	if o.Log == nil {
		o.Log = func(string, ...any) {}
	}
	return o
}

// Report is what a soak measured.
type Report struct {
	Options Options `json:"options"`
	// Calibrated is the rate Calibrate measured (0 when Rate was given).
	Calibrated float64 `json:"calibrated,omitempty"`
	// Sent is the tasks submitted; AchievedRate is Sent over the paced
	// run's wall time.
	Sent         int64   `json:"sent"`
	AchievedRate float64 `json:"achieved_rate"`
	// Results read from MLSCHED_RESULTS: Succeeded of them, Failed not.
	Results   int64 `json:"results"`
	Succeeded int64 `json:"succeeded"`
	Failed    int64 `json:"failed"`
	// Lost tasks have no result when none arrived for a whole Drain;
	// Duplicates are results beyond the first of a task. DrainTime is how
	// long the last results took after the last submission.
	Lost          int64         `json:"lost"`
	Duplicates    int64         `json:"duplicates"`
	PublishErrors int64         `json:"publish_errors"`
	DrainTime     time.Duration `json:"drain_time"`
	// Procs by name: RSS figures in MiB.
	Procs map[string]ProcStat `json:"procs"`
	// Streams by name.
	Streams map[string]StreamStat `json:"streams"`
	// Minutes: submit-to-result latency of the results read in each minute.
	Minutes []Minute `json:"minutes"`
	// Load is `uptime` sampled every 5 minutes (and at start and end).
	Load []string `json:"load"`
	// Samples, one per second.
	Samples []Sample `json:"samples,omitempty"`
}

// ProcStat is one process's RSS over the run, in MiB; the slopes are per
// 10 minutes, by least squares over the samples after warm-up (and over
// the last half of the run).
type ProcStat struct {
	StartMiB         float64 `json:"start_mib"`
	WarmMiB          float64 `json:"warm_mib"`
	PeakMiB          float64 `json:"peak_mib"`
	EndMiB           float64 `json:"end_mib"`
	SlopeMiBPer10m   float64 `json:"slope_mib_per_10m"`
	SlopeLastHalf10m float64 `json:"slope_last_half_mib_per_10m"`
}

// StreamStat is one stream's size over the run against its bounds (-1:
// none).
type StreamStat struct {
	PeakMsgs  uint64 `json:"peak_msgs"`
	PeakBytes uint64 `json:"peak_bytes"`
	EndMsgs   uint64 `json:"end_msgs"`
	EndBytes  uint64 `json:"end_bytes"`
	MaxMsgs   int64  `json:"max_msgs"`
	MaxBytes  int64  `json:"max_bytes"`
	// Over is set when a sample held more than a bound.
	Over bool `json:"over"`
	// SlopeBytesPer10mLastHalf is the growth over the last half of the run.
	SlopeBytesPer10mLastHalf float64 `json:"slope_bytes_per_10m_last_half"`
}

// Minute is the latency of the results read in one minute of the run.
type Minute struct {
	Minute  int     `json:"minute"`
	Results int     `json:"results"`
	P50ms   float64 `json:"p50_ms"`
	P90ms   float64 `json:"p90_ms"`
	P99ms   float64 `json:"p99_ms"`
	MaxMs   float64 `json:"max_ms"`
}

// Sample is one second's measurement.
type Sample struct {
	T       float64              `json:"t"`
	RSS     map[string]int64     `json:"rss"`
	Streams map[string][2]uint64 `json:"streams"` // messages, bytes
	Bounds  map[string][2]int64  `json:"-"`       // max messages, max bytes
}

const (
	taskType   = "soak"
	driverName = "soak-dispatcher"
)

type env struct {
	o       Options
	g       *harness.Group
	natsURL string
	procs   map[string]int // name -> pid
	prof    string         // nats-server prof address
	nc      *nats.Conn
	js      jetstream.JetStream
	rnc     *nats.Conn // results reader
	rjs     jetstream.JetStream
}

// Run starts the processes, offers o.Rate tasks/s for o.Duration and
// reports. The error is for a soak that could not run; loss, duplicates
// and bounds are in the report (see Report.Check).
func Run(ctx context.Context, o Options) (*Report, error) {
	o = o.Defaults()
	e, err := start(ctx, o)
	if err != nil {
		return nil, err
	}
	defer e.close()
	rep := &Report{Options: o, Procs: map[string]ProcStat{}, Streams: map[string]StreamStat{}}
	if o.Rate <= 0 {
		r, err := e.calibrate(ctx)
		if err != nil {
			return nil, fmt.Errorf("calibrate: %w", err)
		}
		rep.Calibrated = r
		o.Rate = max(50, int(r*0.6)/50*50)
		rep.Options.Rate = o.Rate
		o.Log("calibrated: %.0f tasks/s completed unpaced; soaking at %d/s (60%%)", r, o.Rate)
	}
	return rep, e.soak(ctx, o, rep)
}

func start(ctx context.Context, o Options) (*env, error) {
	dir := o.Dir
	if dir == "" {
		d, err := os.MkdirTemp("", "mlsched-soak-")
		if err != nil {
			return nil, err
		}
		dir = d
	}
	g, err := harness.NewGroup(dir)
	if err != nil {
		return nil, err
	}
	e := &env{o: o, g: g, procs: map[string]int{}}
	ok := false
	defer func() {
		if !ok {
			e.close()
		}
	}()
	replicas := 1
	if o.ClusterNodes > 0 {
		cl, err := g.StartNATSCluster(harness.NATSClusterOptions{Nodes: o.ClusterNodes, SyncInterval: o.SyncInterval, Name: "soak", Direct: true})
		if err != nil {
			return nil, err
		}
		e.natsURL = cl.URL
		for i, n := range cl.Nodes {
			e.procs[fmt.Sprintf("nats-server-%d", i+1)] = n.Pid()
		}
		replicas = min(3, o.ClusterNodes)
	} else {
		port, err := harness.FreePort()
		if err != nil {
			return nil, err
		}
		g.NATSConfig = fmt.Sprintf("prof_port: %d\n", port)
		e.prof = fmt.Sprintf("127.0.0.1:%d", port)
		n, err := g.StartNATS("nats", o.SyncInterval)
		if err != nil {
			return nil, err
		}
		e.natsURL = n.URL
		e.procs["nats-server"] = n.Pid()
	}
	if e.nc, err = nats.Connect(e.natsURL, nats.Name("soak-producer"), nats.MaxReconnects(-1)); err != nil {
		return nil, err
	}
	if e.js, err = jetstream.New(e.nc, jetstream.WithPublishAsyncMaxPending(4096)); err != nil {
		return nil, err
	}
	if e.rnc, err = nats.Connect(e.natsURL, nats.Name("soak-results"), nats.MaxReconnects(-1)); err != nil {
		return nil, err
	}
	if e.rjs, err = jetstream.New(e.rnc); err != nil {
		return nil, err
	}
	redis, err := g.StartRedis("redis")
	if err != nil {
		return nil, err
	}
	e.procs["redis-server"] = redis.Pid()
	models := filepath.Join(g.Dir, "models.yaml")
	if err := os.WriteFile(models, []byte("models:\n  - name: m1\n    types: ["+taskType+"]\n    executor: go\n    go: {handler: echo}\n"), 0o644); err != nil {
		return nil, err
	}
	dbin, err := harness.BinaryPath("dispatcher")
	if err != nil {
		return nil, err
	}
	wbin, err := harness.BinaryPath("worker")
	if err != nil {
		return nil, err
	}
	d, err := g.Process("dispatcher", dbin, nil, merge(map[string]string{
		"MLSCHED_NATS_URL":        e.natsURL,
		"MLSCHED_REDIS_URL":       redis.URL,
		"MLSCHED_DISPATCHER_NAME": driverName,
		"MLSCHED_STREAM_REPLICAS": strconv.Itoa(replicas),
		"MLSCHED_HTTP_ADDR":       "127.0.0.1:0",
		"MLSCHED_LOG_LEVEL":       "warn",
	}, o.DispatcherEnv))
	if err != nil {
		return nil, err
	}
	if err := d.StartReady(func(ctx context.Context) error { _, err := e.adminStats(); return err }); err != nil {
		return nil, err
	}
	e.procs["dispatcher"] = d.Pid()
	for i := 1; i <= o.Workers; i++ {
		node := fmt.Sprintf("node-%d", i)
		w, err := g.Process("worker-"+node, wbin, nil, merge(map[string]string{
			"MLSCHED_NATS_URL":        e.natsURL,
			"MLSCHED_NODE_ID":         node,
			"MLSCHED_MODELS_FILE":     models,
			"MLSCHED_STREAM_REPLICAS": strconv.Itoa(replicas),
			"MLSCHED_HTTP_ADDR":       "127.0.0.1:0",
			"MLSCHED_LOG_LEVEL":       "warn",
		}, o.WorkerEnv))
		if err != nil {
			return nil, err
		}
		if err := w.Start(); err != nil {
			return nil, err
		}
		e.procs["worker-"+node] = w.Pid()
	}
	wctx, cancel := context.WithTimeout(ctx, harness.ReadyTimeout)
	defer cancel()
	if err := harness.WaitFor(wctx, func() error {
		rep, err := e.adminStats()
		if err != nil {
			return err
		}
		if len(rep.Nodes) != o.Workers {
			return fmt.Errorf("the dispatcher sees %d of %d nodes", len(rep.Nodes), o.Workers)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	ok = true
	return e, nil
}

func merge(base, extra map[string]string) map[string]string {
	maps.Copy(base, extra)
	return base
}

func (e *env) adminStats() (protocol.StatsReport, error) {
	var rep protocol.StatsReport
	nc := e.rnc
	if nc == nil {
		return rep, errors.New("not connected")
	}
	m, err := nc.Request(protocol.SubjectAdminStats, nil, time.Second)
	if err != nil {
		return rep, err
	}
	if err := json.Unmarshal(m.Data, &rep); err != nil {
		return rep, fmt.Errorf("stats report: %w", err)
	}
	return rep, nil
}

func (e *env) close() {
	if e.nc != nil {
		e.nc.Close()
	}
	if e.rnc != nil {
		e.rnc.Close()
	}
	if e.o.Dir == "" {
		e.g.Close()
	} else {
		e.g.Stop()
	}
}

// run is one batch of tasks: ids prefix+index, with their send times and
// how many results each got.
type run struct {
	prefix string
	sent   []atomic.Int64
	seen   []atomic.Int32
	start  time.Time

	mu      sync.Mutex
	minutes map[int][]int64 // minute of arrival -> latencies (ns)
	results atomic.Int64
	ok      atomic.Int64
	failed  atomic.Int64
	dups    atomic.Int64
}

func newRun(prefix string, n int) *run {
	return &run{prefix: prefix, sent: make([]atomic.Int64, n), seen: make([]atomic.Int32, n), minutes: map[int][]int64{}}
}

// receive reads every new result of the run until stop is called.
func (e *env) receive(ctx context.Context, r *run) (stop func(), err error) {
	cons, err := e.rjs.OrderedConsumer(ctx, topology.StreamResults, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{topology.SubjectResultsAll}, DeliverPolicy: jetstream.DeliverNewPolicy})
	if err != nil {
		return nil, fmt.Errorf("results consumer: %w", err)
	}
	pre := topology.ResultSubject(r.prefix)
	cc, err := cons.Consume(func(m jetstream.Msg) {
		now := time.Now()
		subj := m.Subject()
		if !strings.HasPrefix(subj, pre) {
			return
		}
		i, err := strconv.Atoi(subj[len(pre):])
		if err != nil || i < 0 || i >= len(r.sent) {
			return
		}
		if r.seen[i].Add(1) > 1 {
			r.dups.Add(1)
			return
		}
		r.results.Add(1)
		res, err := protocol.DecodeResult(m.Data())
		if err == nil && res.Status == protocol.StatusSucceeded {
			r.ok.Add(1)
		} else {
			r.failed.Add(1)
		}
		if s := r.sent[i].Load(); s > 0 {
			min := int(now.Sub(r.start) / time.Minute)
			r.mu.Lock()
			r.minutes[min] = append(r.minutes[min], now.UnixNano()-s)
			r.mu.Unlock()
		}
	})
	if err != nil {
		return nil, fmt.Errorf("results consumer: %w", err)
	}
	return cc.Stop, nil
}

// publish offers the run's tasks [from, to) at rate/s (unpaced when rate
// is 0) until every one is sent or until is reached; it returns how many
// were sent.
func (e *env) publish(ctx context.Context, r *run, from, to, rate int, until time.Time, payload string, errs *atomic.Int64) (int, error) {
	type fut struct {
		f   jetstream.PubAckFuture
		msg *nats.Msg
	}
	futs := make(chan fut, 8192)
	var wg sync.WaitGroup
	var failErr atomic.Value
	wg.Add(1)
	go func() {
		defer wg.Done()
		for f := range futs {
			select {
			case <-f.f.Ok():
			case err := <-f.f.Err():
				errs.Add(1)
				// A full task stream (DiscardNew) or a slow server: retry
				// synchronously; the Nats-Msg-Id makes it safe.
				for try := 0; ctx.Err() == nil; try++ {
					if _, err = e.js.PublishMsg(ctx, f.msg); err == nil {
						break
					}
					if try > 100 {
						failErr.Store(fmt.Errorf("publish %s: %w", f.msg.Header.Get(protocol.HdrMsgID), err))
						break
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
		}
	}()
	defer func() { close(futs); wg.Wait() }()
	subject := topology.TaskSubject(taskType)
	t0 := time.Now()
	n := 0
	for i := from; i < to; i++ {
		if ctx.Err() != nil {
			return n, ctx.Err()
		}
		now := time.Now()
		if !until.IsZero() && now.After(until) {
			break
		}
		if rate > 0 {
			target := t0.Add(time.Duration(int64(i-from) * int64(time.Second) / int64(rate)))
			if ahead := target.Sub(now); ahead >= time.Millisecond {
				time.Sleep(ahead)
			}
		}
		id := r.prefix + strconv.Itoa(i)
		msg := &nats.Msg{Subject: subject, Header: nats.Header{protocol.HdrMsgID: []string{id}},
			Data: []byte(`{"id":"` + id + `","type":"` + taskType + `","payload":` + payload + `}`)}
		r.sent[i].Store(time.Now().UnixNano())
		for {
			f, err := e.js.PublishMsgAsync(msg)
			if err == nil {
				futs <- fut{f, msg}
				break
			}
			if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
				return n, fmt.Errorf("publish %s: %w", id, err)
			}
			if ctx.Err() != nil {
				return n, ctx.Err()
			}
		}
		n++
	}
	select {
	case <-e.js.PublishAsyncComplete():
	case <-ctx.Done():
		return n, ctx.Err()
	}
	if err, _ := failErr.Load().(error); err != nil {
		return n, err
	}
	return n, nil
}

// Calibrate offers tasks unpaced for 30 s, with at most a few thousand in
// flight, and returns the results completed per second over its last 20 s:
// what this machine's pipeline sustains.
func (e *env) calibrate(ctx context.Context) (float64, error) {
	const window = 30 * time.Second
	r := newRun(fmt.Sprintf("cal-%d-", time.Now().UnixNano()%1e6), 200_000)
	r.start = time.Now()
	stop, err := e.receive(ctx, r)
	if err != nil {
		return 0, err
	}
	defer stop()
	cctx, cancel := context.WithTimeout(ctx, window+5*time.Second)
	defer cancel()
	var errs atomic.Int64
	var total atomic.Int64
	until := time.Now().Add(window)
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Pace on completions: keep at most 4000 tasks outstanding so the
		// backlog does not flatter (or drown) the measure.
		sent := 0
		for sent < len(r.sent) && time.Now().Before(until) && cctx.Err() == nil {
			if int64(sent)-r.results.Load() > 4000 {
				time.Sleep(time.Millisecond)
				continue
			}
			to := min(sent+500, len(r.sent))
			n, err := e.publish(cctx, r, sent, to, 0, until, `"`+strings.Repeat("x", max(e.o.Payload-2, 0))+`"`, &errs)
			total.Add(int64(n))
			if err != nil {
				return
			}
			sent = to
		}
	}()
	time.Sleep(10 * time.Second)
	n0, t0 := r.results.Load(), time.Now()
	<-done
	n1, t1 := r.results.Load(), time.Now()
	if n1 <= n0 {
		return 0, errors.New("no results completed")
	}
	// Let the calibration's tasks finish before the soak.
	dctx, dcancel := context.WithTimeout(ctx, time.Minute)
	defer dcancel()
	_ = harness.WaitFor(dctx, func() error {
		if r.results.Load() < total.Load() {
			return errors.New("draining")
		}
		return nil
	})
	return float64(n1-n0) / t1.Sub(t0).Seconds(), nil
}

func (e *env) soak(ctx context.Context, o Options, rep *Report) error {
	n := int(float64(o.Rate)*o.Duration.Seconds()) + 1
	r := newRun(fmt.Sprintf("s%d-", time.Now().UnixNano()%1e6), n)
	stopRecv, err := e.receive(ctx, r)
	if err != nil {
		return err
	}
	defer stopRecv()
	rep.Load = append(rep.Load, uptime())
	r.start = time.Now()
	sctx, stopSampling := context.WithCancel(ctx)
	samples := make(chan []Sample, 1)
	go func() { samples <- e.sample(sctx, r.start, rep) }()
	o.Log("soak: %d tasks/s for %v (%d tasks), %d workers, %s", o.Rate, o.Duration, n, o.Workers, e.natsURL)
	prog := time.NewTicker(time.Minute)
	defer prog.Stop()
	go func() {
		for {
			select {
			case <-sctx.Done():
				return
			case <-prog.C:
				o.Log("  %v: sent %d, results %d, dup %d", time.Since(r.start).Round(time.Second), sentCount(r), r.results.Load(), r.dups.Load())
			}
		}
	}()
	var pubErrs atomic.Int64
	payload := `"` + strings.Repeat("x", max(o.Payload-2, 0)) + `"`
	sent, err := e.publish(ctx, r, 0, len(r.sent), o.Rate, r.start.Add(o.Duration), payload, &pubErrs)
	wall := time.Since(r.start)
	rep.Sent, rep.PublishErrors = int64(sent), pubErrs.Load()
	rep.AchievedRate = float64(sent) / wall.Seconds()
	if err != nil {
		stopSampling()
		<-samples
		return err
	}
	// Drain: wait for the last results while they keep coming; a task is
	// lost when it has no result and none arrived for a whole Drain (a slow
	// machine's backlog is not loss).
	last, lastAt := r.results.Load(), time.Now()
	for r.results.Load() < int64(sent) && ctx.Err() == nil {
		if n := r.results.Load(); n != last {
			last, lastAt = n, time.Now()
		} else if time.Since(lastAt) > o.Drain {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	rep.DrainTime = time.Since(r.start) - wall
	time.Sleep(2 * time.Second) // a late duplicate would show here
	rep.Load = append(rep.Load, uptime())
	if o.HeapProfile != "" && e.prof != "" {
		if err := fetchHeap(ctx, e.prof, o.HeapProfile); err != nil {
			o.Log("heap profile: %v", err)
		}
	}
	stopSampling()
	rep.Samples = <-samples
	rep.Results, rep.Succeeded, rep.Failed, rep.Duplicates = r.results.Load(), r.ok.Load(), r.failed.Load(), r.dups.Load()
	for i := 0; i < sent; i++ {
		if r.seen[i].Load() == 0 {
			rep.Lost++
		}
	}
	rep.Minutes = minutes(r)
	summarize(rep, o)
	return nil
}

func sentCount(r *run) int {
	n := sort.Search(len(r.sent), func(i int) bool { return r.sent[i].Load() == 0 })
	return n
}

// sample records every process's RSS and every stream's size once a second
// until ctx ends, and uptime every 5 minutes.
func (e *env) sample(ctx context.Context, start time.Time, rep *Report) []Sample {
	var out []Sample
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	lastLoad := time.Now()
	for {
		s := Sample{T: time.Since(start).Seconds(), RSS: map[string]int64{}, Streams: map[string][2]uint64{}, Bounds: map[string][2]int64{}}
		for name, pid := range e.procs {
			if rss, err := bench.RSS(pid); err == nil {
				s.RSS[name] = rss
			}
		}
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		lister := e.rjs.ListStreams(rctx)
		for info := range lister.Info() {
			s.Streams[info.Config.Name] = [2]uint64{info.State.Msgs, info.State.Bytes}
			s.Bounds[info.Config.Name] = [2]int64{info.Config.MaxMsgs, info.Config.MaxBytes}
		}
		cancel()
		out = append(out, s)
		if time.Since(lastLoad) >= 5*time.Minute {
			rep.Load = append(rep.Load, uptime())
			lastLoad = time.Now()
		}
		select {
		case <-ctx.Done():
			return out
		case <-tick.C:
		}
	}
}

func uptime() string {
	out, err := exec.Command("uptime").Output()
	if err != nil {
		return err.Error()
	}
	return strings.TrimSpace(string(out))
}

func fetchHeap(ctx context.Context, addr, path string) error {
	cmd := exec.CommandContext(ctx, "curl", "-sf", "-o", path, "http://"+addr+"/debug/pprof/heap")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("curl: %w: %s", err, out)
	}
	return nil
}

func minutes(r *run) []Minute {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Minute
	for m, ls := range r.minutes {
		slices.Sort(ls)
		q := func(p float64) float64 { return float64(ls[min(len(ls)-1, int(p*float64(len(ls))))]) / 1e6 }
		out = append(out, Minute{Minute: m, Results: len(ls), P50ms: q(0.5), P90ms: q(0.9), P99ms: q(0.99), MaxMs: q(1)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Minute < out[j].Minute })
	return out
}

// summarize derives the per-process and per-stream figures from the samples.
func summarize(rep *Report, o Options) {
	ss := rep.Samples
	if len(ss) == 0 {
		return
	}
	end := ss[len(ss)-1].T
	warm := o.Warmup.Seconds()
	half := end / 2
	names := map[string]bool{}
	for _, s := range ss {
		for n := range s.RSS {
			names[n] = true
		}
	}
	for n := range names {
		var st ProcStat
		var xs, ys, xh, yh []float64
		for _, s := range ss {
			v, ok := s.RSS[n]
			if !ok {
				continue
			}
			mib := float64(v) / (1 << 20)
			if st.StartMiB == 0 {
				st.StartMiB = mib
			}
			if st.WarmMiB == 0 && s.T >= warm {
				st.WarmMiB = mib
			}
			st.PeakMiB = max(st.PeakMiB, mib)
			st.EndMiB = mib
			if s.T >= warm {
				xs, ys = append(xs, s.T), append(ys, mib)
			}
			if s.T >= half {
				xh, yh = append(xh, s.T), append(yh, mib)
			}
		}
		st.SlopeMiBPer10m = slope(xs, ys) * 600
		st.SlopeLastHalf10m = slope(xh, yh) * 600
		rep.Procs[n] = st
	}
	streams := map[string]bool{}
	for _, s := range ss {
		for n := range s.Streams {
			streams[n] = true
		}
	}
	for n := range streams {
		st := StreamStat{MaxMsgs: -1, MaxBytes: -1}
		var xh, yh []float64
		for _, s := range ss {
			v, ok := s.Streams[n]
			if !ok {
				continue
			}
			b := s.Bounds[n]
			st.MaxMsgs, st.MaxBytes = b[0], b[1]
			st.PeakMsgs, st.PeakBytes = max(st.PeakMsgs, v[0]), max(st.PeakBytes, v[1])
			st.EndMsgs, st.EndBytes = v[0], v[1]
			if (b[0] > 0 && v[0] > uint64(b[0])) || (b[1] > 0 && v[1] > uint64(b[1])) {
				st.Over = true
			}
			if s.T >= half {
				xh, yh = append(xh, s.T), append(yh, float64(v[1]))
			}
		}
		st.SlopeBytesPer10mLastHalf = slope(xh, yh) * 600
		rep.Streams[n] = st
	}
}

// slope is the least-squares slope of ys over xs (0 with fewer than 2).
func slope(xs, ys []float64) float64 {
	n := float64(len(xs))
	if n < 2 {
		return 0
	}
	var sx, sy, sxx, sxy float64
	for i := range xs {
		sx, sy, sxx, sxy = sx+xs[i], sy+ys[i], sxx+xs[i]*xs[i], sxy+xs[i]*ys[i]
	}
	d := n*sxx - sx*sx
	if d == 0 {
		return 0
	}
	return (n*sxy - sx*sy) / d
}

// Check returns an error naming every loss, duplicate and stream over its
// bound: what the short soak of `make test` fails on. Timing never fails it.
func (r *Report) Check() error {
	var errs []error
	if r.Lost > 0 {
		errs = append(errs, fmt.Errorf("%d of %d tasks lost (no result, and none came for %v)", r.Lost, r.Sent, r.Options.Drain))
	}
	if r.Duplicates > 0 {
		errs = append(errs, fmt.Errorf("%d duplicate results", r.Duplicates))
	}
	for n, s := range r.Streams {
		if s.Over {
			errs = append(errs, fmt.Errorf("stream %s over its bound: peak %d msgs / %d bytes, bounds %d / %d", n, s.PeakMsgs, s.PeakBytes, s.MaxMsgs, s.MaxBytes))
		}
	}
	return errors.Join(errs...)
}

package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/dispatcher/authconf"
	"github.com/mlsched/mlsched/e2e/bench/relay"
	"github.com/mlsched/mlsched/e2e/harness"
	"github.com/mlsched/mlsched/shared/natsconn"
	"github.com/mlsched/mlsched/shared/opshttp"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// dispatcherName is the benchmark dispatcher's MLSCHED_DISPATCHER_NAME.
const dispatcherName = "bench-dispatcher"

// run is one scenario's live state.
type run struct {
	o    Options
	name string
	// base is the scenario without authorization: relay for relay-auth.
	base string
	g    *harness.Group
	// auth is the authorization of the -auth scenarios (nil: open server).
	auth *harness.Auth
	// natsURL is the server's URL, or the cluster's comma-separated list.
	natsURL string
	pubNC   *nats.Conn // the producer's connection
	rcvNC   *nats.Conn // sinks or the results reader
	pubJS   jetstream.JetStream
	rcvJS   jetstream.JetStream
	// ctlNC creates the streams and checks the relay's consumer: with
	// authorization, on the dispatcher's key (the producer's and the
	// admin's may not); else rcvNC.
	ctlNC *nats.Conn
	ctlJS jetstream.JetStream
	// sinkNCs are the relay sinks' connections with authorization, one per
	// node on the node's key (open, the sinks share rcvNC).
	sinkNCs []*nats.Conn

	cpu []procGroup // CPU time is reported per group
	mem []procGroup // memory is reported per group (first pid)

	tr atomic.Pointer[tracker] // the current phase's
	// points are the traced subjects, in hop order, and hops the names of
	// the hops from submission through each point to completion.
	points          []string
	hops            []string
	traceNC         *nats.Conn
	stopRcv         []func()
	pprofAddr       string
	workerPprofAddr string // node-1's, profiled with the dispatcher
	natsPprofAddr   string // one server's, profiled with -profile
	natsMonitor     string // one server's monitoring URL (its message counts)
	httpURL         string // the dispatcher's listener (dashboard, /metrics)
}

func (r *run) log(format string, args ...any) {
	fmt.Fprintf(r.o.Progress, "   "+format+"\n", args...)
}

func runScenario(ctx context.Context, o Options, name, dir string) (Scenario, []*Profile, error) {
	g, err := harness.NewGroup(dir)
	if err != nil {
		return Scenario{}, nil, err
	}
	defer g.Stop()
	base, auth := authScenario(name)
	r := &run{o: o, name: name, base: base, g: g}
	defer r.close()
	if auth {
		if r.auth, err = harness.NewAuth(filepath.Join(g.Dir, "auth"), r.nodes()); err != nil {
			return Scenario{}, nil, fmt.Errorf("mlsched auth init: %w", err)
		}
	}
	natsCPU := procGroup{Name: "nats-server"}
	if o.ClusterNodes > 0 {
		cl, err := g.StartNATSCluster(harness.NATSClusterOptions{Nodes: o.ClusterNodes, SyncInterval: o.SyncInterval,
			Name: "bench", Direct: true, Auth: r.auth})
		if err != nil {
			return Scenario{}, nil, err
		}
		defer cl.Close()
		r.natsURL = cl.URL
		natsCPU.Name = fmt.Sprintf("nats-server (%d)", o.ClusterNodes)
		for _, n := range cl.Nodes {
			natsCPU.Pids = append(natsCPU.Pids, n.Pid())
		}
	} else {
		if o.ProfilePath != "" { // nats-server's own net/http/pprof
			port, err := harness.FreePort()
			if err != nil {
				return Scenario{}, nil, err
			}
			g.NATSConfig = fmt.Sprintf("prof_port: %d\n", port)
			r.natsPprofAddr = fmt.Sprintf("127.0.0.1:%d", port)
		}
		n, err := g.StartNATSAuth("nats", o.SyncInterval, r.auth)
		if err != nil {
			return Scenario{}, nil, err
		}
		r.natsURL = n.URL
		r.natsMonitor = n.MonitorURL
		natsCPU.Pids = []int{n.Pid()}
	}
	r.cpu = append(r.cpu, natsCPU, procGroup{"bench driver", []int{os.Getpid()}})
	r.mem = append(r.mem, procGroup{natsCPU.Name, natsCPU.Pids[:1]})
	if err := r.connect(ctx); err != nil {
		return Scenario{}, nil, err
	}
	res := Scenario{Name: name}
	switch base {
	case ScenarioRelay:
		res.PublishesPerTask = 2
		err = r.startRelay(ctx)
	case ScenarioMlsched, ScenarioObserved, ScenarioDigits, ScenarioDigitsBatch:
		// task, dispatch, result: a success is reported to a dispatcher, not
		// stored; the dispatch is in memory (MLSCHED_ATTEMPT_STORAGE), so
		// two of them are fsync'd
		res.PublishesPerTask = 3
		err = r.startMlsched(ctx)
	}
	if err != nil {
		return res, nil, err
	}
	if name == ScenarioObserved {
		obs, st, err := StartObservers(ctx, r.httpURL, o.Observers, o.ScrapeInterval)
		if err != nil {
			return res, nil, fmt.Errorf("observers: %w", err)
		}
		r.log("%d dashboard event streams (%d stalled) and %d /metrics scrapers (every %s) on %s", st.Streams, st.Stalled, st.Scrapers, st.ScrapeInterval, r.httpURL)
		res.Observers = &st
		defer obs.Stop(res.Observers)
	}
	if o.Trace {
		if err := r.trace(); err != nil {
			return res, nil, err
		}
	}

	pub := newPublisher(r.pubJS, o.Payload)
	pub.deadlineLo, pub.deadlineHi = o.Deadlines[0], o.Deadlines[1]
	if isDigits(name) {
		if pub.payload, err = digitsPayload(); err != nil {
			return res, nil, err
		}
	}
	if o.groupCommit() { // the producer follows the dispatcher
		stop, err := pub.groupCommit(ctx, r.pubNC)
		if err != nil {
			return res, nil, fmt.Errorf("producer's group commit: %w", err)
		}
		defer stop()
	}
	ready := map[string]float64{}
	for _, g := range r.mem {
		if rss, err := RSS(g.Pids[0]); err == nil {
			ready[g.Name] = float64(rss) / (1 << 20)
		}
	}
	if res.Warmup, err = r.phase(ctx, pub, "warmup", "w-", o.Warmup, 0); err != nil {
		return res, nil, err
	}
	mem := newMemSampler(r.mem)
	mem.start()
	var profs []chan profResult
	stopProf := make(chan struct{})
	startProf := func(who, addr, out string) {
		c := make(chan profResult, 1)
		profs = append(profs, c)
		go func() { c <- r.profile(ctx, stopProf, who, addr, out) }()
	}
	if name == ScenarioMlsched && o.ProfilePath != "" {
		startProf("dispatcher", r.pprofAddr, o.ProfilePath)
		startProf("worker (node-1)", r.workerPprofAddr, profilePath(o.ProfilePath, "worker"))
	}
	var driverProf *os.File
	driverStart := time.Now()
	if o.ProfilePath != "" {
		if r.natsPprofAddr != "" {
			startProf(name+": nats-server", r.natsPprofAddr, profilePath(o.ProfilePath, name+".nats"))
		}
		// The bench driver (producer, sinks or results reader) in process.
		if f, err := os.Create(profilePath(o.ProfilePath, name+".driver")); err == nil {
			if pprof.StartCPUProfile(f) == nil {
				driverProf = f
			} else {
				f.Close()
			}
		}
	}
	if o.TraceFile != "" && base != ScenarioRelay {
		arrivals, err := LoadTrace(o.TraceFile, o.TraceTimeColumn, o.TraceSizeColumn, o.TraceTasks)
		if err != nil {
			return res, nil, err
		}
		if res.Trace, err = r.replay(ctx, pub, arrivals); err != nil {
			return res, nil, err
		}
	} else {
		var before serverCounts
		if r.natsMonitor != "" {
			before, err = readServerCounts(ctx, r.natsMonitor)
			if err != nil {
				return res, nil, err
			}
		}
		if res.Throughput, err = r.phase(ctx, pub, "throughput", "t-", o.Tasks, 0); err != nil {
			return res, nil, err
		}
		if r.natsMonitor != "" {
			after, err := readServerCounts(ctx, r.natsMonitor)
			if err != nil {
				return res, nil, err
			}
			m := before.perTask(after, o.Tasks)
			res.ServerMsgs = &m
			r.log("nats-server per task over the throughput phase: %s", m)
		}
		if res.Latency, err = r.phase(ctx, pub, fmt.Sprintf("latency at %d/s", o.Rate), "l-", o.LatencyTasks, o.Rate); err != nil {
			return res, nil, err
		}
	}
	var driver *Profile
	if driverProf != nil {
		pprof.StopCPUProfile()
		driverProf.Close()
		driver = &Profile{Who: name + ": bench driver", Path: driverProf.Name(), Seconds: int(time.Since(driverStart).Round(time.Second) / time.Second)}
		if exe, err := os.Executable(); err == nil {
			if out, err := exec.CommandContext(ctx, "go", "tool", "pprof", "-top", "-nodecount=15", exe, driver.Path).Output(); err == nil {
				driver.Top = string(out)
			}
		}
	}
	res.Memory = mem.stop()
	for k, m := range res.Memory {
		m.ReadyMiB = ready[k]
		res.Memory[k] = m
	}
	if base != ScenarioRelay {
		if rep, err := r.adminStats(); err == nil {
			res.Dispatched = map[string]int64{}
			for _, m := range rep.Models {
				res.Dispatched[m.Name] = m.Dispatched
			}
		}
	}
	var ps []*Profile
	close(stopProf)
	if len(profs) > 0 {
		r.log("waiting for the last %ds CPU profile window", o.ProfileSeconds)
		for _, c := range profs {
			pr := <-c
			if pr.err != nil {
				return res, nil, pr.err
			}
			ps = append(ps, pr.p)
		}
	}
	if driver != nil {
		ps = append(ps, driver)
	}
	return res, ps, nil
}

// profilePath is where another process's profile goes: the dispatcher's
// path with "."+who before the extension.
func profilePath(dispatcherPath, who string) string {
	ext := filepath.Ext(dispatcherPath)
	return strings.TrimSuffix(dispatcherPath, ext) + "." + who + ext
}

// dial connects the bench's own clients: open, or on the key and reply
// prefix of role (node nodeID for authconf.Node) with authorization.
func (r *run) dial(name, role, nodeID string) (*nats.Conn, error) {
	if r.auth == nil {
		return nats.Connect(r.natsURL, nats.MaxReconnects(-1), nats.Name(name))
	}
	inbox := map[string]string{authconf.Dispatcher: natsconn.InboxDispatcher, authconf.Producer: natsconn.InboxProducer,
		authconf.Admin: natsconn.InboxAdmin, authconf.Node: natsconn.InboxNode(nodeID)}[role]
	return natsconn.Connect(natsconn.Config{URL: r.natsURL, Nkey: r.auth.Seed(role, nodeID)},
		natsconn.Conn{Name: name, Inbox: inbox}, nats.MaxReconnects(-1))
}

// connect opens the producer's connection and the receiver's (the results
// reader and admin requests: with authorization, the admin's key), and
// creates the streams.
func (r *run) connect(ctx context.Context) error {
	var err error
	if r.pubNC, err = r.dial("bench-producer", authconf.Producer, ""); err != nil {
		return err
	}
	if r.rcvNC, err = r.dial("bench-receiver", authconf.Admin, ""); err != nil {
		return err
	}
	if r.pubJS, err = jetstream.New(r.pubNC, jetstream.WithPublishAsyncMaxPending(4096)); err != nil {
		return err
	}
	if r.rcvJS, err = jetstream.New(r.rcvNC); err != nil {
		return err
	}
	r.ctlNC, r.ctlJS = r.rcvNC, r.rcvJS
	if r.auth != nil {
		if r.ctlNC, err = r.dial("bench-control", authconf.Dispatcher, ""); err != nil {
			return err
		}
		if r.ctlJS, err = jetstream.New(r.ctlNC); err != nil {
			return err
		}
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// The attempt streams on the processes' default storage (memory), so
	// that the dispatcher has none to migrate.
	return topology.Ensure(cctx, r.ctlJS, topology.Config{Replicas: r.o.replicas(), AttemptStorage: jetstream.MemoryStorage})
}

func (r *run) close() {
	for i := len(r.stopRcv) - 1; i >= 0; i-- {
		r.stopRcv[i]()
	}
	if r.pubNC != nil {
		r.pubNC.Close()
	}
	if r.rcvNC != nil {
		r.rcvNC.Close()
	}
	if r.traceNC != nil {
		r.traceNC.Close()
	}
	if r.ctlNC != nil && r.ctlNC != r.rcvNC {
		r.ctlNC.Close()
	}
	for _, nc := range r.sinkNCs {
		nc.Close()
	}
}

func (r *run) nodes() []string {
	n := make([]string, r.o.Nodes)
	for i := range n {
		n[i] = fmt.Sprintf("node-%d", i+1)
	}
	return n
}

// startRelay starts the relay process and one sink per node in this
// process; a task completes when a sink receives it.
func (r *run) startRelay(ctx context.Context) error {
	args := append(append([]string(nil), r.o.RelayCommand[1:]...), "-nats", r.natsURL, "-nodes", strings.Join(r.nodes(), ","))
	if r.auth != nil { // the dispatcher's grants: consume tasks, publish dispatches
		args = append(args, "-nkey", r.auth.Seed(authconf.Dispatcher, ""))
	}
	p, err := r.g.Process("relay", r.o.RelayCommand[0], args, nil)
	if err != nil {
		return err
	}
	err = p.StartReady(func(ctx context.Context) error {
		s, err := r.ctlJS.Stream(ctx, topology.StreamTasks)
		if err != nil {
			return err
		}
		_, err = s.Consumer(ctx, "relay")
		return err
	})
	if err != nil {
		return err
	}
	r.cpu = append(r.cpu, procGroup{"relay", []int{p.Pid()}})
	r.mem = append(r.mem, procGroup{"relay", []int{p.Pid()}})
	for _, node := range r.nodes() {
		js := r.rcvJS
		if r.auth != nil { // each sink is a node: its own connection on its key
			nc, err := r.dial("bench-sink-"+node, authconf.Node, node)
			if err != nil {
				return err
			}
			r.sinkNCs = append(r.sinkNCs, nc)
			if js, err = jetstream.New(nc); err != nil {
				return err
			}
		}
		s, err := relay.NewSink(js, relay.SinkConfig{Node: node, MaxAckPending: r.o.Concurrency,
			OnMsg: func(m jetstream.Msg) {
				id := strings.TrimPrefix(m.Headers().Get(protocol.HdrMsgID), "r:")
				r.tr.Load().complete(id, true, time.Now())
			}})
		if err != nil {
			return err
		}
		if err := s.Start(ctx); err != nil {
			return err
		}
		r.stopRcv = append(r.stopRcv, s.Stop)
	}
	r.log("nats-server, relay and %d sinks ready", r.o.Nodes)
	return nil
}

// modelsFile is every node's models file: Models no-op go models serving
// the benchmark's task type.
func (r *run) modelsFile() (string, error) {
	var b strings.Builder
	if r.o.TraceFile != "" {
		// A trace replay: sim models of 20-40 ms plus 5 µs per unit of
		// size (a 4,000-token request: +20 ms), one in 50 to one in 500
		// attempts failing, so that the policy has a choice to make.
		b.WriteString("# written by mlsched-bench: sim models for a trace replay\nmodels:\n")
		for i := range r.o.Models {
			fmt.Fprintf(&b, "  - name: m%d\n    types: [%s]\n    executor: sim\n    sim:\n      latency: {dist: lognormal, median: %dms, sigma: 0.3}\n      latency_per_unit: 5us\n      failure_rate: %g\n",
				i+1, taskType, 20+20*i/max(1, r.o.Models-1), []float64{0.002, 0.01, 0.02, 0.005}[i%4])
		}
		path := r.g.Dir + "/models.yaml"
		return path, os.WriteFile(path, []byte(b.String()), 0o644)
	}
	b.WriteString("# written by mlsched-bench: no-op models\nmodels:\n")
	for i := range r.o.Models {
		fmt.Fprintf(&b, "  - name: m%d\n    types: [%s]\n    executor: go\n    go: {handler: noop}\n", i+1, taskType)
	}
	path := r.g.Dir + "/models.yaml"
	return path, os.WriteFile(path, []byte(b.String()), 0o644)
}

// startMlsched starts redis-server, the dispatcher and the workers, and a
// reader of the results stream; a task completes when its result is read
// from MLSCHED_RESULTS.
func (r *run) startMlsched(ctx context.Context) error {
	redis, err := r.g.StartRedis("redis")
	if err != nil {
		return err
	}
	r.cpu = append(r.cpu, procGroup{"redis-server", []int{redis.Pid()}})
	var models string
	if isDigits(r.name) {
		models, err = r.digitsModels(ctx)
	} else {
		models, err = r.modelsFile()
	}
	if err != nil {
		return err
	}
	dbin, err := binary("dispatcher")
	if err != nil {
		return err
	}
	wbin, err := binary("worker")
	if err != nil {
		return err
	}
	pport, err := harness.FreePort()
	if err != nil {
		return err
	}
	pprofAddr := fmt.Sprintf("127.0.0.1:%d", pport)
	d, err := r.g.Process("dispatcher", dbin, nil, withEnv(map[string]string{
		"MLSCHED_NATS_URL":        r.natsURL,
		"MLSCHED_NATS_NKEY":       r.seed(authconf.Dispatcher, ""),
		"MLSCHED_REDIS_URL":       redis.URL,
		"MLSCHED_POLICY":          r.o.Policy,
		"MLSCHED_DISPATCHER_NAME": dispatcherName,
		"MLSCHED_PPROF_ADDR":      pprofAddr,
		"MLSCHED_STREAM_REPLICAS": strconv.Itoa(r.o.replicas()),
		"MLSCHED_HTTP_ADDR":       "127.0.0.1:0", // never a fixed port: the workers run on the same host
		"MLSCHED_GROUP_COMMIT":    strconv.FormatBool(r.o.groupCommit()),
	}, r.o.DispatcherEnv))
	if err != nil {
		return err
	}
	if err := d.StartReady(func(ctx context.Context) error { _, err := r.adminStats(); return err }); err != nil {
		return err
	}
	dispatchers := procGroup{Name: "dispatcher", Pids: []int{d.Pid()}}
	for i := 2; i <= r.o.Dispatchers; i++ { // more replicas, on the same streams and Redis
		name := fmt.Sprintf("%s-%d", dispatcherName, i)
		di, err := r.g.Process(name, dbin, nil, withEnv(map[string]string{
			"MLSCHED_NATS_URL":        r.natsURL,
			"MLSCHED_NATS_NKEY":       r.seed(authconf.Dispatcher, ""),
			"MLSCHED_REDIS_URL":       redis.URL,
			"MLSCHED_POLICY":          r.o.Policy,
			"MLSCHED_DISPATCHER_NAME": name,
			"MLSCHED_STREAM_REPLICAS": strconv.Itoa(r.o.replicas()),
			"MLSCHED_HTTP_ADDR":       "127.0.0.1:0",
			"MLSCHED_GROUP_COMMIT":    strconv.FormatBool(r.o.groupCommit()),
		}, r.o.DispatcherEnv))
		if err != nil {
			return err
		}
		if err := di.Start(); err != nil {
			return err
		}
		dispatchers.Pids = append(dispatchers.Pids, di.Pid())
		dispatchers.Name = fmt.Sprintf("dispatchers (%d)", r.o.Dispatchers)
	}
	r.pprofAddr = pprofAddr
	// -dispatcher-env MLSCHED_HTTP_ADDR=off measures the listener's cost
	// (and leaves nothing for the mlsched-observed scenario to watch).
	if addr := r.o.DispatcherEnv["MLSCHED_HTTP_ADDR"]; addr == "" || !opshttp.Disabled(addr) {
		if r.httpURL, err = d.HTTPURL(); err != nil {
			return err
		}
	}
	workers := procGroup{Name: fmt.Sprintf("workers (%d)", r.o.Nodes)}
	for i, node := range r.nodes() {
		env := map[string]string{
			"MLSCHED_NATS_URL":        r.natsURL,
			"MLSCHED_NATS_NKEY":       r.seed(authconf.Node, node),
			"MLSCHED_NODE_ID":         node,
			"MLSCHED_MODELS_FILE":     models,
			"MLSCHED_CONCURRENCY":     strconv.Itoa(r.o.Concurrency),
			"MLSCHED_STREAM_REPLICAS": strconv.Itoa(r.o.replicas()),
			"MLSCHED_HTTP_ADDR":       "127.0.0.1:0", // four workers on one host: no fixed port
		}
		if i == 0 && r.o.ProfilePath != "" { // one worker is profiled: they all run the same code
			wport, err := harness.FreePort()
			if err != nil {
				return err
			}
			r.workerPprofAddr = fmt.Sprintf("127.0.0.1:%d", wport)
			env["MLSCHED_PPROF_ADDR"] = r.workerPprofAddr
		}
		w, err := r.g.Process("worker-"+node, wbin, nil, withEnv(env, r.o.WorkerEnv))
		if err != nil {
			return err
		}
		if err := w.Start(); err != nil {
			return err
		}
		workers.Pids = append(workers.Pids, w.Pid())
	}
	// Route nothing before the dispatcher knows every node.
	wctx, cancel := context.WithTimeout(ctx, harness.ReadyTimeout)
	defer cancel()
	err = harness.WaitFor(wctx, func() error {
		rep, err := r.adminStats()
		if err != nil {
			return err
		}
		if len(rep.Nodes) != r.o.Nodes {
			return fmt.Errorf("the dispatcher sees %d of %d nodes", len(rep.Nodes), r.o.Nodes)
		}
		return nil
	})
	if err != nil {
		return err
	}
	r.cpu = append(r.cpu, dispatchers, workers)
	r.mem = append(r.mem, procGroup{"dispatcher", []int{d.Pid()}})

	cons, err := r.rcvJS.OrderedConsumer(ctx, topology.StreamResults, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{topology.SubjectResultsAll}, DeliverPolicy: jetstream.DeliverNewPolicy})
	if err != nil {
		return fmt.Errorf("results consumer: %w", err)
	}
	prefix := len(topology.ResultSubject(""))
	cc, err := cons.Consume(func(m jetstream.Msg) {
		res, err := protocol.DecodeResult(m.Data()) // what a producer reading results pays (shared/client)
		ok := err == nil && res.Status == protocol.StatusSucceeded
		if subj := m.Subject(); len(subj) > prefix {
			tr := r.tr.Load()
			lo, hi := r.o.Deadlines[0], r.o.Deadlines[1]
			if !ok {
				reason := failReason(res, err)
				if hi > 0 {
					reason += deadlineBucket(deadlineOf(subj[prefix:], lo, hi))
					if err == nil {
						tr.failedResult(subj[prefix:], deadlineOf(subj[prefix:], lo, hi), res)
					}
				}
				tr.failedBecause(subj[prefix:], reason)
			} else if hi > 0 {
				if run, ok := runOf(res); ok {
					tr.succeeded(subj[prefix:], res, run)
				}
			}
			tr.complete(subj[prefix:], ok, time.Now())
		}
	})
	if err != nil {
		return fmt.Errorf("results consumer: %w", err)
	}
	r.stopRcv = append(r.stopRcv, cc.Stop)
	r.log("nats-server, redis-server, dispatcher and %d workers ready", r.o.Nodes)
	return nil
}

// seed is the seed file of a role with authorization, else "" (an empty
// variable is not set).
func (r *run) seed(role, nodeID string) string {
	if r.auth == nil {
		return ""
	}
	return r.auth.Seed(role, nodeID)
}

// withEnv returns base with extra's entries added or overriding.
func withEnv(base, extra map[string]string) map[string]string {
	maps.Copy(base, extra)
	return base
}

func (r *run) adminStats() (protocol.StatsReport, error) {
	var rep protocol.StatsReport
	m, err := r.rcvNC.Request(protocol.SubjectAdminStats, nil, time.Second)
	if err != nil {
		return rep, err
	}
	if err := json.Unmarshal(m.Data, &rep); err != nil {
		return rep, fmt.Errorf("stats report: %w", err)
	}
	if rep.Dispatcher != dispatcherName {
		return rep, fmt.Errorf("stats report of %q, want %q", rep.Dispatcher, dispatcherName)
	}
	return rep, nil
}

// phase submits n tasks (at rate tasks/s, or as fast as possible when rate
// is 0) and waits until every one completed.
func (r *run) phase(ctx context.Context, pub *publisher, label, prefix string, n, rate int) (Phase, error) {
	tr := newTracker(prefix, n, len(r.points))
	r.tr.Store(tr)
	cpu0 := sampleCPU(r.cpu)
	if err := pub.run(ctx, tr, rate); err != nil {
		return Phase{}, fmt.Errorf("%s: %w", label, err)
	}
	// Generous: a phase that cannot finish in this time is broken, not slow.
	timeout := time.Minute + time.Duration(n)*time.Second/200
	select {
	case <-tr.all:
	case <-time.After(timeout):
		return Phase{}, fmt.Errorf("%s: %d of %d tasks did not complete in %v", label, tr.remaining.Load(), n, timeout)
	case <-ctx.Done():
		return Phase{}, ctx.Err()
	}
	p := tr.phase(cpuDelta(cpu0, sampleCPU(r.cpu)))
	if len(r.points) > 0 {
		for k, name := range r.hops {
			p.Hops = append(p.Hops, Hop{Name: name, Latency: tr.hop(k-1, k)})
		}
	}
	r.log("%-18s %7d tasks in %6.2fs: %8.0f tasks/s, p50 %7.2fms p99 %7.2fms, failed %d%s%s, duplicate results %d",
		label, n, p.Seconds, p.Throughput, p.Latency.P50, p.Latency.P99, p.Failed, failedByString(p.FailedBy), lateByString(p.LateBy), p.Duplicates)
	return p, nil
}

// failReason is a failed result's reason: its error code and its last
// attempt's status.
func failReason(res protocol.Result, err error) string {
	if err != nil {
		return "undecodable"
	}
	last := "none"
	if n := len(res.History); n > 0 {
		last = string(res.History[n-1].Status)
	}
	return string(res.ErrorCode) + "/" + last
}

// deadlineBucket names the range of a failed task's deadline (with
// -deadlines): a task whose deadline is shorter than the path itself
// fails whatever the batching.
func deadlineBucket(ms int) string {
	switch {
	case ms < 100:
		return " <100ms"
	case ms < 500:
		return " 100-500ms"
	}
	return " >=500ms"
}

// failedByString is " (reason n, ...)", or "" without failures.
func failedByString(by map[string]int64) string { return countsString(by, " (", ")") }

// countsString lists the counts by key, sorted, between open and close;
// "" when there are none.
func countsString(by map[string]int64, open, close string) string {
	if len(by) == 0 {
		return ""
	}
	keys := slices.Sorted(maps.Keys(by))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, by[k])
	}
	return open + strings.Join(parts, ", ") + close
}

// trace subscribes, with core NATS on a connection of its own, to the
// subjects every hop publishes to, and records when each task is first seen
// on each. The server routes such a message to core subscribers as it hands
// it to the stream, so a point marks the arrival of a publish, before it is
// stored.
func (r *run) trace() error {
	opts := []nats.Option{nats.Name("bench-trace")}
	if r.auth != nil { // no role may watch every subject: the harness user
		opts = append(opts, r.auth.HarnessUser())
	}
	nc, err := nats.Connect(r.natsURL, opts...)
	if err != nil {
		return err
	}
	r.traceNC = nc
	byHeader := func(m *nats.Msg) string { // either dispatch encoding
		if id := m.Header.Get(protocol.HdrTaskID); id != "" {
			return id
		}
		pd, _ := protocol.ParseDispatch(m.Header)
		return pd.TaskID
	}
	type point struct {
		subject string
		id      func(m *nats.Msg) string
		also    string // a second subject of the same point
	}
	var pts []point
	switch r.base {
	case ScenarioRelay:
		pts = []point{{subject: topology.SubjectDispatchAll, id: func(m *nats.Msg) string {
			return strings.TrimPrefix(m.Header.Get(protocol.HdrMsgID), "r:")
		}}}
		r.hops = []string{"submit -> relayed (task stored, relay)", "relayed -> sink (dispatch stored, delivered)"}
	case ScenarioMlsched:
		prefix := len(topology.ResultSubject(""))
		pts = []point{{subject: topology.SubjectDispatchAll, id: byHeader},
			{subject: topology.SubjectOutcomesAll, id: byHeader, also: topology.SubjectReportsAll}, // stored, or reported to a dispatcher
			{subject: topology.SubjectResultsAll, id: func(m *nats.Msg) string {
				if len(m.Subject) > prefix {
					return m.Subject[prefix:]
				}
				return ""
			}}}
		r.hops = []string{"submit -> dispatched (task stored, dispatcher)", "dispatched -> outcome (dispatch stored, worker)",
			"outcome -> result (outcome reported or stored, dispatcher)", "result -> readable (result stored, read)"}
	}
	for k, p := range pts {
		for _, subj := range []string{p.subject, p.also} {
			if subj == "" {
				continue
			}
			sub, err := nc.Subscribe(subj, func(m *nats.Msg) {
				if id := p.id(m); id != "" {
					r.tr.Load().observe(k, id, time.Now())
				}
			})
			if err != nil {
				return err
			}
			if err := sub.SetPendingLimits(-1, -1); err != nil { // a dropped copy would only lose a sample, but keep them all
				return err
			}
		}
		r.points = append(r.points, p.subject)
	}
	return nc.Flush()
}

type profResult struct {
	p   *Profile
	err error
}

// profile takes back-to-back CPU profiles of ProfileSeconds from the
// dispatcher's net/http/pprof until stop is closed, so the measured phases
// are covered whatever their length, merges them into ProfilePath and
// renders the top entries with go tool pprof.
func (r *run) profile(ctx context.Context, stop <-chan struct{}, who, addr, out string) profResult {
	var windows []string
	for i := 0; ; i++ {
		path := fmt.Sprintf("%s.%d", out, i)
		if err := r.profileWindow(ctx, addr, path); err != nil {
			return profResult{err: err}
		}
		windows = append(windows, path)
		select {
		case <-stop:
		default:
			continue
		}
		break
	}
	p := &Profile{Who: who, Path: out, Seconds: r.o.ProfileSeconds * len(windows)}
	merged, err := exec.CommandContext(ctx, "go", append([]string{"tool", "pprof", "-proto"}, windows...)...).Output()
	if err != nil {
		// Without the go tool the windows stay, unmerged.
		p.Path = strings.Join(windows, " ")
		return profResult{p: p}
	}
	if err := os.WriteFile(out, merged, 0o644); err != nil {
		return profResult{err: err}
	}
	for _, w := range windows {
		os.Remove(w)
	}
	if out, err := exec.CommandContext(ctx, "go", "tool", "pprof", "-top", "-nodecount=15", out).Output(); err == nil {
		p.Top = string(out)
	}
	return profResult{p: p}
}

func (r *run) profileWindow(ctx context.Context, addr, path string) error {
	secs := r.o.ProfileSeconds
	cctx, cancel := context.WithTimeout(ctx, time.Duration(secs)*time.Second+30*time.Second)
	defer cancel()
	url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, secs)
	req, err := http.NewRequestWithContext(cctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("profile: %s", resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := f.ReadFrom(resp.Body); err != nil {
		f.Close()
		return fmt.Errorf("profile: %w", err)
	}
	return f.Close()
}

// memSampler records the resident set size of processes every 250ms.
type memSampler struct {
	groups []procGroup
	mu     sync.Mutex
	mem    map[string]*Memory
	quit   chan struct{}
	done   chan struct{}
}

func newMemSampler(groups []procGroup) *memSampler {
	return &memSampler{groups: groups, mem: map[string]*Memory{}, quit: make(chan struct{}), done: make(chan struct{})}
}

func (m *memSampler) sample(first, last bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, g := range m.groups {
		rss, err := RSS(g.Pids[0])
		if err != nil {
			continue
		}
		mib := float64(rss) / (1 << 20)
		e := m.mem[g.Name]
		if e == nil {
			e = &Memory{}
			m.mem[g.Name] = e
		}
		if first {
			e.StartMiB = mib
		}
		if last {
			e.EndMiB = mib
		}
		e.PeakMiB = max(e.PeakMiB, mib)
	}
}

func (m *memSampler) start() {
	m.sample(true, false)
	go func() {
		defer close(m.done)
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-m.quit:
				return
			case <-t.C:
				m.sample(false, false)
			}
		}
	}()
}

func (m *memSampler) stop() map[string]Memory {
	close(m.quit)
	<-m.done
	m.sample(false, true)
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]Memory{}
	for k, v := range m.mem {
		out[k] = *v
	}
	return out
}

// Command mlsched-demo is `make run`: the whole system in one process, on an
// embedded NATS server. It lives in the e2e module, which may depend on both
// the dispatcher and the worker; the shipped binaries do not.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/dispatcher"
	"github.com/mlsched/mlsched/shared/client"
	"github.com/mlsched/mlsched/shared/natsconn"
	"github.com/mlsched/mlsched/shared/natsembed"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/worker"
	"github.com/mlsched/mlsched/worker/digits"
	"github.com/mlsched/mlsched/worker/model"
)

func main() {
	if err := runDemo(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "mlsched-demo:", err)
		os.Exit(1)
	}
}

// runDemo is `make run`: an embedded NATS server with JetStream, one
// dispatcher (in-memory statistics, or Redis when MLSCHED_REDIS_URL is set),
// three worker nodes whose simulated models differ in reliability and
// latency, and a producer submitting a steady stream of tasks. It prints a
// live per-model table; Ctrl-C stops everything and prints a summary.
func runDemo(args []string) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	rate := fs.Int("rate", 100, "tasks submitted per second")
	duration := fs.Duration("duration", 0, "stop after this long (0: run until Ctrl-C)")
	every := fs.Duration("every", 2*time.Second, "table refresh interval")
	policy := fs.String("policy", "reliability", "dispatcher policy")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	if *duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *duration)
		defer cancel()
	}
	return demo(ctx, os.Stdout, demoOptions{httpAddr: os.Getenv("MLSCHED_HTTP_ADDR"), rate: *rate, every: *every, policy: *policy, redisURL: os.Getenv("MLSCHED_REDIS_URL")})
}

type demoOptions struct {
	httpAddr string // the dispatcher's listener ("": localhost:9090 or a free port; "off": none)
	rate     int
	every    time.Duration
	policy   string
	redisURL string
}

// demoNodes: "fast-flaky" answers in ~5ms but fails 25% of the time,
// "steady" takes ~30ms and fails 1%, "balanced" ~15ms and 6%. "digits-go"
// really computes: a handwritten-digit classifier (worker/digits) trained at
// start, serving task type "digits".
func demoNodes() map[string][]model.Spec {
	digitsGo := model.Spec{Name: "digits-go", Types: []string{"digits"}, Executor: model.ExecutorGo,
		Go: &model.GoSpec{Handler: "digits"}, Timeout: model.Duration(2 * time.Second)}
	sim := func(name string, median time.Duration, fail float64) model.Spec {
		return model.Spec{Name: name, Types: []string{"classify"}, Executor: "sim", Timeout: model.Duration(2 * time.Second),
			Sim: &model.SimSpec{FailureRate: fail,
				Latency: model.Latency{Dist: "lognormal", Median: model.Duration(median), Sigma: 0.3}}}
	}
	flaky, steady, balanced := sim("fast-flaky", 5*time.Millisecond, 0.25), sim("steady", 30*time.Millisecond, 0.01),
		sim("balanced", 15*time.Millisecond, 0.06)
	return map[string][]model.Spec{
		"node-1": {flaky, steady, digitsGo},
		"node-2": {steady, balanced},
		"node-3": {flaky, balanced, digitsGo},
	}
}

func demo(ctx context.Context, out io.Writer, o demoOptions) error {
	srv, err := natsembed.Start("")
	if err != nil {
		return err
	}
	defer srv.Shutdown()
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	quiet := zerolog.New(os.Stderr).Level(zerolog.ErrorLevel).With().Timestamp().Logger()

	cfg := dispatcher.DefaultConfig()
	cfg.NATS.URL, cfg.RedisURL, cfg.Name, cfg.Policy = srv.ClientURL(), o.redisURL, "demo", o.policy
	cfg.StatsWindow, cfg.StatsBucket = time.Minute, 2*time.Second
	// The dashboard is served by default, on localhost:9090 (or
	// MLSCHED_HTTP_ADDR; "off" for none), or any free port if 9090 is taken.
	cfg.HTTPAddr = o.httpAddr
	if cfg.HTTPAddr == "" {
		cfg.HTTPAddr = "127.0.0.1:9090"
		if l, err := net.Listen("tcp", cfg.HTTPAddr); err != nil {
			cfg.HTTPAddr = "127.0.0.1:0"
		} else {
			l.Close()
		}
	}
	cfg.DashboardRefresh = time.Second
	d, err := dispatcher.New(cfg, dispatcher.WithLogger(quiet.With().Str("component", "dispatcher").Logger()))
	if err != nil {
		return err
	}
	runCtx, stopAll := context.WithCancel(context.Background())
	defer stopAll()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	wg.Add(1)
	go func() { defer wg.Done(); errs <- d.Run(runCtx) }()
	for node, specs := range demoNodes() {
		w, err := worker.New(worker.Config{NATS: natsconn.Config{URL: srv.ClientURL()}, NodeID: node, Concurrency: 16},
			worker.WithModels(specs), worker.WithLogger(quiet.With().Str("component", "worker").Logger()))
		if err != nil {
			return err
		}
		wg.Add(1)
		go func() { defer wg.Done(); errs <- w.Run(runCtx) }()
	}

	// Every fifth task is a digit image the classifier never saw in training.
	images, err := digits.Dataset()
	if err != nil {
		return err
	}
	_, heldOut := digits.Split(images)
	var labels sync.Map // task id → the image's label
	dg := &digitScore{}

	// count results as they are published
	var counts sync.Map // status → *atomic.Int64
	var finished atomic.Int64
	sub, err := nc.Subscribe("mlsched.results.>", func(m *nats.Msg) {
		var r protocol.Result
		if json.Unmarshal(m.Data, &r) != nil {
			return
		}
		if want, ok := labels.LoadAndDelete(r.ID); ok {
			dg.add(r, want.(int))
		}
		v, _ := counts.LoadOrStore(string(r.Status), new(atomic.Int64))
		v.(*atomic.Int64).Add(1)
		finished.Add(1)
	})
	if err != nil {
		return err
	}
	defer sub.Unsubscribe()

	c := client.New(js)
	fmt.Fprintf(out, "mlsched demo: 3 nodes, models fast-flaky (5ms, 25%% failures), balanced (15ms, 6%%), steady (30ms, 1%%) "+
		"and digits-go (a digit classifier trained at start); policy %s; %d tasks/s. Ctrl-C to stop.\n", o.policy, o.rate)
	if cfg.HTTPAddr != "off" {
		if url := dashboardURL(d); url != "" {
			fmt.Fprintf(out, "dashboard: %s\n", url)
		}
	}
	var submitted, seq int64 // tasks stored; ids handed out
	tick := time.NewTicker(time.Second / time.Duration(max(o.rate, 1)))
	defer tick.Stop()
	show := time.NewTicker(o.every)
	defer show.Stop()
	started := time.Now()
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case err := <-errs:
			return fmt.Errorf("demo component stopped: %w", err)
		case <-tick.C:
			seq++
			t := protocol.Task{ID: fmt.Sprintf("demo-%d", seq), Type: "classify", Payload: json.RawMessage(`{"text":"hello"}`)}
			if seq%5 == 0 {
				img := heldOut[int(seq/5)%len(heldOut)]
				t.Type, t.Payload = "digits", mustJSON(map[string]any{"pixels": img.Pixels})
				labels.Store(t.ID, img.Label)
			}
			// Not cancelled by the end of the run: a submit cut off there
			// may or may not be stored, and the summary would wait for a
			// result that may never come (make run, once: 10 s silent
			// for one task). Only a stored task counts as submitted.
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_, err := c.Submit(sctx, t)
			cancel()
			if err != nil {
				labels.Delete(t.ID)
				fmt.Fprintln(os.Stderr, "submit:", err)
				continue
			}
			submitted++
		case <-show.C:
			printDemoTable(out, d.Report(), submitted, finished.Load(), &counts, time.Since(started))
			dg.print(out)
		}
	}
	// let the tasks in flight finish, bounded
	deadline := time.Now().Add(10 * time.Second)
	for finished.Load() < submitted && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	fmt.Fprintln(out, "\nsummary")
	rep := d.Report()
	printDemoTable(out, rep, submitted, finished.Load(), &counts, time.Since(started))
	dg.print(out)
	explain(out, rep, o.policy)
	stopAll()
	wg.Wait()
	return nil
}

func printDemoTable(out io.Writer, r *protocol.StatsReport, submitted, finished int64, counts *sync.Map, elapsed time.Duration) {
	status := func(s protocol.Status) int64 {
		if v, ok := counts.Load(string(s)); ok {
			return v.(*atomic.Int64).Load()
		}
		return 0
	}
	fmt.Fprintf(out, "\n%s  submitted %d  results %d (succeeded %d, failed %d, rejected %d)  store %s\n",
		elapsed.Round(time.Second), submitted, finished, status(protocol.StatusSucceeded), status(protocol.StatusFailed),
		status(protocol.StatusRejected), r.Store)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "model\ttraffic\tsuccess\tp50 ms\tp95 ms\tin flight\tbreaker\t")
	for _, m := range r.Models {
		fmt.Fprintf(tw, "%s\t%.1f%%\t%.1f%%\t%.1f\t%.1f\t%d\t%s\t\n", m.Name, 100*m.TrafficShare, 100*m.SuccessRate,
			m.P50Ms, m.P95Ms, m.InFlight, m.Breaker)
	}
	_ = tw.Flush()
	if r.Degraded {
		fmt.Fprintln(out, "DEGRADED:", strings.TrimSpace(r.DegradedReason))
	}
}

// dashboardURL waits, up to 10 s, for the dispatcher to serve its
// dashboard (the listener binds as Run starts, the page once connected),
// and returns its URL ("" if it does not come up).
func dashboardURL(d *dispatcher.Dispatcher) string {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		a := d.HTTPAddr()
		if a == nil {
			continue
		}
		url := "http://" + a.String() + "/"
		if resp, err := http.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return url
			}
		}
	}
	return ""
}

// explain says, under the summary's table, what the table shows: which
// classify model got the traffic, and how little the fastest one got when
// it is the least reliable — the point of the demo.
func explain(out io.Writer, r *protocol.StatsReport, policy string) {
	var classify []protocol.ModelReport
	for _, m := range r.Models {
		if m.Name != "digits-go" && m.Dispatched > 0 {
			classify = append(classify, m)
		}
	}
	if len(classify) < 2 {
		return
	}
	fastest, most := classify[0], classify[0]
	for _, m := range classify {
		if m.P50Ms > 0 && (fastest.P50Ms <= 0 || m.P50Ms < fastest.P50Ms) {
			fastest = m
		}
		if m.TrafficShare > most.TrafficShare {
			most = m
		}
	}
	fmt.Fprintf(out, "\nWhat this shows: the %s policy sent the most classify tasks (%.1f%% of all tasks) to %s, "+
		"which succeeded %.1f%% of the time at p50 %.1f ms.", policy, 100*most.TrafficShare, most.Name, 100*most.SuccessRate, most.P50Ms)
	if fastest.Name != most.Name {
		fmt.Fprintf(out, " The fastest model, %s (p50 %.1f ms), succeeded only %.1f%% of the time and got %.1f%% of the traffic: "+
			"a scheduler that picks the fastest answer would have sent it everything.", fastest.Name, fastest.P50Ms,
			100*fastest.SuccessRate, 100*fastest.TrafficShare)
	}
	fmt.Fprintln(out, " digits-go serves the digit images (every fifth task).")
}

// digitScore counts the digit classifier's answers against the labels.
type digitScore struct{ done, right, failed atomic.Int64 }

func (s *digitScore) add(r protocol.Result, want int) {
	s.done.Add(1)
	var out struct {
		Label *int `json:"label"`
	}
	switch {
	case r.Status != protocol.StatusSucceeded || json.Unmarshal(r.Output, &out) != nil || out.Label == nil:
		s.failed.Add(1)
	case *out.Label == want:
		s.right.Add(1)
	}
}

func (s *digitScore) print(out io.Writer) {
	done, right := s.done.Load(), s.right.Load()
	if done == 0 {
		return
	}
	fmt.Fprintf(out, "digits: %d of %d held-out images classified right (%.1f%%), %d without a prediction\n",
		right, done, 100*float64(right)/float64(done), s.failed.Load())
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

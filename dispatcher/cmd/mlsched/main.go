// Command mlsched is the operator and producer CLI of mlsched: it submits
// tasks and waits for their results, shows the dispatchers' statistics and
// the live nodes, inspects and replays dead letters, and runs the simulator.
// The local demo is `make run` (e2e/cmd/mlsched-demo).
//
// Exit codes: 0 success; 1 an operation failed (connection, I/O, no result);
// 2 usage error (a bad flag or flag value: an id, a type, a timeout); 3
// partial: some task did not succeed (`result`, `wait` and `submit -wait`
// alike), or was not submitted
// because its line was bad, or a dead letter could not be replayed); 4 cancel
// found no such task; 5 cancel found the task already finished.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/shared/client"
	"github.com/mlsched/mlsched/shared/config"
	"github.com/mlsched/mlsched/shared/natsconn"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailed  = 1
	exitUsage   = 2
	exitPartial = 3
	// exitUnknown: `cancel` found no task with that id.
	exitUnknown = 4
	// exitFinished: `cancel` found the task already has its final result.
	exitFinished = 5
)

// errPartial makes a subcommand exit with exitPartial after it has printed
// what went wrong.
var errPartial = errors.New("partial success")

// errUsage makes a subcommand exit with exitUsage.
var errUsage = errors.New("usage")

// Config is the CLI's environment configuration.
type Config struct {
	// NATS is how to reach NATS (MLSCHED_NATS_*; default
	// nats://127.0.0.1:4222, no credentials); -nats overrides the URL.
	NATS natsconn.Config
	// Storage of streams the CLI creates when none exist: file or memory
	// (default file). Use the dispatcher's value.
	Storage string `envconfig:"STORAGE" default:"file" desc:"stream storage when creating streams: file or memory"`
	// MaxPayloadBytes bounds a task, as the dispatcher's limit (default 1048576).
	MaxPayloadBytes int `envconfig:"MAX_PAYLOAD_BYTES" default:"1048576" desc:"task size limit used for local validation"`
	// Log configures the logger (MLSCHED_LOG_FORMAT, MLSCHED_LOG_LEVEL);
	// embedded so that the variables carry no extra prefix.
	config.Log
}

// app is what a subcommand runs with.
type app struct {
	cfg            Config
	stdin          io.Reader
	stdout, stderr io.Writer
	log            zerolog.Logger
	nc             *nats.Conn
	js             jetstream.JetStream
	client         *client.Client
	timeout        time.Duration // per request
	inbox          string        // the role's inbox prefix: admin or producer
	// progressEvery: how often a wait reports on stderr (0: never);
	// waiting is the one task waited for, when there is one, to say why
	// it may wait.
	progressEvery time.Duration
	waiting       *protocol.Task
}

type command struct {
	name, summary string
	run           func(ctx context.Context, a *app, args []string) error
	// admin commands connect with the admin role's inbox prefix, the
	// others with the producer's (docs/security.md).
	admin bool
}

func commands() []command {
	return []command{
		{name: "submit", summary: "submit one task or a JSON-lines file of tasks, optionally waiting for results", run: runSubmit},
		{name: "wait", summary: "wait for the results of task ids and print them", run: runWait},
		{name: "result", summary: "print a task's result if it exists", run: runResult},
		{name: "stats", summary: "show a dispatcher's statistics, breakers and degraded mode", run: runStats, admin: true},
		{name: "top", summary: "live view of the whole cluster: models, breakers, nodes, backlog, dead letters", run: runTop, admin: true},
		{name: "cancel", summary: "cancel a task that has no result yet: it gets a cancelled result", run: runCancel, admin: true},
		{name: "nodes", summary: "list live worker nodes", run: runNodes, admin: true},
		{name: "rollout", summary: "start, follow and steer a model version's rollout: status, pause, resume, promote, abort, history", run: runRollout, admin: true},
		{name: "autoscale", summary: "scale worker pools from arrival rate, service time and backlog (compose), or recommend (-dry-run, metric)", run: runAutoscale, admin: true},
		{name: "dlq", summary: "list, show or replay dead letters", run: runDLQ, admin: true},
		{name: "auth", summary: "write NATS nkeys and least-privilege permissions per role (auth init)", run: runAuth},
		{name: "simulate", summary: "run the scheduling simulator",
			run: func(_ context.Context, _ *app, args []string) error { return runSimulate(args) }},
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run is the whole CLI, callable in-process by tests.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	var cfg Config
	if err := config.Load(&cfg); err != nil {
		fmt.Fprintln(stderr, "mlsched:", err)
		return exitUsage
	}
	if cfg.Storage != "file" && cfg.Storage != "memory" {
		fmt.Fprintf(stderr, "mlsched: invalid %s_STORAGE=%q: want file or memory\n", config.Prefix, cfg.Storage)
		return exitUsage
	}
	fs := flag.NewFlagSet("mlsched", flag.ContinueOnError)
	fs.SetOutput(stderr)
	natsURL := fs.String("nats", cfg.NATS.URL, "NATS server URL (env MLSCHED_NATS_URL)")
	timeout := fs.Duration("timeout", 10*time.Second, "timeout of each request to NATS")
	showVersion := fs.Bool("version", false, "print the version and exit")
	fs.Usage = func() { usage(stderr, fs) }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if *showVersion {
		fmt.Fprintln(stdout, versionString())
		return exitOK
	}
	if fs.NArg() == 0 {
		usage(stderr, fs)
		return exitUsage
	}
	name, rest := fs.Arg(0), fs.Args()[1:]
	var cmd *command
	for _, c := range commands() {
		if c.name == name {
			cmd = &c
			break
		}
	}
	if cmd == nil {
		fmt.Fprintf(stderr, "mlsched: unknown command %q\n\n", name)
		usage(stderr, fs)
		return exitUsage
	}
	a := &app{cfg: cfg, stdin: stdin, stdout: stdout, stderr: stderr, timeout: *timeout, inbox: natsconn.InboxProducer,
		progressEvery: time.Second}
	if cmd.admin {
		a.inbox = natsconn.InboxAdmin
	}
	a.cfg.NATS.URL = *natsURL
	log, err := cfg.Logger("mlsched")
	if err != nil {
		fmt.Fprintln(stderr, "mlsched:", err)
		return exitUsage
	}
	a.log = log
	defer func() {
		if a.nc != nil {
			a.nc.Close()
		}
	}()
	err = cmd.run(ctx, a, rest)
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.Is(err, errUsage):
		return exitUsage
	case errors.Is(err, errPartial):
		return exitPartial
	case errors.Is(err, errUnknownTask):
		return exitUnknown
	case errors.Is(err, errFinished):
		return exitFinished
	default:
		fmt.Fprintf(stderr, "mlsched %s: %v\n", name, err)
		return exitFailed
	}
}

func usage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprint(w, `usage: mlsched [-nats URL] [-timeout D] <command> [flags]

Commands:
`)
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-9s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, "\nRun 'mlsched <command> -h' for a command's flags.\n\nGlobal flags:\n")
	fs.PrintDefaults()
	fmt.Fprint(w, "\nEnvironment:\n")
	_ = config.Usage(w, &Config{})
	fmt.Fprint(w, `
Exit codes: 0 success, 1 failure, 2 usage error,
3 partial (a task did not succeed, a line was bad, an entry was not replayed),
4 cancel: no such task, 5 cancel: the task had already finished.
`)
}

// connect dials NATS; subcommands call it once their flags are parsed, so
// -h and usage errors need no server.
func (a *app) connect() error {
	if a.nc != nil {
		return nil
	}
	nc, err := natsconn.Connect(a.cfg.NATS, natsconn.Conn{
		Name: "mlsched-cli", Inbox: a.inbox, Log: &a.log, Timeout: a.timeout,
	})
	if err != nil {
		return err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return fmt.Errorf("jetstream: %w", err)
	}
	a.nc, a.js = nc, js
	a.client = client.New(js, client.WithLimits(a.limits()), client.WithTopology(a.topology()))
	return nil
}

func (a *app) limits() protocol.Limits {
	return protocol.Limits{MaxPayloadBytes: a.cfg.MaxPayloadBytes}
}

func (a *app) topology() topology.Config {
	var tc topology.Config
	if a.cfg.Storage == "memory" {
		tc.Storage = jetstream.MemoryStorage
	}
	return tc
}

// reqCtx bounds one request by the -timeout flag.
func (a *app) reqCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, a.timeout)
}

// newFlags makes a subcommand's flag set, with usage on -h.
func (a *app) newFlags(name, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet("mlsched "+name, flag.ContinueOnError)
	fs.SetOutput(a.stderr)
	fs.Usage = func() {
		fmt.Fprintf(a.stderr, "usage: mlsched %s\n\nFlags:\n", synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// parse parses a subcommand's flags, mapping errors to errUsage.
func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	return nil
}

// parseAndConnect parses a subcommand's flags, then connects.
func (a *app) parseAndConnect(fs *flag.FlagSet, args []string) error {
	if err := parse(fs, args); err != nil {
		return err
	}
	return a.connect()
}

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/dispatcher/autoscale"
	"github.com/mlsched/mlsched/dispatcher/autoscaler"
	"github.com/mlsched/mlsched/shared/natsconn"
	"github.com/mlsched/mlsched/shared/opshttp"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

const autoscaleSynopsis = `autoscale [-dry-run] [-once] [-backend auto|compose|heartbeats] [-min N] [-max N] [-cooldown D] [flags]`

// runAutoscale is `mlsched autoscale`: the scaler of worker pools
// (dispatcher/autoscaler, docs/operations.md "Autoscaling"). With no flag it
// scales the compose project of the working directory when a compose CLI
// and a project are there, and otherwise recommends only (pools derived
// from the workers' heartbeats), through the MLSCHED_AUTOSCALE bucket and
// the mlsched_autoscale_recommended_replicas metric.
func runAutoscale(ctx context.Context, a *app, args []string) error {
	fs := a.newFlags("autoscale", autoscaleSynopsis)
	dry := fs.Bool("dry-run", false, "decide and print what would be done and why, without scaling")
	once := fs.Bool("once", false, "one decision from two observations min(-interval, 2s) apart, then exit (with -dry-run: what would be done now)")
	backend := fs.String("backend", "auto", "auto (compose when a compose project is found, else heartbeats), compose, or heartbeats (recommend only)")
	project := fs.String("project", os.Getenv("COMPOSE_PROJECT_NAME"), "compose project name (default: compose's own, from the directory)")
	files := fs.String("f", os.Getenv("COMPOSE_FILE"), "compose files, comma or colon separated (default: compose's own)")
	dir := fs.String("dir", "", "compose project directory (default: the working directory)")
	services := fs.String("services", "", "only these compose services are pools, comma separated (default: every service whose containers announce worker heartbeats)")
	interval := fs.Duration("interval", 5*time.Second, "time between decisions")
	minR := fs.Int("min", 1, "fewest replicas per pool (0 lets an idle pool stop; never the last worker of a model that has work)")
	maxR := fs.Int("max", 10, "most replicas per pool")
	util := fs.Float64("utilisation", 0.7, "target busy share of the workers' slots, in (0, 1]")
	drain := fs.Duration("drain", 30*time.Second, "time within which the backlog should drain (the tasks' deadline, or less)")
	cooldown := fs.Duration("cooldown", 2*time.Minute, "a scale-in needs a whole cooldown of lower recommendations, and none within it of a scale-up")
	upStep := fs.Int("up-step", 4, "a scale-up adds at most max(up-step, current×(up-factor-1)) replicas per decision")
	upFactor := fs.Float64("up-factor", 2, "see -up-step")
	downFraction := fs.Float64("down-fraction", 0.5, "a scale-in removes at most this fraction of the replicas per decision (at least one)")
	policy := fs.String("policy", "mlsched", "mlsched (this formula) or keda (KEDA's ceil(lag/10), for comparison)")
	httpAddr := fs.String("http", ":9096", "listen address of /metrics and /healthz (off: none)")
	if err := parse(fs, args); err != nil {
		return err
	}
	lim := autoscale.Limits{Min: *minR, Max: *maxR, Utilisation: *util, DrainWithin: *drain, UpStep: *upStep, UpFactor: *upFactor,
		DownFraction: *downFraction, Cooldown: *cooldown}
	if err := lim.Validate(); err != nil {
		fmt.Fprintf(a.stderr, "mlsched autoscale: %v\n", err)
		return errUsage
	}
	if *interval <= 0 {
		fmt.Fprintln(a.stderr, "mlsched autoscale: -interval must be positive")
		return errUsage
	}
	if err := opshttp.ValidateAddr(*httpAddr); err != nil {
		fmt.Fprintf(a.stderr, "mlsched autoscale: -http: %v\n", err)
		return errUsage
	}
	limits := func(string) autoscale.Limits { return lim }
	var pol autoscale.Policy
	switch *policy {
	case "mlsched":
		pol = autoscale.NewScaler(autoscale.ScalerParams{Limits: limits})
	case "keda":
		pol = autoscale.NewKEDA(autoscale.KEDAParams{Limits: limits})
	default:
		fmt.Fprintf(a.stderr, "mlsched autoscale: -policy %q: want mlsched or keda\n", *policy)
		return errUsage
	}
	nc, err := natsconn.ConnectContext(ctx, a.cfg.NATS, natsconn.Conn{Name: "mlsched-autoscale", Inbox: a.inbox, Log: &a.log,
		Retry: !*once, Timeout: a.timeout})
	if err != nil {
		return err
	}
	a.nc = nc
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	be, note, err := chooseBackend(ctx, *backend, composeSpec{project: *project, files: *files, dir: *dir, services: *services}, js)
	if err != nil {
		fmt.Fprintf(a.stderr, "mlsched autoscale: %v\n", err)
		return errUsage
	}
	if note != "" {
		fmt.Fprintln(a.stderr, "mlsched autoscale:", note)
	}
	reg := opshttp.NewRegistry()
	as, err := autoscaler.New(autoscaler.Params{NC: nc, JS: js, Backend: be, Policy: pol, DryRun: *dry || be.Name() == "heartbeats",
		Out: a.stdout, Log: a.log, Registerer: reg, Lag: *policy == "keda", Wait: min(a.timeout, 2*time.Second), Topology: a.topology()})
	if err != nil {
		return err
	}
	if *once {
		if err := as.Warm(ctx); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(min(*interval, 2*time.Second)):
		}
		ds, err := as.Step(ctx)
		if err != nil {
			return err
		}
		if len(ds) == 0 {
			fmt.Fprintf(a.stdout, "no worker pool found (backend %s): no worker announces itself yet\n", be.Name())
		}
		return nil
	}
	srv, err := opshttp.Listen(*httpAddr, opshttp.Options{Gatherer: reg})
	if err != nil {
		return err
	}
	if srv != nil {
		defer srv.Close(context.Background())
	}
	a.log.Info().Str("backend", be.Name()).Bool("dry_run", *dry).Dur("interval", *interval).Int("min", lim.Min).Int("max", lim.Max).
		Dur("cooldown", lim.Cooldown).Str("policy", *policy).Msg("autoscaling")
	return as.Run(ctx, *interval)
}

type composeSpec struct{ project, files, dir, services string }

func splitAny(s string, seps string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return strings.ContainsRune(seps, r) })
}

// chooseBackend builds the backend the flags name; auto takes compose when
// a compose CLI lists a project here, heartbeats otherwise, and says why.
func chooseBackend(ctx context.Context, name string, cs composeSpec, js jetstream.JetStream) (autoscaler.Backend, string, error) {
	heartbeats := &autoscaler.Heartbeats{Nodes: func(ctx context.Context) ([]protocol.Heartbeat, error) { return liveNodes(ctx, js) }}
	mk := func() (*autoscaler.Compose, error) {
		cmd, err := autoscaler.DetectCompose(ctx)
		if err != nil {
			return nil, err
		}
		return &autoscaler.Compose{Command: cmd, Project: cs.project, Files: splitAny(cs.files, ",:"), Dir: cs.dir,
			Services: splitAny(cs.services, ",")}, nil
	}
	switch name {
	case "heartbeats":
		return heartbeats, "backend heartbeats: recommending only (the MLSCHED_AUTOSCALE bucket and the metric)", nil
	case "compose":
		c, err := mk()
		if err != nil {
			return nil, "", err
		}
		if _, err := c.Pools(ctx); err != nil {
			return nil, "", fmt.Errorf("backend compose: %w", err)
		}
		return c, "", nil
	case "auto":
		c, err := mk()
		if err == nil {
			if _, err = c.Pools(ctx); err == nil {
				return c, "backend compose (found a compose project)", nil
			}
		}
		return heartbeats, fmt.Sprintf("no compose project here (%v): recommending only, pools from the workers' heartbeats", oneLine(err.Error(), 160)), nil
	}
	return nil, "", fmt.Errorf("-backend %q: want auto, compose or heartbeats", name)
}

// liveNodes reads the live heartbeats from MLSCHED_NODES.
func liveNodes(ctx context.Context, js jetstream.JetStream) ([]protocol.Heartbeat, error) {
	kv, err := js.KeyValue(ctx, topology.BucketNodes)
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", topology.BucketNodes, err)
	}
	lister, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	defer lister.Stop()
	var out []protocol.Heartbeat
	for k := range lister.Keys() {
		e, err := kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		var hb protocol.Heartbeat
		if json.Unmarshal(e.Value(), &hb) == nil && hb.Node != "" {
			out = append(out, hb)
		}
	}
	return out, nil
}

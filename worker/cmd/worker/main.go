// Command worker runs one mlsched worker node, configured by MLSCHED_*
// environment variables (run with -h to list them) and a models file.
//
// SIGTERM or SIGINT drains the node and exits 0; an invalid configuration
// exits 2 with a message naming the variable or the models file entry.
package main

import (
	"context"
	"fmt"
	"net/http"
	_ "net/http/pprof" // served on MLSCHED_PPROF_ADDR only
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/mlsched/mlsched/shared/config"
	"github.com/mlsched/mlsched/shared/opshttp"
	"github.com/mlsched/mlsched/worker"
)

func main() { os.Exit(run()) }

func run() int {
	var cfg worker.Config
	if len(os.Args) > 1 && (os.Args[1] == "-h" || os.Args[1] == "-help" || os.Args[1] == "--help") {
		fmt.Fprintln(os.Stderr, "usage: worker              run a node (configured by environment variables)")
		fmt.Fprintln(os.Stderr, "       worker healthcheck  exit 0 when the local /readyz answers 2xx (container health check)")
		_ = config.Usage(os.Stderr, &cfg)
		return 0
	}
	if len(os.Args) > 1 && os.Args[1] == "healthcheck" {
		return healthcheck()
	}
	config.ApplyGCDefault()
	cfg, err := worker.LoadConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 2
	}
	if cfg.PprofAddr != "" {
		go func() {
			fmt.Fprintln(os.Stderr, "worker: pprof server stopped:", http.ListenAndServe(cfg.PprofAddr, nil))
		}()
	}
	log, err := cfg.Log.Logger("worker")
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 2
	}
	w, err := worker.New(cfg, worker.WithLogger(log))
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 2 // New fails only on configuration: variables or models file
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := w.Run(ctx); err != nil {
		// In the configured log format, as the dispatcher reports its own.
		log.Error().Err(err).Msg("worker failed")
		return 1
	}
	return 0
}

// healthcheck is the container health check: GET /readyz (or the path
// given) on MLSCHED_HTTP_ADDR (default :9091); exit 0 on a 2xx answer.
func healthcheck() int {
	path := "/readyz"
	if len(os.Args) > 2 {
		path = os.Args[2]
	}
	addr, ok := os.LookupEnv(opshttp.EnvAddr)
	if !ok {
		addr = ":9091"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := opshttp.Probe(ctx, addr, path); err != nil {
		fmt.Fprintln(os.Stderr, "worker healthcheck:", err)
		return 1
	}
	return 0
}

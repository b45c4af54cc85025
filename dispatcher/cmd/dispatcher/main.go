// Command dispatcher runs one mlsched dispatcher replica. Configuration comes
// from MLSCHED_* environment variables (see README.md); SIGTERM or SIGINT
// drains it and exits 0.
package main

import (
	"context"
	"fmt"
	"net/http"
	_ "net/http/pprof"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/mlsched/mlsched/dispatcher"
	"github.com/mlsched/mlsched/shared/config"
	"github.com/mlsched/mlsched/shared/opshttp"
)

// healthcheck is the container health check of an image without a shell:
// `dispatcher healthcheck` GETs /readyz (or the path given) on the local
// listener, MLSCHED_HTTP_ADDR, and exits 0 when it answers 2xx, else 1.
func healthcheck() int {
	path := "/readyz"
	if len(os.Args) > 2 {
		path = os.Args[2]
	}
	addr, ok := os.LookupEnv(opshttp.EnvAddr)
	if !ok {
		addr = dispatcher.DefaultConfig().HTTPAddr
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := opshttp.Probe(ctx, addr, path); err != nil {
		fmt.Fprintln(os.Stderr, "dispatcher healthcheck:", err)
		return 1
	}
	return 0
}

func main() {
	if len(os.Args) > 1 && (os.Args[1] == "-h" || os.Args[1] == "-help" || os.Args[1] == "--help") {
		fmt.Fprintln(os.Stderr, "usage: dispatcher              run a replica, configured by environment variables:")
		fmt.Fprintln(os.Stderr, "       dispatcher healthcheck  exit 0 when the local /readyz answers 2xx (container health check)")
		fmt.Fprintln(os.Stderr, "       dispatcher proxy LISTEN TARGET  forward TCP connections to TARGET, resolved per connection (compose's dashboard service)")
		_ = config.Usage(os.Stderr, &dispatcher.Config{})
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "healthcheck" {
		os.Exit(healthcheck())
	}
	if len(os.Args) > 1 && os.Args[1] == "proxy" {
		os.Exit(runProxy(os.Args[2:]))
	}
	config.ApplyGCDefault()
	cfg, err := dispatcher.LoadConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, "dispatcher:", err)
		os.Exit(2)
	}
	log, err := cfg.Log.Logger("dispatcher")
	if err != nil {
		fmt.Fprintln(os.Stderr, "dispatcher:", err)
		os.Exit(2)
	}
	if cfg.PprofAddr != "" {
		go func() { log.Warn().Err(http.ListenAndServe(cfg.PprofAddr, nil)).Msg("pprof server stopped") }()
	}
	d, err := dispatcher.New(cfg, dispatcher.WithLogger(log))
	if err != nil {
		fmt.Fprintln(os.Stderr, "dispatcher:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := d.Run(ctx); err != nil {
		log.Error().Err(err).Msg("dispatcher failed")
		os.Exit(1)
	}
}

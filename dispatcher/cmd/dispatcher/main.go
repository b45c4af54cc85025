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

	"github.com/mlsched/mlsched/dispatcher"
	"github.com/mlsched/mlsched/shared/config"
)

func main() {
	if len(os.Args) > 1 && (os.Args[1] == "-h" || os.Args[1] == "-help" || os.Args[1] == "--help") {
		fmt.Fprintln(os.Stderr, "dispatcher: configured by environment variables:")
		_ = config.Usage(os.Stderr, &dispatcher.Config{})
		return
	}
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

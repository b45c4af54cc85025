// Command mlsched-docpath runs one task at a time through a dispatcher and a
// worker in this process and prints, as JSON, the project files with code
// that ran for the task: a block of code that ran in each of three tasks'
// windows (from Submit to Wait, the coverage counters cleared before) and in
// none of the idle windows between them (timers) is on the task's path. Build it with coverage counters in atomic mode over the
// project (go build -cover -covermode=atomic
// -coverpkg=github.com/mlsched/mlsched/...); e2e's
// TestDocPathIsTheTraceOfOneTask does, and holds dispatcher/doc.go's list to
// what it prints (issue 37).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/coverage"
	"slices"
	"strings"
	"time"

	"github.com/mlsched/mlsched/dispatcher"
	"github.com/mlsched/mlsched/shared/client"
	"github.com/mlsched/mlsched/shared/natsconn"
	"github.com/mlsched/mlsched/shared/natstest"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/worker"
	"github.com/mlsched/mlsched/worker/model"
)

// modulePath is the project's import path prefix.
const modulePath = "github.com/mlsched/mlsched/"

// Report is what the command prints.
type Report struct {
	// Path: files with a block that ran in every task's window and in no
	// idle window.
	Path []string `json:"path"`
	// Ran: files that ran in any task's window.
	Ran []string `json:"ran"`
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "mlsched-docpath:", err)
		os.Exit(1)
	}
}

func run() error {
	srv, err := natstest.Start("")
	if err != nil {
		return err
	}
	defer srv.Shutdown()
	nc := natsconn.Config{URL: srv.ClientURL()}
	dcfg := dispatcher.DefaultConfig()
	dcfg.NATS, dcfg.HTTPAddr = nc, "off"
	d, err := dispatcher.New(dcfg)
	if err != nil {
		return err
	}
	w, err := worker.New(worker.Config{NATS: nc, NodeID: "node-1", HTTPAddr: "off"},
		worker.WithHandler("upper", func(ctx context.Context, t worker.Task) (any, error) {
			var s string
			if err := json.Unmarshal(t.Payload, &s); err != nil {
				return nil, &worker.TaskError{Msg: "payload must be a string", Err: err}
			}
			return strings.ToUpper(s), nil
		}),
		worker.WithModels([]worker.ModelSpec{{Name: "upper-v1", Types: []string{"text"},
			Executor: model.ExecutorGo, Go: &model.GoSpec{Handler: "upper"}}}))
	if err != nil {
		return err
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 2)
	go func() { done <- d.Run(ctx) }()
	go func() { done <- w.Run(ctx) }()
	defer func() { stop(); <-done; <-done }()
	c, err := client.Dial(nc)
	if err != nil {
		return err
	}
	defer c.Close()
	one := func(id string) (time.Duration, error) {
		start := time.Now()
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if _, err := c.Submit(wctx, protocol.Task{ID: id, Type: "text", Payload: json.RawMessage(`"hello"`)}); err != nil {
			return 0, err
		}
		res, err := c.Wait(wctx, id)
		if err != nil {
			return 0, err
		}
		if res.Status != protocol.StatusSucceeded {
			return 0, fmt.Errorf("%s: %s %s", id, res.Status, res.Error)
		}
		return time.Since(start), nil
	}
	for i := range 20 { // warm: every lazy start-up done
		if _, err := one(fmt.Sprintf("warm-%d", i)); err != nil {
			return err
		}
	}
	dir, err := os.MkdirTemp("", "mlsched-docpath")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	var onPath, ranForTask, idle map[string]bool
	for round := range 3 {
		if err := coverage.ClearCounters(); err != nil {
			return err
		}
		took, err := one(fmt.Sprintf("t-%d", round))
		if err != nil {
			return err
		}
		ran, err := coveredFiles(filepath.Join(dir, fmt.Sprintf("task%d", round)))
		if err != nil {
			return err
		}
		if err := coverage.ClearCounters(); err != nil {
			return err
		}
		time.Sleep(max(took*3, 500*time.Millisecond)) // an idle window: what the timers run
		quiet, err := coveredFiles(filepath.Join(dir, fmt.Sprintf("idle%d", round)))
		if err != nil {
			return err
		}
		if round == 0 {
			onPath, ranForTask, idle = maps.Clone(ran), maps.Clone(ran), quiet
			continue
		}
		for f := range onPath {
			if !ran[f] {
				delete(onPath, f)
			}
		}
		maps.Copy(ranForTask, ran)
		maps.Copy(idle, quiet)
	}
	for b := range idle {
		delete(onPath, b)
	}
	if os.Getenv("MLSCHED_DOCPATH_BLOCKS") != "" { // which code, to write the list
		for _, b := range slices.Sorted(maps.Keys(onPath)) {
			fmt.Fprintln(os.Stderr, b)
		}
	}
	return json.NewEncoder(os.Stdout).Encode(Report{Path: files(onPath), Ran: files(ranForTask)})
}

// files are the files of a set of blocks ("file:l.c,l.c"), sorted.
func files(blocks map[string]bool) []string {
	set := map[string]bool{}
	for b := range blocks {
		f, _, _ := strings.Cut(b, ":")
		set[f] = true
	}
	return slices.Sorted(maps.Keys(set))
}

// coveredFiles writes the process's coverage counters into dir and returns
// the blocks of project files ("file:l.c,l.c", repository paths; tests,
// tracing and e2e left out) that ran since the counters were cleared.
func coveredFiles(dir string) (map[string]bool, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if err := coverage.WriteMetaDir(dir); err != nil {
		return nil, err
	}
	if err := coverage.WriteCountersDir(dir); err != nil {
		return nil, err
	}
	out := filepath.Join(dir, "cover.txt")
	if b, err := exec.Command("go", "tool", "covdata", "textfmt", "-i", dir, "-o", out).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go tool covdata: %w\n%s", err, b)
	}
	f, err := os.Open(out)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ran := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// the mode line, then "import/path/file.go:l.c,l.c statements count"
		file, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || !strings.HasPrefix(file, modulePath) || strings.HasSuffix(rest, " 0") {
			continue
		}
		rel := strings.TrimPrefix(file, modulePath)
		if strings.HasSuffix(rel, "_test.go") || strings.Contains(rel, "/tracing/") || strings.HasPrefix(rel, "e2e/") {
			continue
		}
		block, _, _ := strings.Cut(rest, " ")
		ran[rel+":"+block] = true
	}
	return ran, sc.Err()
}

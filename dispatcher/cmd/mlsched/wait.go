package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/mlsched/mlsched/shared/client"
	"github.com/mlsched/mlsched/shared/protocol"
)

func runWait(ctx context.Context, a *app, args []string) error {
	fs := a.newFlags("wait", "wait [-wait-timeout D] ID...")
	timeout := fs.Duration("wait-timeout", 0, "give up after this long (0: wait until interrupted)")
	every := fs.Duration("progress", time.Second, "progress of the results on stderr this often (0: none)")
	if err := a.parseAndConnect(fs, args); err != nil {
		return err
	}
	a.progressEvery = *every
	if fs.NArg() == 0 {
		fs.Usage()
		return errUsage
	}
	for _, id := range fs.Args() {
		if err := protocol.ValidToken(id, protocol.DefaultLimits.MaxIDLen); err != nil {
			fmt.Fprintf(a.stderr, "mlsched wait: invalid_id: id %q: %v\n", id, err)
			return errUsage
		}
	}
	var sum summary
	err := a.waitAndPrint(ctx, fs.Args(), *timeout, &sum)
	a.printSummary(sum, true)
	if err != nil {
		return err
	}
	if sum.Succeeded != sum.Waited {
		return errPartial
	}
	return nil
}

func runResult(ctx context.Context, a *app, args []string) error {
	fs := a.newFlags("result", "result ID")
	if err := a.parseAndConnect(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return errUsage
	}
	cx, cancel := a.reqCtx(ctx)
	defer cancel()
	r, err := a.client.Result(cx, fs.Arg(0))
	if errors.Is(err, client.ErrNoResult) {
		// Not finished, never submitted, or finished before the results
		// window: the stream cannot tell which, so say what it keeps.
		if w, werr := a.client.Window(cx); werr == nil {
			return fmt.Errorf("task %s has no result: not finished yet, unknown, or expired (%s)", fs.Arg(0), w)
		}
		return fmt.Errorf("task %s has no result: not finished yet, unknown, or expired", fs.Arg(0))
	}
	if protocol.CodeOf(err) == protocol.CodeInvalidID {
		fmt.Fprintln(a.stderr, "mlsched result:", err)
		return errUsage
	}
	if err != nil {
		return err
	}
	writeJSON(a.stdout, r)
	writeSteps(a.stderr, r)
	if r.Status != protocol.StatusSucceeded {
		return errPartial // as submit -wait and wait: the task did not succeed
	}
	return nil
}

// writeSteps writes a pipeline's steps, one line each, for people (stdout
// stays the result's JSON): nothing for a task that is no pipeline.
func writeSteps(w io.Writer, r *protocol.Result) {
	for i, s := range r.Steps {
		name := s.Name
		if s.Ensemble != "" {
			name = s.Ensemble + "/" + s.Name
		}
		line := fmt.Sprintf("step %d %-12s %-12s %s on %s, %d attempt(s), %.1f ms, %s", i+1, name, s.Type, s.Model, s.Node, s.Attempts, s.LatencyMs, s.Status)
		if s.Error != "" {
			line += ": " + s.Error
		}
		fmt.Fprintln(w, line)
	}
	if r.FailedStep != "" {
		fmt.Fprintf(w, "pipeline failed at step %s: %s\n", r.FailedStep, r.ErrorCode)
	}
}

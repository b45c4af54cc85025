package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/mlsched/mlsched/shared/client"
)

func runWait(ctx context.Context, a *app, args []string) error {
	fs := a.newFlags("wait", "wait [-wait-timeout D] ID...")
	timeout := fs.Duration("wait-timeout", 0, "give up after this long (0: wait until interrupted)")
	if err := a.parseAndConnect(fs, args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return errUsage
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
	if err != nil {
		return err
	}
	writeJSON(a.stdout, r)
	return nil
}

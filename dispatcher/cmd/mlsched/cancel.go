package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mlsched/mlsched/shared/protocol"
)

// errUnknownTask and errFinished make `cancel` exit with exitUnknown and
// exitFinished after it has said why nothing was cancelled.
var (
	errUnknownTask = errors.New("unknown task")
	errFinished    = errors.New("task already finished")
)

func runCancel(ctx context.Context, a *app, args []string) error {
	fs := a.newFlags("cancel", "cancel [-reason TEXT] [-wait D] ID")
	reason := fs.String("reason", "", "why, recorded in the cancelled result's error")
	wait := fs.Duration("wait", 30*time.Second, "how long to wait for a dispatcher's answer (it scans the backlog)")
	if err := a.parseAndConnect(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return errUsage
	}
	id := fs.Arg(0)
	data, _ := json.Marshal(protocol.CancelRequest{ID: id, Reason: *reason})
	cx, cancel := context.WithTimeout(ctx, *wait)
	defer cancel()
	m, err := a.nc.RequestWithContext(cx, protocol.SubjectAdminCancel, data)
	if errors.Is(err, nats.ErrNoResponders) {
		return fmt.Errorf("no dispatcher is listening on %s: %w", protocol.SubjectAdminCancel, err)
	}
	if err != nil {
		return fmt.Errorf("cancel request: %w", err)
	}
	var r protocol.CancelReply
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return fmt.Errorf("malformed cancel reply (%v): %.200s", err, m.Data)
	}
	switch r.Outcome {
	case protocol.CancelDone:
		fmt.Fprintf(a.stdout, "cancelled %s (it was %s)\n", id, strings.Join(r.Where, ", "))
		return nil
	case protocol.CancelFinished:
		fmt.Fprintf(a.stderr, "mlsched cancel: task %s already finished: its result is %s\n", id, r.Status)
		return errFinished
	case protocol.CancelUnknown:
		fmt.Fprintf(a.stderr, "mlsched cancel: no task %s is waiting, running or finished\n", id)
		return errUnknownTask
	case protocol.CancelInvalid:
		if strings.HasPrefix(r.Error, "id ") {
			fmt.Fprintf(a.stderr, "mlsched cancel: %s\n", r.Error)
			return errUsage
		}
		return errors.New(r.Error)
	default:
		return fmt.Errorf("unexpected cancel reply %q", r.Outcome)
	}
}

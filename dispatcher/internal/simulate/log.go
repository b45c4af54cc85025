package simulate

import (
	"context"
	"encoding/csv"
	"fmt"
	"io"
	"slices"
	"strconv"
	"time"

	"github.com/mlsched/mlsched/shared/protocol"
)

// A run can write the request log a real deployment would export: one row
// per attempt, in the columns Fit reads by default. Why: fitting a
// scenario from a log (fit.go) is only trustworthy if it recovers a known
// scenario, and a log written by the simulator from that scenario is the
// test.

// LogColumns are the columns WriteLog writes, in order: the task's
// submission (seconds from the run's start), its type and tenant, the
// attempt's model, node, number and outcome status, its latency in
// milliseconds and the task's size.
var LogColumns = []string{"time", "type", "tenant", "model", "node", "attempt", "status", "latency_ms", "size"}

// runLog is a run's request log being written.
type runLog struct {
	w    *csv.Writer
	rows int
	rec  []string
}

func (l *runLog) attempt(t *task, a *attempt, st protocol.OutcomeStatus, lat time.Duration) {
	tenant := t.tenant
	if tenant == "" {
		tenant = protocol.DefaultTenant
	}
	l.rec = append(l.rec[:0], strconv.FormatFloat(t.submit.Seconds(), 'f', 6, 64), t.typ, tenant, a.model, a.node.spec.Name,
		strconv.Itoa(a.n), string(st), strconv.FormatFloat(float64(lat)/float64(time.Millisecond), 'f', 3, 64),
		strconv.FormatFloat(t.size, 'g', -1, 64))
	_ = l.w.Write(l.rec) // the error is kept by the writer: WriteLog returns it
	l.rows++
}

// WriteLog runs the scenario once under one policy (opt's tasks and seed)
// and writes its request log to w as CSV with a header row (LogColumns),
// one row per attempt that ended. It returns the number of rows.
func WriteLog(ctx context.Context, sc *Scenario, opt Options, policyName string, w io.Writer) (int, error) {
	opt = opt.withDefaults(sc)
	if opt.Tasks > MaxTasks {
		return 0, fmt.Errorf("%w: %d tasks (at most %d)", ErrInvalidOptions, opt.Tasks, MaxTasks)
	}
	if !slices.Contains(Policies(), policyName) {
		return 0, fmt.Errorf("%w %q (want one of %v)", ErrUnknownPolicy, policyName, Policies())
	}
	s, err := newSim(sc, opt, policyName)
	if err != nil {
		return 0, err
	}
	cw := csv.NewWriter(w)
	if err := cw.Write(LogColumns); err != nil {
		return 0, fmt.Errorf("write log: %w", err)
	}
	s.log = &runLog{w: cw}
	if err := s.run(ctx, opt.Tasks); err != nil {
		return 0, fmt.Errorf("policy %s, seed %d: %w", policyName, opt.Seed, err)
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		return 0, fmt.Errorf("write log: %w", err)
	}
	return s.log.rows, nil
}

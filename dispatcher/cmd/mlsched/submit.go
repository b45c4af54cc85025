package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/mlsched/mlsched/shared/protocol"
)

// submitLine is one task of a submission and where it came from.
type submitLine struct {
	line int // 0 for a task given by flags
	task protocol.Task
}

// submitAck is printed (as a JSON line) for every task submitted without -wait.
type submitAck struct {
	ID        string `json:"id"`
	Line      int    `json:"line,omitempty"`
	Seq       uint64 `json:"seq"`
	Duplicate bool   `json:"duplicate,omitempty"`
}

// summary is printed on stderr at the end of a submission or a wait.
type summary struct {
	Submitted, Duplicates, Bad, Unsent  int
	Succeeded, Failed, Rejected, Waited int
	Cancelled                           int
}

func runSubmit(ctx context.Context, a *app, args []string) error {
	fs := a.newFlags("submit", "submit -type T [-id ID] [-payload JSON] [-models a,b] [-timeout-ms N] [-max-attempts N] [-priority P] [-tenant T] [-deadline-ms N] [-wait]\n       mlsched submit -f tasks.jsonl [-wait]   (- reads stdin)")
	file := fs.String("f", "", "JSON-lines file of tasks, one task object per line (- for stdin); ids are generated when missing")
	typ := fs.String("type", "", "task type")
	id := fs.String("id", "", "task id (default: generated)")
	payload := fs.String("payload", "", "task payload, a JSON value")
	models := fs.String("models", "", "comma-separated allow-list of models")
	timeoutMs := fs.Int64("timeout-ms", 0, "per-attempt timeout in ms (0: the dispatcher's default)")
	maxAttempts := fs.Int("max-attempts", 0, "attempts before the task fails (0: the dispatcher's default)")
	maxLatency := fs.Int64("max-latency-ms", 0, "latency budget: only models whose p95 fits it; the task is rejected when none does (0: none)")
	minRate := fs.Float64("min-success-rate", 0, "exclude models below this success rate (0: none)")
	priority := fs.Int("priority", 0, "priority -10..10: higher is served first, negative is sheddable")
	tenant := fs.String("tenant", "", "tenant, the fairness and quota key (default: default)")
	deadlineMs := fs.Int64("deadline-ms", 0, "the task's whole budget from submission, queueing included; past it the task fails with expired, never started (0: none)")
	wait := fs.Bool("wait", false, "wait for every result, print each as a JSON line, then a summary; exit 3 unless all succeeded")
	waitTimeout := fs.Duration("wait-timeout", 0, "give up waiting after this long (0: wait until interrupted)")
	window := fs.Int("window", 256, "submissions awaiting their acknowledgement at once")
	progressEvery := fs.Duration("progress", time.Second, "progress on stderr this often: of the submission with -f, of the results with -wait (a bar on a terminal, plain lines otherwise; 0: none)")
	// Flags are checked, and a task given by flags validated, before
	// connecting: a usage error needs no server and exits 2.
	if err := parse(fs, args); err != nil {
		return err
	}
	a.progressEvery = *progressEvery
	if fs.NArg() > 0 {
		fmt.Fprintf(a.stderr, "mlsched submit: unexpected arguments %q\n", fs.Args())
		return errUsage
	}

	var sum summary
	var tasks []submitLine
	switch {
	case *file != "" && *typ != "":
		fmt.Fprintln(a.stderr, "mlsched submit: -f and -type are exclusive")
		return errUsage
	case *file != "":
		in, size := a.stdin, int64(0)
		if *file != "-" {
			f, err := os.Open(*file)
			if err != nil {
				return err
			}
			defer f.Close()
			if st, err := f.Stat(); err == nil && st.Mode().IsRegular() {
				size = st.Size()
			}
			in = f
		}
		if err := a.connect(); err != nil {
			return err
		}
		return a.submitStream(ctx, in, size, *window, *wait, *waitTimeout, *progressEvery)
	case *typ != "":
		t := protocol.Task{ID: *id, Type: *typ, TimeoutMs: *timeoutMs, MaxAttempts: *maxAttempts,
			MaxLatencyMs: *maxLatency, MinSuccessRate: *minRate, Priority: *priority, Tenant: *tenant, DeadlineMs: *deadlineMs}
		if *payload != "" {
			if !json.Valid([]byte(*payload)) {
				fmt.Fprintln(a.stderr, "mlsched submit: -payload is not valid JSON")
				return errUsage
			}
			t.Payload = json.RawMessage(*payload)
		}
		if *models != "" {
			t.Models = strings.Split(*models, ",")
		}
		if t.ID == "" {
			t.ID = newID()
		}
		if err := t.Validate(a.limits()); err != nil {
			fmt.Fprintln(a.stderr, "mlsched submit:", err)
			return errUsage // a bad flag value: -id, -type, -timeout-ms, -models, -priority ...
		}
		if err := a.connect(); err != nil {
			return err
		}
		tasks = []submitLine{{task: t}}
		a.waiting = &tasks[0].task
	default:
		fmt.Fprintln(a.stderr, "mlsched submit: give -type or -f")
		fs.Usage()
		return errUsage
	}

	ids, err := a.submitAll(ctx, tasks, *window, !*wait, &sum)
	if err != nil && len(ids) == 0 {
		return err
	}
	if err != nil {
		fmt.Fprintln(a.stderr, "mlsched submit:", err)
	}
	if *wait && len(ids) > 0 {
		werr := a.waitAndPrint(ctx, ids, *waitTimeout, &sum)
		a.printSummary(sum, false)
		if werr != nil {
			return werr
		}
	} else if *file != "" || sum.Bad > 0 {
		a.printSummary(sum, false)
	}
	if err != nil {
		return errPartial
	}
	if sum.Bad > 0 || sum.Unsent > 0 || (*wait && sum.Succeeded != sum.Waited) {
		return errPartial
	}
	return nil
}

// decodeLine decodes one task, generating its id when it has none.
func decodeLine(line []byte, lim protocol.Limits) (protocol.Task, error) {
	t, err := protocol.DecodeTask(line, lim)
	if protocol.CodeOf(err) == protocol.CodeMissingID {
		t.ID = newID()
		err = t.Validate(lim)
	}
	return t, err
}

// submitAll submits tasks pipelined, window at a time, reports each failure
// on stderr with its line, and returns the ids the stream accepted
// (duplicates included: they still have one result).
func (a *app) submitAll(ctx context.Context, tasks []submitLine, window int, printAcks bool, sum *summary) ([]string, error) {
	batch := make([]protocol.Task, len(tasks))
	for i, sl := range tasks {
		batch[i] = sl.task
	}
	acks, errs := a.client.SubmitMany(ctx, batch, window)
	ids := make([]string, 0, len(tasks))
	var firstErr error
	for i, sl := range tasks {
		if err := errs[i]; err != nil {
			sum.Unsent++
			where := sl.task.ID
			if sl.line > 0 {
				where = fmt.Sprintf("line %d (%s)", sl.line, sl.task.ID)
			}
			fmt.Fprintf(a.stderr, "%s: %v\n", where, err)
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		sum.Submitted++
		if acks[i].Duplicate {
			sum.Duplicates++
		}
		ids = append(ids, sl.task.ID)
		if printAcks {
			writeJSON(a.stdout, submitAck{ID: sl.task.ID, Line: sl.line, Seq: acks[i].Seq, Duplicate: acks[i].Duplicate})
		}
	}
	if firstErr != nil {
		return ids, fmt.Errorf("%d of %d tasks not submitted: %w", len(tasks)-len(ids), len(tasks), firstErr)
	}
	return ids, nil
}

// waitAndPrint prints each result as a JSON line and counts the statuses.
// While it waits it reports on stderr, every a.progressEvery (1s; 0: never):
// results so far, rate and ETA for many tasks; for one task, that it is
// still waiting and, from the live nodes, why (no node announces its type
// or its allow-listed models), so no wait is silent.
func (a *app) waitAndPrint(ctx context.Context, ids []string, timeout time.Duration, sum *summary) error {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	var mu sync.Mutex
	stop := a.waitProgress(ctx, len(ids), func() summary { mu.Lock(); defer mu.Unlock(); return *sum })
	err := a.client.WaitAll(ctx, ids, func(r *protocol.Result) {
		mu.Lock()
		defer mu.Unlock()
		sum.Waited++
		switch r.Status {
		case protocol.StatusSucceeded:
			sum.Succeeded++
		case protocol.StatusFailed:
			sum.Failed++
		case protocol.StatusCancelled:
			sum.Cancelled++
		default:
			sum.Rejected++
		}
		writeJSON(a.stdout, r)
	})
	stop()
	if err != nil {
		return fmt.Errorf("wait: %w", err)
	}
	return nil
}

// waitProgress reports, until the returned stop is called, how the wait for
// n results goes; snap reads the counts so far.
func (a *app) waitProgress(ctx context.Context, n int, snap func() summary) (stop func()) {
	every := a.progressEvery
	if every <= 0 {
		return func() {}
	}
	tty := isTerminal(a.stderr)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		drawn := false
		defer func() {
			if drawn {
				fmt.Fprint(a.stderr, "\r\x1b[K")
			}
		}()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			s := snap()
			el := time.Since(start)
			var line string
			if n == 1 && a.waiting != nil {
				line = fmt.Sprintf("waiting for %s: no result after %s%s", a.waiting.ID, el.Round(time.Second), a.waitHint(ctx, a.waiting))
			} else {
				rate := float64(s.Waited) / max(el.Seconds(), 1e-3)
				eta := "-"
				if rate > 0 {
					eta = (time.Duration(float64(n-s.Waited)/rate) * time.Second).Round(time.Second).String()
				}
				line = fmt.Sprintf("results: %d of %d (%d succeeded, %d failed, %d rejected), %.0f/s, ETA %s",
					s.Waited, n, s.Succeeded, s.Failed, s.Rejected+s.Cancelled, rate, eta)
			}
			if tty && n > 1 {
				fmt.Fprintf(a.stderr, "\r%s\x1b[K", line)
				drawn = true
			} else {
				fmt.Fprintln(a.stderr, line)
			}
		}
	}()
	return func() { cancel(); <-done }
}

// waitHint says why a task may still wait, from the live nodes: none
// announces a model for its type (or its allow-list), which the dispatcher
// waits MLSCHED_NO_NODE_WAIT for. Empty when a node serves it, or when the
// nodes cannot be read (a producer's permissions may not allow it).
func (a *app) waitHint(ctx context.Context, t *protocol.Task) string {
	cx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	rows, err := a.listNodes(cx)
	if err != nil {
		return ""
	}
	var unready []string
	for _, r := range rows {
		if r.Heartbeat == nil {
			continue
		}
		for _, m := range r.Heartbeat.Models {
			if slices.Contains(m.Types, t.Type) && protocol.AllowedBy(t.Models, m.Name) {
				return "" // served: it runs, or waits its turn
			}
		}
		for _, u := range r.Heartbeat.Unready {
			if slices.Contains(u.Types, t.Type) {
				unready = append(unready, u.Name+" on "+r.Key+" (unready)")
			}
		}
	}
	what := fmt.Sprintf("type %q", t.Type)
	if len(t.Models) > 0 {
		what += " with models " + strings.Join(t.Models, ",")
	}
	hint := "; no live node announces a model for " + what
	if len(unready) > 0 {
		hint += ": " + strings.Join(unready, ", ")
	}
	return hint + "; the dispatcher waits MLSCHED_NO_NODE_WAIT (default 30s) for one, then rejects it"
}

// printSummary prints the counts on stderr; waitOnly leaves out the
// submission counts (for the wait command).
func (a *app) printSummary(s summary, waitOnly bool) {
	fmt.Fprint(a.stderr, "summary:")
	if !waitOnly {
		fmt.Fprintf(a.stderr, " submitted=%d duplicates=%d bad_lines=%d unsent=%d", s.Submitted, s.Duplicates, s.Bad, s.Unsent)
	}
	if waitOnly || s.Waited > 0 {
		fmt.Fprintf(a.stderr, " results=%d succeeded=%d failed=%d rejected=%d", s.Waited, s.Succeeded, s.Failed, s.Rejected)
		if s.Cancelled > 0 {
			fmt.Fprintf(a.stderr, " cancelled=%d", s.Cancelled)
		}
	}
	fmt.Fprintln(a.stderr)
}

// newID makes a task id for tasks submitted without one.
func newID() string {
	var b [10]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return "cli-" + hex.EncodeToString(b[:])
}

func writeJSON(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

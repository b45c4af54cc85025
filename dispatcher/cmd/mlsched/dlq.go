package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/dispatcher/operator"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

func runDLQ(ctx context.Context, a *app, args []string) error {
	const synopsis = "dlq list [-n N] | dlq show SEQ | dlq replay SEQ... | dlq replay -all"
	if len(args) == 0 {
		fmt.Fprintf(a.stderr, "usage: mlsched %s\n", synopsis)
		return errUsage
	}
	switch args[0] {
	case "list":
		return a.dlqList(ctx, args[1:])
	case "show":
		return a.dlqShow(ctx, args[1:])
	case "replay":
		return a.dlqReplay(ctx, args[1:])
	case "-h", "-help", "--help":
		fmt.Fprintf(a.stderr, "usage: mlsched %s\n", synopsis)
		return nil
	default:
		fmt.Fprintf(a.stderr, "mlsched dlq: unknown subcommand %q\nusage: mlsched %s\n", args[0], synopsis)
		return errUsage
	}
}

// dlqEntry is one stored dead letter.
type dlqEntry struct {
	Seq     uint64
	Subject string
	Time    time.Time
	Data    []byte
	DL      protocol.DeadLetter
	Err     error // the entry is not a DeadLetter
}

func newEntry(seq uint64, subject string, at time.Time, data []byte) dlqEntry {
	e := dlqEntry{Seq: seq, Subject: subject, Time: at, Data: data}
	if err := json.Unmarshal(data, &e.DL); err != nil {
		e.Err = err
	}
	return e
}

func (a *app) dlqStream(ctx context.Context) (jetstream.Stream, error) {
	s, err := a.js.Stream(ctx, topology.StreamDLQ)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", topology.StreamDLQ, err)
	}
	return s, nil
}

func (a *app) dlqList(ctx context.Context, args []string) error {
	fs := a.newFlags("dlq list", "dlq list [-n N] [-json]")
	n := fs.Int("n", 20, "show the last N entries (0: all)")
	raw := fs.Bool("json", false, "print entries as JSON lines")
	if err := a.parseAndConnect(fs, args); err != nil {
		return err
	}
	cx, cancel := a.reqCtx(ctx)
	defer cancel()
	entries, total, err := a.lastEntries(cx, *n)
	if err != nil {
		return err
	}
	if *raw {
		for _, e := range entries {
			writeJSON(a.stdout, entryView(e))
		}
		return nil
	}
	if total == 0 {
		fmt.Fprintln(a.stdout, "dead-letter queue is empty")
		return nil
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tTIME\tKIND\tCODE\tTASK\tBYTES\tREASON")
	for _, e := range entries {
		kind := strings.TrimPrefix(e.Subject, topology.DLQSubject(""))
		if e.Err != nil {
			fmt.Fprintf(tw, "%d\t%s\t%s\t-\t-\t%d\tmalformed entry: %s\n", e.Seq, e.Time.UTC().Format(time.RFC3339), kind, len(e.Data), oneLine(e.Err.Error(), 80))
			continue
		}
		task := e.DL.TaskID
		if task == "" {
			task = "(none)"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%s\n", e.Seq, e.Time.UTC().Format(time.RFC3339), kind, e.DL.Code, task,
			len(e.DL.Original), oneLine(e.DL.Reason, 80))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if total > len(entries) {
		fmt.Fprintf(a.stdout, "(%d older entries not shown; -n 0 shows all)\n", total-len(entries))
	}
	return nil
}

// lastEntries reads the DLQ with an ordered consumer and keeps the last n
// entries (all when n <= 0); it also returns how many entries there are.
func (a *app) lastEntries(ctx context.Context, n int) ([]dlqEntry, int, error) {
	s, err := a.dlqStream(ctx)
	if err != nil {
		return nil, 0, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, 0, fmt.Errorf("stream %s: %w", topology.StreamDLQ, err)
	}
	if info.State.Msgs == 0 {
		return nil, 0, nil
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, 0, fmt.Errorf("dlq consumer: %w", err)
	}
	var out []dlqEntry
	total := 0
	for {
		batch, err := cons.Fetch(256, jetstream.FetchMaxWait(a.timeout))
		if err != nil {
			return nil, 0, fmt.Errorf("dlq read: %w", err)
		}
		got := 0
		var pending uint64
		for m := range batch.Messages() {
			got++
			md, err := m.Metadata()
			if err != nil {
				return nil, 0, fmt.Errorf("dlq read: %w", err)
			}
			total++
			out = append(out, newEntry(md.Sequence.Stream, m.Subject(), md.Timestamp, m.Data()))
			if n > 0 && len(out) > n {
				out = out[1:]
			}
			pending = md.NumPending
			if pending == 0 {
				break
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, context.DeadlineExceeded) {
			return nil, 0, fmt.Errorf("dlq read: %w", err)
		}
		if got == 0 || pending == 0 {
			return out, total, nil
		}
	}
}

func (a *app) getEntry(ctx context.Context, s jetstream.Stream, seq uint64) (dlqEntry, error) {
	m, err := s.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return dlqEntry{}, fmt.Errorf("no dead letter with sequence %d", seq)
	}
	if err != nil {
		return dlqEntry{}, fmt.Errorf("dead letter %d: %w", seq, err)
	}
	return newEntry(m.Sequence, m.Subject, m.Time, m.Data), nil
}

// entryJSON shows a dead letter with its original bytes as text when they
// are text (they are base64 in the stored JSON).
type entryJSON struct {
	Seq          uint64               `json:"seq"`
	Subject      string               `json:"subject"`
	Time         time.Time            `json:"time"`
	DeadLetter   *protocol.DeadLetter `json:"dead_letter,omitempty"`
	OriginalText *string              `json:"original_text,omitempty"`
	Malformed    string               `json:"malformed,omitempty"`
	Raw          *string              `json:"raw,omitempty"`
}

func entryView(e dlqEntry) entryJSON {
	v := entryJSON{Seq: e.Seq, Subject: e.Subject, Time: e.Time}
	if e.Err != nil {
		v.Malformed = e.Err.Error()
		raw := strings.ToValidUTF8(string(e.Data), "\uFFFD")
		v.Raw = &raw
		return v
	}
	dl := e.DL
	v.DeadLetter = &dl
	if utf8.Valid(dl.Original) {
		s := string(dl.Original)
		v.OriginalText = &s
	}
	return v
}

func (a *app) dlqShow(ctx context.Context, args []string) error {
	fs := a.newFlags("dlq show", "dlq show SEQ")
	if err := a.parseAndConnect(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return errUsage
	}
	seq, err := strconv.ParseUint(fs.Arg(0), 10, 64)
	if err != nil || seq == 0 {
		fmt.Fprintf(a.stderr, "mlsched dlq show: %q is not a sequence number\n", fs.Arg(0))
		return errUsage
	}
	cx, cancel := a.reqCtx(ctx)
	defer cancel()
	s, err := a.dlqStream(cx)
	if err != nil {
		return err
	}
	e, err := a.getEntry(cx, s, seq)
	if err != nil {
		return err
	}
	out, _ := json.MarshalIndent(entryView(e), "", "  ")
	_, err = fmt.Fprintf(a.stdout, "%s\n", out)
	return err
}

func (a *app) dlqReplay(ctx context.Context, args []string) error {
	fs := a.newFlags("dlq replay", "dlq replay SEQ... | dlq replay -all")
	all := fs.Bool("all", false, "replay every replayable entry")
	if err := a.parseAndConnect(fs, args); err != nil {
		return err
	}
	if *all == (fs.NArg() > 0) {
		fs.Usage()
		return errUsage
	}
	var seqs []uint64
	for _, arg := range fs.Args() {
		seq, err := strconv.ParseUint(arg, 10, 64)
		if err != nil || seq == 0 {
			fmt.Fprintf(a.stderr, "mlsched dlq replay: %q is not a sequence number\n", arg)
			return errUsage
		}
		seqs = append(seqs, seq)
	}
	cx, cancel := a.reqCtx(ctx)
	defer cancel()
	s, err := a.dlqStream(cx)
	if err != nil {
		return err
	}
	var entries []dlqEntry
	if *all {
		if entries, _, err = a.lastEntries(cx, 0); err != nil {
			return err
		}
	} else {
		for _, seq := range seqs {
			e, err := a.getEntry(cx, s, seq)
			if err != nil {
				return err
			}
			entries = append(entries, e)
		}
	}
	failed := 0
	for _, e := range entries {
		ecx, ecancel := a.reqCtx(ctx)
		ack, err := a.replay(ecx, s, e)
		ecancel()
		if err != nil {
			failed++
			fmt.Fprintf(a.stderr, "dead letter %d: %v\n", e.Seq, err)
			continue
		}
		fmt.Fprintf(a.stdout, "replayed dead letter %d as task %s (task seq %d); its previous result was removed and the replay's result replaces it\n",
			e.Seq, e.DL.TaskID, ack)
	}
	if failed > 0 {
		return errPartial
	}
	return nil
}

// replay resubmits a dead letter (operator.Replay: the old result is
// purged, the replay's replaces it).
func (a *app) replay(ctx context.Context, dlq jetstream.Stream, e dlqEntry) (uint64, error) {
	if e.Err != nil {
		return 0, fmt.Errorf("%w: the entry is not a dead letter: %v", operator.ErrNotReplayable, e.Err)
	}
	return operator.Replay(ctx, a.js, a.client, dlq, e.Seq, e.DL)
}

// oneLine folds s onto one line of at most about n bytes. A longer text
// loses its middle, not its end: a reason ends with what matters most (the
// last attempt's error: "…ended model_error: simulated model failure").
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) <= n {
		return s
	}
	head := n / 3
	tail := n - head - 1
	return strings.ToValidUTF8(s[:head], "") + "…" + strings.ToValidUTF8(s[len(s)-tail:], "")
}

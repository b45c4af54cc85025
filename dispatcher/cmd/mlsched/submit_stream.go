package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// submitStream submits a JSON-lines stream as it reads it: a chunk of lines
// at a time goes through the pipelined submitter, so memory stays bounded by
// the chunk whatever the file's size (with -wait only the ids are kept).
// Progress goes to stderr: a bar redrawn in place on a terminal, a plain line
// otherwise.
func (a *app) submitStream(ctx context.Context, in io.Reader, size int64, window int, wait bool, waitTimeout, every time.Duration) error {
	var sum summary
	counted := &countingReader{r: in}
	r := bufio.NewReaderSize(counted, 64<<10)
	chunk := max(window, 1) * 4
	prog := newProgress(a.stderr, isTerminal(a.stderr), size, every)
	var ids []string
	var firstErr error
	batch := make([]submitLine, 0, chunk)
	flush := func() {
		if len(batch) == 0 {
			return
		}
		got, err := a.submitAll(ctx, batch, window, !wait, &sum)
		if wait {
			ids = append(ids, got...)
		}
		if err != nil && firstErr == nil {
			firstErr = err
		}
		batch = batch[:0]
		prog.update(counted.n, sum)
	}
	for n := 1; ; n++ {
		line, rerr := r.ReadBytes('\n')
		if rerr != nil && !errors.Is(rerr, io.EOF) {
			flush()
			prog.done(counted.n, sum)
			return fmt.Errorf("read tasks: %w", rerr)
		}
		if len(bytes.TrimSpace(line)) > 0 {
			t, derr := decodeLine(line, a.limits())
			if derr != nil {
				sum.Bad++
				prog.clear()
				fmt.Fprintf(a.stderr, "line %d: %v\n", n, derr)
			} else {
				batch = append(batch, submitLine{line: n, task: t})
			}
		}
		if len(batch) == chunk {
			flush()
		}
		if rerr != nil || ctx.Err() != nil {
			break
		}
	}
	flush()
	prog.done(counted.n, sum)
	if firstErr != nil {
		fmt.Fprintln(a.stderr, "mlsched submit:", firstErr)
	}
	if wait && len(ids) > 0 {
		werr := a.waitAndPrint(ctx, ids, waitTimeout, &sum)
		a.printSummary(sum, false)
		if werr != nil {
			return werr
		}
	} else {
		a.printSummary(sum, false)
	}
	if firstErr != nil && sum.Submitted == 0 {
		return firstErr
	}
	if firstErr != nil || sum.Bad > 0 || sum.Unsent > 0 || (wait && sum.Succeeded != sum.Waited) {
		return errPartial
	}
	return ctx.Err()
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// progress reports a submission's progress at most every interval.
type progress struct {
	w       io.Writer
	tty     bool
	size    int64 // bytes in the file, 0 when unknown (a pipe)
	every   time.Duration
	start   time.Time
	last    time.Time
	drawn   bool // a bar is on the current terminal line
	printed bool
}

func newProgress(w io.Writer, tty bool, size int64, every time.Duration) *progress {
	now := time.Now()
	return &progress{w: w, tty: tty, size: size, every: every, start: now, last: now}
}

func (p *progress) line(read int64, s summary) string {
	rate := float64(s.Submitted) / max(time.Since(p.start).Seconds(), 1e-3)
	counts := fmt.Sprintf("%d submitted, %d bad, %d unsent, %.0f tasks/s", s.Submitted, s.Bad, s.Unsent, rate)
	if p.size <= 0 {
		return "progress: " + counts
	}
	f := min(float64(read)/float64(p.size), 1)
	if p.tty {
		const width = 30
		n := int(f * width)
		return fmt.Sprintf("[%s%s] %5.1f%%  %s", strings.Repeat("=", n), strings.Repeat(" ", width-n), 100*f, counts)
	}
	return fmt.Sprintf("progress: %.1f%% of %d bytes, %s", 100*f, p.size, counts)
}

func (p *progress) update(read int64, s summary) {
	if p.every <= 0 || time.Since(p.last) < p.every {
		return
	}
	p.last = time.Now()
	p.print(read, s)
}

func (p *progress) print(read int64, s summary) {
	p.printed = true
	if p.tty {
		fmt.Fprintf(p.w, "\r%s\x1b[K", p.line(read, s))
		p.drawn = true
		return
	}
	fmt.Fprintln(p.w, p.line(read, s))
}

// clear ends the bar's line so that a message can be printed.
func (p *progress) clear() {
	if p.drawn {
		fmt.Fprint(p.w, "\r\x1b[K")
		p.drawn = false
	}
}

// done prints the final state once some progress was shown (or always on a
// terminal), then ends the bar's line.
func (p *progress) done(read int64, s summary) {
	if p.every > 0 && (p.tty || p.printed) {
		p.print(read, s)
	}
	if p.drawn {
		fmt.Fprintln(p.w)
		p.drawn = false
	}
}

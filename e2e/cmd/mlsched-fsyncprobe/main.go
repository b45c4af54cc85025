// Command mlsched-fsyncprobe measures what nats-server alone stores per
// second with sync_interval: always, publishing into 1, 2, 4 and 8 streams
// at once (issue 24). On one server every stored message is fsynced on its
// own, under its stream's lock, so one stream's rate is bounded by the
// disk's fsync rate; several streams fsync in parallel, and the file system
// may merge their journal commits. A successful mlsched task stores two
// messages on two streams (the task, its result): this says how far the
// disk, rather than the CPU, bounds durable mode on this machine.
//
//	bin/mlsched-fsyncprobe -nats-server bin/nats-server -msgs 20000 -rounds 3
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/e2e/harness"
)

func main() {
	server := flag.String("nats-server", "bin/nats-server", "the nats-server binary")
	msgs := flag.Int("msgs", 20000, "messages per measurement")
	rounds := flag.Int("rounds", 3, "rounds; each measures every stream count once, interleaved")
	size := flag.Int("size", 300, "message bytes (a task or a result is a few hundred)")
	flag.Parse()
	if _, err := run(os.Stdout, *server, *msgs, *rounds, *size); err != nil {
		fmt.Fprintln(os.Stderr, "mlsched-fsyncprobe:", err)
		os.Exit(1)
	}
}

// run measures every stream count rounds times, prints each round and the
// table to out, and returns the median rate of each stream count.
func run(out io.Writer, server string, msgs, rounds, size int) (map[int]float64, error) {
	dir, err := os.MkdirTemp("", "mlsched-fsyncprobe-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	port, err := harness.FreePort()
	if err != nil {
		return nil, err
	}
	conf := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(conf, fmt.Appendf(nil, "listen: 127.0.0.1:%d\njetstream { store_dir: %q, sync_interval: always }\n", port, filepath.Join(dir, "js")), 0o600); err != nil {
		return nil, err
	}
	cmd := exec.Command(server, "-c", conf)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	var nc *nats.Conn
	for deadline := time.Now().Add(10 * time.Second); ; {
		if nc, err = nats.Connect(fmt.Sprintf("nats://127.0.0.1:%d", port)); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("nats-server did not start: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	defer nc.Close()
	var failed atomic.Int64 // a refused or timed-out publish is not a stored message
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(512), jetstream.WithPublishAsyncTimeout(time.Minute),
		jetstream.WithPublishAsyncErrHandler(func(jetstream.JetStream, *nats.Msg, error) { failed.Add(1) }))
	if err != nil {
		return nil, err
	}
	ctx := context.Background()
	payload := make([]byte, size)
	counts := []int{1, 2, 4, 8}
	rates := map[int][]float64{}
	for round := 1; round <= rounds; round++ {
		for _, k := range counts {
			r, err := measure(ctx, js, k, msgs, payload)
			if err != nil {
				return nil, err
			}
			if n := failed.Swap(0); n > 0 {
				return nil, fmt.Errorf("%d streams: %d publishes failed", k, n)
			}
			rates[k] = append(rates[k], r)
			fmt.Fprintf(out, "round %d, %d streams: %.0f msgs/s\n", round, k, r)
		}
	}
	medians := map[int]float64{}
	for _, k := range counts {
		medians[k] = median(rates[k])
	}
	base := medians[1]
	fmt.Fprintf(out, "\n| streams | msgs/s per round | median | vs 1 stream |\n|---|---|---|---|\n")
	for _, k := range counts {
		fmt.Fprintf(out, "| %d | %v | %.0f | %.2fx |\n", k, rounded(rates[k]), medians[k], medians[k]/base)
	}
	return medians, nil
}

// measure publishes n messages round-robin into k fresh file streams, 512 in
// flight, and returns the stored messages per second.
func measure(ctx context.Context, js jetstream.JetStream, k, n int, payload []byte) (float64, error) {
	for i := 0; i < k; i++ {
		name := fmt.Sprintf("PROBE_%d", i)
		_ = js.DeleteStream(ctx, name)
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{fmt.Sprintf("probe.%d.>", i)}, Storage: jetstream.FileStorage}); err != nil {
			return 0, err
		}
	}
	start := time.Now()
	for i := 0; i < n; i++ {
		subj := fmt.Sprintf("probe.%d.m", i%k)
		for {
			_, err := js.PublishAsync(subj, payload)
			if err == nil {
				break
			}
			select { // too many in flight: let acknowledgements come back
			case <-js.PublishAsyncComplete():
			case <-time.After(time.Millisecond):
			}
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		return 0, fmt.Errorf("%d streams: publishes not acknowledged within a minute", k)
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func rounded(v []float64) []int {
	out := make([]int, len(v))
	for i, x := range v {
		out[i] = int(x + 0.5)
	}
	return out
}

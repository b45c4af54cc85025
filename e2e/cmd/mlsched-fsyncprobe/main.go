// Command mlsched-fsyncprobe measures what nats-server alone stores per
// second with sync_interval: always, publishing into 1, 2, 4 and 8 streams
// at once (issue 24). On one server every stored message is fsynced on its
// own, under its stream's lock, so one stream's rate is bounded by the
// disk's fsync rate; several streams fsync in parallel, and the file system
// may merge their journal commits. A successful mlsched task stores two
// messages on two streams (the task, its result): this says how far the
// disk, rather than the CPU, bounds durable mode on this machine. The last
// row publishes into one stream through mlsched's group commit
// (jsplumb.GroupCommit: atomic batches, one fsync per batch).
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
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/e2e/harness"
	"github.com/mlsched/mlsched/shared/jsplumb"
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

// probe is one row of the table: messages round-robin into streams fresh
// file streams, through a group commit when group.
type probe struct {
	name    string
	streams int
	group   bool
}

var probes = []probe{{"1", 1, false}, {"2", 2, false}, {"4", 4, false}, {"8", 8, false}, {"1, group commit", 1, true}}

// run measures every probe rounds times, prints each round and the table to
// out, and returns the median rate of each probe by name.
func run(out io.Writer, server string, msgs, rounds, size int) (map[string]float64, error) {
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
	rates := map[string][]float64{}
	for round := 1; round <= rounds; round++ {
		for _, p := range probes {
			var r float64
			if p.group {
				r, err = measureGroup(ctx, nc, js, msgs, payload)
			} else {
				r, err = measure(ctx, js, p.streams, msgs, payload)
			}
			if err != nil {
				return nil, err
			}
			if n := failed.Swap(0); n > 0 {
				return nil, fmt.Errorf("%s streams: %d publishes failed", p.name, n)
			}
			rates[p.name] = append(rates[p.name], r)
			fmt.Fprintf(out, "round %d, %s streams: %.0f msgs/s\n", round, p.name, r)
		}
	}
	medians := map[string]float64{}
	for _, p := range probes {
		medians[p.name] = median(rates[p.name])
	}
	base := medians["1"]
	fmt.Fprintf(out, "\n| streams | msgs/s per round | median | vs 1 stream |\n|---|---|---|---|\n")
	for _, p := range probes {
		fmt.Fprintf(out, "| %s | %v | %.0f | %.2fx |\n", p.name, rounded(rates[p.name]), medians[p.name], medians[p.name]/base)
	}
	return medians, nil
}

// measureGroup publishes n messages into one fresh file stream through a
// group commit (as the dispatcher stores results), as fast as it takes
// them, and returns the stored messages per second.
func measureGroup(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, n int, payload []byte) (float64, error) {
	_ = js.DeleteStream(ctx, "PROBE_G")
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "PROBE_G", Subjects: []string{"probe.g.>"},
		Storage: jetstream.FileStorage, AllowAtomicPublish: true}); err != nil {
		return 0, err
	}
	pub := jsplumb.NewPublisher(nc, jsplumb.PublisherConfig{Timeout: time.Minute})
	if err := pub.Start(ctx); err != nil {
		return 0, err
	}
	defer func() { _ = pub.Stop() }()
	g := jsplumb.NewGroupCommit(pub, jsplumb.GroupCommitConfig{})
	if err := g.Start(ctx); err != nil {
		return 0, err
	}
	defer func() { _ = g.Stop() }()
	var (
		wg      sync.WaitGroup
		refused atomic.Int64
	)
	start := time.Now()
	for range n {
		wg.Add(1)
		if err := g.Publish(ctx, &nats.Msg{Subject: "probe.g.m", Data: payload}, "", func(_ *jetstream.PubAck, err error) {
			if err != nil {
				refused.Add(1)
			}
			wg.Done()
		}); err != nil {
			return 0, err
		}
	}
	wg.Wait()
	rate := float64(n) / time.Since(start).Seconds()
	if k := refused.Load(); k > 0 {
		return 0, fmt.Errorf("group commit: %d publishes failed", k)
	}
	batches, _ := g.Stats()
	if batches == 0 && n >= 1000 {
		return 0, fmt.Errorf("group commit: no batch in %d publishes", n)
	}
	return rate, nil
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

package soak

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/e2e/bench"
	"github.com/mlsched/mlsched/e2e/harness"
	"github.com/mlsched/mlsched/shared/topology"
)

// ResultsDesign is one way of keeping results, compared by RunResults.
type ResultsDesign struct {
	// Name labels it in the report.
	Name string `json:"name"`
	// MaxMsgs and MaxAge of the results stream (0: none).
	MaxMsgs int64         `json:"max_msgs"`
	MaxAge  time.Duration `json:"max_age"`
	// Shards > 0 puts results on that many subjects
	// (mlsched.results.s<k>) instead of one per task: no per-task index
	// in nats-server, and no lookup by id either.
	Shards int `json:"shards"`
}

// ResultsReport is what RunResults measured: nats-server's RSS and the
// stream over the run.
type ResultsReport struct {
	Design   ResultsDesign `json:"design"`
	Rate     int           `json:"rate"`
	Duration time.Duration `json:"duration"`
	Sent     int64         `json:"sent"`
	// RSS of nats-server in MiB: at start, peak, end; the slope per 10
	// minutes over the last half.
	StartMiB, PeakMiB, EndMiB, SlopeLastHalf10m float64
	// EndMsgs and EndBytes of the results stream.
	EndMsgs, EndBytes uint64
	// Samples: seconds, RSS bytes, stream messages.
	Samples [][3]float64 `json:"samples"`
}

// RunResults isolates what the results stream costs nats-server: it starts
// bin/nats-server alone (the harness's configuration) and stores results at
// rate/s for d the way dispatchers do (expected last subject sequence 0,
// no Nats-Msg-Id), sampling nats-server's RSS and the stream each second.
// With no pipeline around it, it is cheap enough to compare designs on a
// shared machine.
func RunResults(ctx context.Context, design ResultsDesign, rate int, d time.Duration, heap string, logf func(string, ...any)) (*ResultsReport, error) {
	dir, err := os.MkdirTemp("", "mlsched-soak-results-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	g, err := harness.NewGroup(dir)
	if err != nil {
		return nil, err
	}
	defer g.Stop()
	port, err := harness.FreePort()
	if err != nil {
		return nil, err
	}
	g.NATSConfig = fmt.Sprintf("prof_port: %d\n", port)
	n, err := g.StartNATS("nats", "2m") // memory does not depend on fsync; spare a shared disk
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(n.URL)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		return nil, err
	}
	cfg := topology.Streams(topology.Config{})[3]
	cfg.MaxMsgs, cfg.MaxBytes, cfg.MaxAge = design.MaxMsgs, 0, design.MaxAge
	if design.Shards > 0 {
		cfg.MaxMsgsPerSubject = 0
	}
	s, err := js.CreateStream(ctx, cfg)
	if err != nil {
		return nil, err
	}
	rep := &ResultsReport{Design: design, Rate: rate, Duration: d}
	data := []byte(`{"id":"r-00000000000000","status":"succeeded","model":"m1","node":"node-1","attempts":1,"output":"` +
		"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx" + `","latency_ms":2}`)
	start := time.Now()
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			rss, _ := bench.RSS(n.Pid())
			var msgs uint64
			if info, err := s.Info(ctx); err == nil {
				msgs = info.State.Msgs
			}
			rep.Samples = append(rep.Samples, [3]float64{time.Since(start).Seconds(), float64(rss), float64(msgs)})
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				if time.Since(start) > d+2*time.Second {
					return
				}
			}
		}
	}()
	logf("results-only %s: %d/s for %v", design.Name, rate, d)
	var opts []jetstream.PublishOpt
	if design.Shards == 0 {
		opts = append(opts, jetstream.WithExpectLastSequencePerSubject(0))
	}
	for i := 0; time.Since(start) < d && ctx.Err() == nil; i++ {
		target := start.Add(time.Duration(int64(i) * int64(time.Second) / int64(rate)))
		if ahead := time.Until(target); ahead >= time.Millisecond {
			time.Sleep(ahead)
		}
		id := "r" + strconv.Itoa(i)
		subj := topology.ResultSubject(id)
		if design.Shards > 0 {
			subj = topology.ResultSubject("s" + strconv.Itoa(i%design.Shards))
		}
		for {
			if _, err := js.PublishMsgAsync(&nats.Msg{Subject: subj, Data: data}, opts...); err == nil {
				break
			}
			select {
			case <-js.PublishAsyncComplete():
			case <-time.After(time.Second):
			}
		}
		rep.Sent++
	}
	<-js.PublishAsyncComplete()
	<-done
	if heap != "" {
		if err := fetchHeap(ctx, fmt.Sprintf("127.0.0.1:%d", port), heap); err != nil {
			logf("heap: %v", err)
		}
	}
	var xs, ys []float64
	end := rep.Samples[len(rep.Samples)-1][0]
	for _, smp := range rep.Samples {
		mib := smp[1] / (1 << 20)
		if rep.StartMiB == 0 {
			rep.StartMiB = mib
		}
		rep.PeakMiB, rep.EndMiB = max(rep.PeakMiB, mib), mib
		if smp[0] >= end/2 {
			xs, ys = append(xs, smp[0]), append(ys, mib)
		}
	}
	rep.SlopeLastHalf10m = slope(xs, ys) * 600
	if info, err := s.Info(ctx); err == nil {
		rep.EndMsgs, rep.EndBytes = info.State.Msgs, info.State.Bytes
	}
	return rep, nil
}

package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mlsched/mlsched/e2e/harness"
	"github.com/mlsched/mlsched/shared/client"
	"github.com/mlsched/mlsched/shared/protocol"
)

// A scrape or a dashboard stream never blocks the dispatch path. The same
// batch of tasks runs through a dispatcher and a worker alone, then while 4
// clients scrape /metrics 10 times a second each, 4 connections hold a
// /metrics response unread (a stalled scraper), 4 dashboard event streams
// stay open and 2 more are never read (stalled browsers). The loaded run
// completes, at a throughput not below a generous fraction of the quiet run
// measured just before it. Timing on a shared 2-core machine is noisy (other
// processes come and go between the two runs; once the loaded run measured
// 0.33 of the quiet one while nothing was wrong), so a pair of runs below the
// bound is measured again, up to loadRounds pairs: a scrape or stream that
// really slows dispatch does so in every pair. The figures are logged.
func TestScrapesAndStreamsDoNotSlowDispatch(t *testing.T) {
	requireBinaries(t, "dispatcher", "worker")
	t.Parallel()
	c := harness.New(t)
	c.StartNATS()
	d := c.StartDispatcher(harness.DispatcherOptions{})
	c.StartWorker(harness.WorkerOptions{NodeID: "node-1", ModelsFile: "testdata/node-1.yaml", Concurrency: 32, SimSeed: 1})
	base, err := d.HTTPURL()
	if err != nil {
		t.Fatal(err)
	}
	_, js := c.Conn()
	cl := client.New(js)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	const n = 1000
	run := func(label string) float64 {
		ids := make([]string, n)
		start := time.Now()
		for i := range n {
			ids[i] = fmt.Sprintf("%s-%d", label, i)
			if _, err := cl.Submit(ctx, protocol.Task{ID: ids[i], Type: "classify", Payload: json.RawMessage(`{}`)}); err != nil {
				t.Fatal(err)
			}
		}
		if err := cl.WaitAll(ctx, ids, func(*protocol.Result) {}); err != nil {
			t.Fatalf("%s: %v", label, err)
		}
		return n / time.Since(start).Seconds()
	}
	run("warmup") // statistics, consumers and connections in place

	const loadRounds = 3
	for round := 1; ; round++ {
		quiet := run(fmt.Sprintf("quiet%d", round))
		loaded, scrapes, events := loadedRun(ctx, t, base, func() float64 { return run(fmt.Sprintf("loaded%d", round)) })
		t.Logf("round %d: throughput %.0f tasks/s alone, %.0f tasks/s with scrapes and streams (ratio %.2f); %d scrapes, %d events meanwhile",
			round, quiet, loaded, loaded/quiet, scrapes, events)
		if scrapes == 0 || events == 0 {
			t.Fatalf("the load was not there: %d scrapes, %d stream events", scrapes, events)
		}
		if loaded >= 0.3*quiet {
			return
		}
		if round == loadRounds {
			t.Fatalf("throughput fell below 30%% under scrapes and streams in each of %d rounds (last: from %.0f to %.0f tasks/s)",
				loadRounds, quiet, loaded)
		}
	}
}

// loadedRun runs run while 4 clients scrape base's /metrics 10 times a second
// each, 4 connections hold a /metrics response unread, 4 dashboard event
// streams are read and 2 are never read; it returns run's figure and how many
// scrapes and stream events the load saw.
func loadedRun(ctx context.Context, t *testing.T, base string, run func() float64) (figure float64, scrapes, events int64) {
	t.Helper()
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	var wg sync.WaitGroup
	var nScrapes, nEvents atomic.Int64
	for range 4 { // scrapers on keep-alive connections, each 10 times a second (Prometheus: every 15s)
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			for loadCtx.Err() == nil {
				select {
				case <-loadCtx.Done():
					return
				case <-tick.C:
				}
				req, _ := http.NewRequestWithContext(loadCtx, http.MethodGet, base+"/metrics", nil)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					nScrapes.Add(1)
				}
			}
		}()
	}
	for range 4 { // stalled scrapers: the request is sent, the response never read
		conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := fmt.Fprintf(conn, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 { // stalled browsers: dashboard event streams opened and never read
		req, _ := http.NewRequestWithContext(loadCtx, http.MethodGet, base+"/api/events", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
	}
	for range 4 { // dashboard event streams
		req, _ := http.NewRequestWithContext(loadCtx, http.MethodGet, base+"/api/events", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("/api/events: %s", resp.Status)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			sc.Buffer(make([]byte, 1<<20), 16<<20)
			for sc.Scan() {
				if strings.HasPrefix(sc.Text(), "event:") {
					nEvents.Add(1)
				}
			}
		}()
	}
	figure = run()
	stopLoad()
	wg.Wait()
	return figure, nScrapes.Load(), nEvents.Load()
}

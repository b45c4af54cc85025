package bench

import (
	"context"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// ScenarioObserved is mlsched with operators watching: while every phase
// runs, Options.Observers dashboard event streams stay open on the
// dispatcher (half of them never read: stalled browsers) and as many
// clients scrape /metrics back to back. Compared with ScenarioMlsched in the
// same run, it shows what watching costs the dispatch path.
const ScenarioObserved = "mlsched-observed"

// Observers holds the watching clients of ScenarioObserved.
type Observers struct {
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	scrapes atomic.Int64
	events  atomic.Int64 // bytes read by the reading event streams
	errors  atomic.Int64
}

// ObserverStats is what the observers did during a scenario.
type ObserverStats struct {
	Streams int `json:"event_streams"`
	// Stalled event streams were opened and never read.
	Stalled  int `json:"stalled_event_streams"`
	Scrapers int `json:"scrapers"`
	// ScrapeInterval is each scraper's period.
	ScrapeInterval time.Duration `json:"scrape_interval_ns"`
	// Scrapes of /metrics completed.
	Scrapes int64 `json:"scrapes"`
	// EventBytes read by the reading event streams.
	EventBytes int64 `json:"event_bytes"`
	Errors     int64 `json:"errors"`
}

// StartObservers opens n event streams (half stalled) and n scrapers, each
// scraping every interval, on the dispatcher's listener at base.
func StartObservers(ctx context.Context, base string, n int, interval time.Duration) (*Observers, ObserverStats, error) {
	ctx, cancel := context.WithCancel(ctx)
	o := &Observers{cancel: cancel}
	st := ObserverStats{Streams: n, Stalled: n / 2, Scrapers: n, ScrapeInterval: interval}
	client := &http.Client{}
	for i := range n {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/events", nil)
		if err != nil {
			cancel()
			return nil, st, err
		}
		res, err := client.Do(req)
		if err != nil {
			cancel()
			return nil, st, err
		}
		o.wg.Add(1)
		go func() {
			defer o.wg.Done()
			defer res.Body.Close()
			if i < st.Stalled { // a stalled browser: holds the stream, reads nothing
				<-ctx.Done()
				return
			}
			buf := make([]byte, 32<<10)
			for {
				k, err := res.Body.Read(buf)
				o.events.Add(int64(k))
				if err != nil {
					return
				}
			}
		}()
		o.wg.Add(1)
		go func() {
			defer o.wg.Done()
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for ; ctx.Err() == nil; <-tick.C {
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
				res, err := client.Do(req)
				if err != nil {
					if ctx.Err() == nil {
						o.errors.Add(1)
					}
					continue
				}
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
				o.scrapes.Add(1)
			}
		}()
	}
	return o, st, nil
}

// Events is how many bytes the reading event streams have read so far.
func (o *Observers) Events() int64 { return o.events.Load() }

// Stop closes every observer and completes st with what they did.
func (o *Observers) Stop(st *ObserverStats) {
	o.cancel()
	o.wg.Wait()
	st.Scrapes, st.EventBytes, st.Errors = o.scrapes.Load(), o.events.Load(), o.errors.Load()
}

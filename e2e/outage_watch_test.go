package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/mlsched/mlsched/e2e/harness"
)

// outageSeen is how long the dispatchers showed a node outage, read from
// their own /readyz (a "node outage" degraded line) and /metrics
// (mlsched_node_outage above 0), polled every 250 ms: issue 39 asks that an
// outage show in readiness and metrics while it lasts.
type outageSeen struct {
	mu                    sync.Mutex
	readyz, metrics       time.Duration
	firstReadyz, lastSeen time.Time
	notReady              int // polls in which a dispatcher answered /readyz not ready during an outage
}

func (o *outageSeen) watch(ctx context.Context, disps []*harness.Dispatcher) {
	const every = 250 * time.Millisecond
	tick := time.NewTicker(every)
	defer tick.Stop()
	hc := &http.Client{Timeout: time.Second}
	get := func(url string) (int, string) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return 0, ""
		}
		resp, err := hc.Do(req)
		if err != nil {
			return 0, ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		inReadyz, inMetrics, notReady := false, false, false
		for _, d := range disps {
			base, err := d.HTTPURL()
			if err != nil {
				continue // restarting, or killed
			}
			if code, body := get(base + "/readyz"); strings.Contains(body, "node outage") {
				inReadyz = true
				notReady = notReady || code != http.StatusOK
			}
			if _, body := get(base + "/metrics"); metricAboveZero(body, "mlsched_node_outage") {
				inMetrics = true
			}
		}
		o.mu.Lock()
		now := time.Now()
		if inReadyz {
			o.readyz += every
			if o.firstReadyz.IsZero() {
				o.firstReadyz = now
			}
			o.lastSeen = now
		}
		if inMetrics {
			o.metrics += every
			o.lastSeen = now
		}
		if notReady {
			o.notReady++
		}
		o.mu.Unlock()
	}
}

// metricAboveZero reports whether any sample of the metric family is above 0.
func metricAboveZero(text, name string) bool {
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, name) || strings.HasPrefix(line, "#") {
			continue
		}
		var v float64
		if i := strings.LastIndexByte(line, ' '); i > 0 {
			if _, err := fmt.Sscan(line[i+1:], &v); err == nil && v > 0 {
				return true
			}
		}
	}
	return false
}

// shown says whether the outage showed at all in both places.
func (o *outageSeen) shown() (readyz, metrics bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.readyz > 0, o.metrics > 0
}

func (o *outageSeen) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return fmt.Sprintf("node outage shown by a dispatcher: /readyz %.2fs, /metrics %.2fs (polled every 250ms); /readyz not ready meanwhile %d times",
		o.readyz.Seconds(), o.metrics.Seconds(), o.notReady)
}

package dispatcher

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// serveAdmin answers `mlsched stats` with this replica's report. Every
// replica answers; the CLI takes the first answer.
func (d *Dispatcher) serveAdmin() (*nats.Subscription, error) {
	return d.nc.Subscribe(protocol.SubjectAdminStats, func(m *nats.Msg) {
		r := d.Report()
		r.Backlog = d.Backlog()
		data, err := json.Marshal(r)
		if err == nil {
			_ = m.Respond(data)
		}
	})
}

// Report builds this replica's view of the cluster.
func (d *Dispatcher) Report() *protocol.StatsReport {
	select {
	case <-d.initDone:
	default: // still starting: nothing to report but the name
		return &protocol.StatsReport{Dispatcher: d.cfg.Name, Window: d.cfg.StatsWindow}
	}
	r := &protocol.StatsReport{Dispatcher: d.cfg.Name, Store: d.kind, Window: d.cfg.StatsWindow,
		Policies: map[string]string{"*": d.cfg.Policy}}
	for k, v := range d.cfg.PolicyConfig().PerType {
		r.Policies[k] = v
	}
	c := &d.counters
	r.Counters = map[string]int64{
		"dispatched": c.Dispatched.Load(), "redispatched": c.Redispatched.Load(), "results": c.Results.Load(),
		"rejected": c.Rejected.Load(), "dead_lettered": c.DeadLettered.Load(), "suppressed": c.Suppressed.Load(),
		"late": c.Late.Load(), "lost": c.Lost.Load(), "panic": c.Panic.Load(), "cancelled": c.Cancelled.Load(),
		"saturated": c.Saturated.Load(),
		"forged":    c.Forged.Load(), "unserved_refused": c.UnservedRefused.Load(),
		"reports": c.Reports.Load(), "reports_deferred": c.ReportsDeferred.Load(),
		"succeeded": c.Succeeded.Load(), "failed": c.Failed.Load(), "shed": c.Shed.Load(),
	}
	r.Types = c.types.snapshot()
	if reason := d.snaps.degraded.Load(); reason != nil {
		r.Degraded, r.DegradedReason = true, *reason
	}
	wired := d.wired.Load() // batch and reg are set
	if wired {
		bs := d.batch.Stats()
		r.Buffered, r.Dropped = bs.Buffered, bs.Dropped
		if bs.Degraded && !r.Degraded {
			r.Degraded, r.DegradedReason = true, "statistics updates are buffered: "+bs.LastError
		}
	}
	if wired {
		r.Nodes = d.reg.Live()
		r.Counters["bad_heartbeats"] = d.reg.Refused()
	}
	r.Held = d.held.len()
	r.Unserved = d.unserved.len()
	snap := d.snaps.snap.Load()
	if snap == nil {
		return r
	}
	r.SnapshotAt = snap.Taken
	var total int64
	for _, m := range snap.Models {
		total += m.Dispatched
	}
	for name, m := range snap.Models {
		mr := protocol.ModelReport{Name: name, Dispatched: m.Dispatched, Successes: m.Successes,
			ModelErrors: m.ModelErrors, Timeouts: m.Timeouts, TaskErrors: m.TaskErrors, Expired: m.Expired,
			Late: m.Late, InFlight: m.InFlight, Breaker: m.Breaker.State.String(),
			P50Ms: ms(m.Latency.Quantile(0.5)), P95Ms: ms(m.Latency.Quantile(0.95))}
		if j := m.Judged(); j > 0 {
			mr.SuccessRate = float64(m.Successes) / float64(j)
		}
		if total > 0 {
			mr.TrafficShare = float64(m.Dispatched) / float64(total)
		}
		r.Models = append(r.Models, mr)
	}
	sort.Slice(r.Models, func(i, j int) bool { return r.Models[i].Name < r.Models[j].Name })
	return r
}

// backlogNow counts the tasks waiting in MLSCHED_TASKS per type (submitted,
// not yet dispatched): one stream-info request, off the dispatch path.
func (d *Dispatcher) backlogNow(ctx context.Context) (map[string]int64, error) {
	s, err := d.js.Stream(ctx, topology.StreamTasks)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", topology.StreamTasks, err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(topology.SubjectTasksAll))
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", topology.StreamTasks, err)
	}
	out := make(map[string]int64, len(info.State.Subjects))
	for subj, n := range info.State.Subjects {
		out[strings.TrimPrefix(subj, topology.TaskSubject(""))] = int64(n)
	}
	return out, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

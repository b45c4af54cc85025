package dispatcher

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/dispatcher/internal/registry"
	"github.com/mlsched/mlsched/shared/topology"
)

// streamsInterval is how often the streams' sizes are sampled for the
// metrics: one stream-info request per stream, off the dispatch path.
const streamsInterval = 10 * time.Second

// streamSample is one stream's size against its bounds (-1: none).
type streamSample struct {
	name             string
	msgs, bytes      uint64
	maxMsgs, maxByte int64
	maxAge           time.Duration
	oldest           time.Time // zero when empty
}

// streamSampler samples mlsched's streams' sizes and bounds for the
// metrics, off the dispatch path.
type streamSampler struct {
	js   jetstream.JetStream
	log  zerolog.Logger
	last atomic.Pointer[[]streamSample]
}

// run samples every streamsInterval until ctx ends.
func (ss *streamSampler) run(ctx context.Context) {
	names := []string{topology.StreamTasks, topology.StreamDispatch, topology.StreamOutcomes, topology.StreamResults, topology.StreamDLQ}
	sample := func(ctx context.Context) {
		out := make([]streamSample, 0, len(names))
		for _, n := range names {
			rctx, cancel := context.WithTimeout(ctx, streamsInterval/2)
			s, err := ss.js.Stream(rctx, n) // a stream-info request
			cancel()
			if err != nil {
				ss.log.Debug().Err(err).Str("stream", n).Msg("stream sample failed")
				continue
			}
			info := s.CachedInfo()
			smp := streamSample{name: n, msgs: info.State.Msgs, bytes: info.State.Bytes,
				maxMsgs: info.Config.MaxMsgs, maxByte: info.Config.MaxBytes, maxAge: info.Config.MaxAge}
			if info.State.Msgs > 0 {
				smp.oldest = info.State.FirstTime
			}
			out = append(out, smp)
		}
		ss.last.Store(&out)
	}
	sample(ctx)
	every(ctx, streamsInterval, sample)
}

var (
	descStreamMsgs = prometheus.NewDesc("mlsched_stream_messages",
		"Messages in the stream, sampled every 10s.", []string{"stream"}, nil)
	descStreamBytes = prometheus.NewDesc("mlsched_stream_bytes",
		"Bytes the stream stores, sampled every 10s.", []string{"stream"}, nil)
	descStreamMaxMsgs = prometheus.NewDesc("mlsched_stream_max_messages",
		"The stream's message bound (absent: none); MLSCHED_RESULTS_MAX_MSGS for MLSCHED_RESULTS.", []string{"stream"}, nil)
	descStreamMaxBytes = prometheus.NewDesc("mlsched_stream_max_bytes",
		"The stream's byte bound (absent: none): MLSCHED_TASKS_MAX_BYTES, MLSCHED_RESULTS_MAX_BYTES, MLSCHED_DLQ_MAX_BYTES.", []string{"stream"}, nil)
	descStreamMaxAge = prometheus.NewDesc("mlsched_stream_max_age_seconds",
		"The stream's age bound (absent: none).", []string{"stream"}, nil)
	descStreamOldest = prometheus.NewDesc("mlsched_stream_oldest_age_seconds",
		"Age of the stream's oldest message (absent when empty); for MLSCHED_RESULTS it is the results window: a result older than it is gone.", []string{"stream"}, nil)
)

// streamsCollector reports the last stream sample.
type streamsCollector struct{ d *Dispatcher }

func (c *streamsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descStreamMsgs, descStreamBytes, descStreamMaxMsgs, descStreamMaxBytes, descStreamMaxAge, descStreamOldest} {
		ch <- d
	}
}

func (c *streamsCollector) Collect(ch chan<- prometheus.Metric) {
	parts := c.d.parts.Load()
	if parts == nil {
		return
	}
	p := parts.streams.last.Load()
	if p == nil {
		return
	}
	g := func(desc *prometheus.Desc, v float64, stream string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, v, stream)
	}
	for _, s := range *p {
		g(descStreamMsgs, float64(s.msgs), s.name)
		g(descStreamBytes, float64(s.bytes), s.name)
		if s.maxMsgs > 0 {
			g(descStreamMaxMsgs, float64(s.maxMsgs), s.name)
		}
		if s.maxByte > 0 {
			g(descStreamMaxBytes, float64(s.maxByte), s.name)
		}
		if s.maxAge > 0 {
			g(descStreamMaxAge, s.maxAge.Seconds(), s.name)
		}
		if !s.oldest.IsZero() {
			g(descStreamOldest, max(0, time.Since(s.oldest).Seconds()), s.name)
		}
	}
}

// backlogInterval is how often the backlog per type is sampled.
const backlogInterval = 2 * time.Second

// backlogSampler samples the tasks waiting in MLSCHED_TASKS per type, off
// the dispatch path: one stream-info request with per-subject counts every
// backlogInterval. A message being dispatched counts until its dispatch is
// acknowledged.
type backlogSampler struct {
	js   jetstream.JetStream
	reg  *registry.Registry // the types live nodes serve are reported at 0 too
	log  zerolog.Logger
	last atomic.Pointer[map[string]int64]
	// prune, when set, removes finished tasks just before each sample: a
	// limits-retention task stream keeps them until pruned, and the
	// backlog is what is not finished (taskprune.go). What it cannot
	// remove yet, a task finished above a floor an older running task
	// holds, still counts until that task ends.
	prune *taskPruner
}

func (b *backlogSampler) run(ctx context.Context) {
	sample := func(ctx context.Context) {
		rctx, cancel := context.WithTimeout(ctx, backlogInterval)
		defer cancel()
		s, err := b.sample(rctx)
		if err != nil {
			b.log.Debug().Err(err).Msg("backlog sample failed")
			return
		}
		b.last.Store(&s)
	}
	sample(ctx)
	every(ctx, backlogInterval, sample)
}

func (b *backlogSampler) sample(ctx context.Context) (map[string]int64, error) {
	if b.prune != nil {
		if err := b.prune.prune(ctx); err != nil {
			b.log.Debug().Err(err).Msg("removing finished tasks before the backlog sample failed")
		}
	}
	st, err := b.js.Stream(ctx, topology.StreamTasks)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", topology.StreamTasks, err)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(topology.SubjectTasksAll))
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", topology.StreamTasks, err)
	}
	out := make(map[string]int64, len(info.State.Subjects))
	for subj, n := range info.State.Subjects {
		typ, _, ok := topology.ParseTaskSubject(subj) // a type's priority bands sum up
		if !ok {
			typ = strings.TrimPrefix(subj, topology.TaskSubject(""))
		}
		out[typ] += int64(n)
	}
	for _, n := range b.reg.Live() {
		for _, m := range n.Models {
			for _, t := range m.Types {
				if _, ok := out[t]; !ok {
					out[t] = 0
				}
			}
		}
	}
	return out, nil
}

// get is the last sample (nil before the first); the map must not be
// modified.
func (b *backlogSampler) get() map[string]int64 {
	if s := b.last.Load(); s != nil {
		return *s
	}
	return nil
}

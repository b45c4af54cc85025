package autoscaler

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/shared/topology"
)

// The backlog the formula drains is read here, at every step, from the task
// stream's consumers: not from the dispatchers' reports, whose backlog is a
// sample taken every 2 s (dispatcher/streams.go). A burst reached the
// formula up to a sample late, and a drained burst kept asking for replicas
// for as long; in the replay of the Azure code trace at 10x (2 s is 20 s of
// the trace there) that lag set the p99 queue wait (docs/operations.md,
// "Judged on a trace").
//
// A task message is acknowledged only after its final result
// (docs/protocol.md), so num_pending + num_ack_pending of the consumers
// that deliver tasks counts every task not finished: waiting in the stream,
// held by a dispatcher, queued on a node or running. These are the band
// consumers and the parked consumers (a tenant's tasks moved out of a
// band's window are acked there and counted on their parked consumer): one
// CONSUMER.LIST request per step. The total is spread over the task types
// in proportion to the dispatchers' last sample (exact with one type), or,
// when that sample holds nothing, to the stream's own per-subject counts.

// backlogTimeout bounds the read: a refused request gets no reply.
const backlogTimeout = time.Second

// backlogReader reads the unfinished tasks per type.
type backlogReader struct {
	js  jetstream.JetStream
	nc  *nats.Conn
	log zerolog.Logger

	mu     sync.Mutex
	off    string    // why it stopped reading (the server refuses it); "" while on
	warned time.Time // the last failure logged, at most one a minute
}

// consumesTasks reports whether a consumer of MLSCHED_TASKS delivers tasks
// to the dispatchers: a band's or a parked one.
func consumesTasks(name string) bool {
	if strings.HasPrefix(name, topology.ParkedConsumerPrefix) {
		return true
	}
	for _, b := range topology.Bands {
		if n, _ := topology.BandConsumer(b); n == name {
			return true
		}
	}
	return false
}

// unfinished is the consumers' total of tasks not finished.
func (r *backlogReader) unfinished(ctx context.Context) (int64, error) {
	st, err := r.js.Stream(ctx, topology.StreamTasks)
	if err != nil {
		return 0, err
	}
	var total int64
	seen := 0
	lister := st.ListConsumers(ctx)
	for info := range lister.Info() {
		if info == nil || !consumesTasks(info.Name) {
			continue
		}
		seen++
		total += int64(info.NumPending) + int64(info.NumAckPending)
	}
	if err := lister.Err(); err != nil {
		return 0, err
	}
	if seen == 0 {
		return 0, errors.New("no task consumer yet (no dispatcher has started)")
	}
	return total, nil
}

// subjectWeights are the stream's messages per task type (finished tasks
// not yet pruned included: only their proportions are used).
func (r *backlogReader) subjectWeights(ctx context.Context) (map[string]int64, error) {
	st, err := r.js.Stream(ctx, topology.StreamTasks)
	if err != nil {
		return nil, err
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(topology.SubjectTasksAll))
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for subj, n := range info.State.Subjects {
		if typ, _, ok := topology.ParseTaskSubject(subj); ok {
			out[typ] += int64(n)
		}
	}
	return out, nil
}

// read returns each type's share of the consumers' count, read now, for
// the types of the dispatchers' sample (ok false: keep the sample). On
// failure it logs (at most once a minute); a request the server refuses
// stops the reading for good, said once with what to do.
func (r *backlogReader) read(ctx context.Context, sampled map[string]int64) (map[string]int64, bool) {
	if r == nil || r.js == nil || len(sampled) == 0 {
		return nil, false
	}
	r.mu.Lock()
	off := r.off
	r.mu.Unlock()
	if off != "" {
		return nil, false
	}
	ctx, cancel := context.WithTimeout(ctx, backlogTimeout)
	defer cancel()
	total, err := r.unfinished(ctx)
	weights := sampled
	var sum int64
	if err == nil {
		for _, n := range sampled {
			sum += n
		}
		if sum == 0 && len(sampled) > 1 && total > 0 {
			weights, err = r.subjectWeights(ctx)
			sum = 0
			for t := range sampled {
				sum += weights[t]
			}
		}
	}
	if err != nil {
		r.failed(err)
		return nil, false
	}
	out := make(map[string]int64, len(sampled))
	for t := range sampled {
		switch {
		case sum > 0:
			out[t] = total * weights[t] / sum
		case len(sampled) == 1:
			out[t] = total
		default:
			out[t] = 0 // several types, nothing to spread by: none has tasks in the stream
		}
	}
	return out, true
}

// failed logs a failed read, and stops reading when the server refuses it.
func (r *backlogReader) failed(err error) {
	refused := false
	if r.nc != nil {
		if le := r.nc.LastError(); le != nil && strings.Contains(strings.ToLower(le.Error()), "permissions violation") &&
			strings.Contains(le.Error(), topology.StreamTasks) {
			refused = true
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if refused {
		r.off = "refused by the server"
		r.log.Warn().Err(err).Msg("autoscale: NATS refuses reading the task consumers' counts ($JS.API.CONSUMER.LIST." +
			topology.StreamTasks + "); the backlog is the dispatchers' 2 s sample from now on. Regenerate auth.conf " +
			"(make secrets or mlsched auth init) and restart nats to grant it to the admin role")
		return
	}
	if time.Since(r.warned) >= time.Minute {
		r.warned = time.Now()
		r.log.Warn().Err(fmt.Errorf("read the task consumers: %w", err)).
			Msg("autoscale: using the dispatchers' backlog sample this step")
	}
}

package dispatcher

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/dispatcher/internal/finish"
	"github.com/mlsched/mlsched/shared/jsplumb"
	"github.com/mlsched/mlsched/shared/topology"
)

// Finished tasks leave a limits-retention MLSCHED_TASKS in batches.
//
// On a work-queue stream the server removes a task when it is acked, and
// with sync_interval always that removal is a tombstone written and
// fsynced on its own, under the stream's lock: a second fsync per task on
// the one stream every task is stored in. Under limits retention an ack
// only moves the consumer's ack state (which the server writes about ten
// times a second, not per ack), and the task pruner removes what is
// finished:
//
//   - every pruneEvery, for each band's consumer, everything at or below its
//     ack floor, one purge per filter: one tombstone batch and one fsync for
//     all of them;
//   - a task acked here but still above the floor after straggleAfter (an
//     older task of its band still runs, holding the floor), by its
//     sequence: the work-queue cost, paid only while the floor is held, and
//     off the dispatch path.
//
// Nothing unfinished is removed: a consumer's ack floor is below every
// message it has not had acked, and only acked (finished) tasks are
// deleted by sequence. A task whose ack the server lost (its consumer's
// state is written ten times a second, so a nats-server crash can lose the
// last acks) is delivered again and found finished: intake acks a task
// whose result exists without running it (docs/protocol.md, "What is
// stored where, and why nothing is lost").
const (
	pruneEvery    = time.Second
	straggleAfter = 10 * time.Second
)

// taskPruner removes finished tasks from a limits-retention task stream.
// It does nothing on a work-queue one, whose acks remove them.
type taskPruner struct {
	js       jetstream.JetStream
	log      zerolog.Logger
	every    time.Duration
	straggle time.Duration

	passMu sync.Mutex // one pass at a time: the loop's and the backlog sampler's

	// active: the task stream is under limits retention (set by each
	// pass, under mu). The Acked hook, which runs for every result, reads
	// it first: on a work-queue stream it returns without parsing.
	active atomic.Bool

	mu     sync.Mutex
	acked  []ackedTask       // acked here, above their consumer's floor when last looked
	floors map[string]uint64 // consumer -> ack floor last purged up to
	// parked, when set, lists the parked tasks' consumers (internal/intake/park.go), pruned
	// as the bands' are.
	parked func() (durables, filters []string)
}

type ackedTask struct {
	consumer string
	seq      uint64
	at       time.Time
}

func newTaskPruner(js jetstream.JetStream, log zerolog.Logger) *taskPruner {
	return &taskPruner{js: js, log: log.With().Str("component", "task pruner").Logger(),
		every: pruneEvery, straggle: straggleAfter, floors: map[string]uint64{}}
}

// noteAcked is the Completer's Acked hook: it notes the acked message when it
// is a task of a dispatchers' consumer.
func (p *taskPruner) noteAcked(msg jsplumb.Msg) {
	if !p.active.Load() {
		return
	}
	var subj string
	switch m := msg.(type) {
	case taskAcker: // the keeper's messages say which task they ack
		var ok bool
		if subj, ok = m.ackedTask(); !ok {
			return
		}
	case interface{ Reply() string }:
		subj = m.Reply()
	}
	consumer, s, ok := finish.ParseTaskAck(subj)
	if !ok {
		return
	}
	seq, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return
	}
	p.mu.Lock()
	if p.active.Load() {
		p.acked = append(p.acked, ackedTask{consumer: consumer, seq: seq, at: time.Now()})
	}
	p.mu.Unlock()
}

// run prunes every p.every until ctx ends, once it finds the task stream
// under limits retention.
func (p *taskPruner) run(ctx context.Context) {
	every(ctx, p.every, func(ctx context.Context) {
		if err := p.prune(ctx); err != nil && ctx.Err() == nil {
			p.log.Warn().Err(err).Msg("removing finished tasks failed; retried at the next pass")
		}
	})
}

// prune runs one pass: purges below each band's ack floor, then deletes
// the stragglers.
func (p *taskPruner) prune(ctx context.Context) error {
	p.passMu.Lock()
	defer p.passMu.Unlock()
	s, err := p.js.Stream(ctx, topology.StreamTasks)
	if err != nil {
		return err
	}
	limits := s.CachedInfo().Config.Retention == jetstream.LimitsPolicy
	p.mu.Lock()
	p.active.Store(limits)
	if !limits {
		p.acked = nil
	}
	p.mu.Unlock()
	if !limits {
		return nil
	}
	var errs []error
	floors := map[string]uint64{}
	type pruned struct {
		durable string
		filters []string
	}
	var consumers []pruned
	for _, band := range topology.Bands {
		durable, filters := topology.BandConsumer(band)
		consumers = append(consumers, pruned{durable, filters})
	}
	if p.parked != nil {
		durables, filters := p.parked()
		for i := range durables {
			consumers = append(consumers, pruned{durables[i], filters[i : i+1]})
		}
	}
	for _, pc := range consumers {
		durable, filters := pc.durable, pc.filters
		c, err := s.Consumer(ctx, durable)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		floor := c.CachedInfo().AckFloor.Stream
		floors[durable] = floor
		// Unchanged: nothing new to purge. A floor lower than the last
		// (the consumer or the stream re-created) is purged up to as well.
		if floor == 0 || floor == p.floors[durable] {
			continue
		}
		purged := true
		for _, f := range filters {
			if err := s.Purge(ctx, jetstream.WithPurgeSubject(f), jetstream.WithPurgeSequence(floor+1)); err != nil {
				errs = append(errs, err)
				purged = false
			}
		}
		if purged {
			p.floors[durable] = floor
		}
	}
	// Stragglers: acked here, still above their floor after p.straggle.
	now := time.Now()
	var late []uint64
	p.mu.Lock()
	keep := p.acked[:0]
	for _, a := range p.acked {
		switch f, known := floors[a.consumer]; {
		case known && a.seq <= f: // purged with its floor
		case now.Sub(a.at) >= p.straggle:
			late = append(late, a.seq)
		default:
			keep = append(keep, a)
		}
	}
	clear(p.acked[len(keep):])
	p.acked = keep
	p.mu.Unlock()
	for _, seq := range late {
		if err := s.DeleteMsg(ctx, seq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

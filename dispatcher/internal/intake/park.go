package intake

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/shared/jsplumb"
	"github.com/mlsched/mlsched/shared/lifecycle"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// Parking: fairness between tenants across the whole backlog, not only what
// a replica has pulled.
//
// A band's consumer delivers MLSCHED_TASKS in stream order, and what the
// replicas have pulled of it is bounded by its MaxAckPending. A tenant that
// floods fills that window with its own tasks, and every other tenant's task
// waits in the stream behind the flood, however fair the hold's order is
// (issue 20: 46.7 s against 72 ms alone). So a task of a tenant that already
// has MLSCHED_PARK_ABOVE tasks held in its band, while another tenant has
// sent to that band within the last parkMemory, is parked instead of held:
// published, unchanged, on mlsched.tasks._park[-high|-low].t_<tenant> with its
// submission's time and sequence in headers, and then acked (publish then
// ack: a crash between the two parks it again, and the message id, which
// names the submission, makes that harmless). The band's window stays open to
// the other tenants, whose tasks reach the hold as soon as they are stored.
//
// Each band and tenant with parked tasks has a durable consumer every
// replica shares (topology.ParkedConsumer), with a MaxAckPending of twice
// MLSCHED_PARK_ABOVE: a tenant's parked tasks come back, oldest first, as
// fast as its held ones leave, and take their place in the hold's fair
// order. A parked task is never parked again. A replica consumes the
// parked subjects it parks on, and every parkScan it looks for the others
// (a replica that parked and died leaves them to the rest). A task with
// its result stored is acked, not run again.
//
// One tenant alone is never parked: with nobody to be fair to it would only
// cost a publish per task, so a producer that names no tenant is served
// exactly as before.
const (
	parkMemory = time.Minute
	parkScan   = 2 * time.Second
)

// hdrParkedFrom carries a parked task's original subject.
const hdrParkedFrom = "Mlsched-Parked-From"

// parking parks tasks over their tenant's share of a band and consumes the
// parked ones back.
type parking struct {
	parkingParams

	mu sync.Mutex
	// lastTenant and otherAt, per band (index band+1): the tenant of the
	// band's last task, and when a task of another tenant than the one
	// before it arrived.
	lastTenant [3]string
	otherAt    [3]time.Time
	consumers  map[string]*parkedConsumer // by durable name
	wanted     chan bandTenant
}

type parkingParams struct {
	above    int // MLSCHED_PARK_ABOVE; 0: never park
	ackWait  time.Duration
	log      zerolog.Logger
	js       jetstream.JetStream
	held     heldCounts     // admission: how many of a tenant's tasks it holds
	pub      jsplumb.Sender // where parked tasks are published
	complete *jsplumb.Completer
	parked   *atomic.Int64
	handle   jetstream.MessageHandler // intake's handleParked
}

// heldCounts is what parking reads of admission's hold.
type heldCounts interface {
	TenantHeld(band int, tenant string) int
}

// bandTenant keys one tenant's tasks of one priority band.
type bandTenant struct {
	band   int
	tenant string
}

type parkedConsumer struct {
	c     *jsplumb.Consumer
	empty int // scans in a row that found its subject empty
}

func newParking(p parkingParams) *parking {
	return &parking{parkingParams: p, consumers: map[string]*parkedConsumer{}, wanted: make(chan bandTenant, 64)}
}

// shouldPark notes a task of the band pulled from the stream, and reports
// whether it is over its tenant's share: its tenant holds at least
// MLSCHED_PARK_ABOVE of the band while another tenant sends to it.
func (p *parking) shouldPark(band int, tenant string) bool {
	if p == nil || p.above <= 0 {
		return false
	}
	now := time.Now()
	i := band + 1
	p.mu.Lock()
	if p.lastTenant[i] != tenant {
		if p.lastTenant[i] != "" {
			p.otherAt[i] = now
		}
		p.lastTenant[i] = tenant
	}
	shared := !p.otherAt[i].IsZero() && now.Sub(p.otherAt[i]) < parkMemory
	p.mu.Unlock()
	return shared && p.held.TenantHeld(band, tenant) >= p.above
}

// park publishes the task on its tenant's parked subject and acks msg once
// it is stored.
func (p *parking) park(msg jsplumb.Msg, t *protocol.Task, data []byte, o taskOrigin) {
	band, tenant := topology.BandOf(t.Priority), t.TenantName()
	h := nats.Header{}
	h.Set(hdrParkedFrom, o.subject)
	h.Set(protocol.HdrSubmitted, strconv.FormatInt(o.submitted.UnixMilli(), 10))
	h.Set(protocol.HdrTaskSeq, o.submission) // the original's, for the record
	if o.traceparent != "" {
		h.Set(protocol.HdrTraceparent, o.traceparent)
	}
	out := &nats.Msg{Subject: topology.ParkedSubject(band, tenant), Data: data, Header: h}
	id := t.ID
	// The message id names the submission and the task: a crash between
	// the publish and the ack parks it once, and no producer's id (a task
	// id is a token, without spaces) can make a parking look a duplicate.
	err := p.complete.Publish(context.Background(), p.pub, msg, out, "mlsched park "+o.submission+" "+id, func(ack *jetstream.PubAck, err error) error {
		if err != nil {
			p.log.Warn().Err(err).Str("task_id", id).Msg("parking failed, will retry")
			return err
		}
		if !ack.Duplicate {
			p.parked.Add(1)
		}
		return nil
	})
	if err != nil {
		p.log.Warn().Err(err).Str("task_id", id).Msg("parking failed, will retry")
		p.complete.Retry(msg, time.Second)
		return
	}
	select {
	case p.wanted <- bandTenant{band, tenant}:
	default: // the loop is busy: its next scan finds the subject
	}
}

// parkedOrigin reads a parked task's origin: its subject and submission
// time from the headers park added. Its submission is now the parked
// message (its sequence), which its dispatches name and whose ack subject
// they carry, and which a cancel finds: the original is acked and gone.
func parkedOrigin(msg jetstream.Msg) (taskOrigin, error) {
	h := msg.Headers()
	o := taskOrigin{subject: h.Get(hdrParkedFrom), parked: true, traceparent: protocol.TraceparentOf(h), first: true}
	if meta, err := msg.Metadata(); err == nil {
		o.first = meta.NumDelivered == 1
		o.submission = strconv.FormatUint(meta.Sequence.Stream, 10)
	}
	ms, err := strconv.ParseInt(h.Get(protocol.HdrSubmitted), 10, 64)
	if o.subject == "" || err != nil || ms <= 0 {
		return o, protocol.Errorf(protocol.CodeInvalidField,
			"published on %s, a subject where the dispatcher parks tasks, without the headers it adds; publish tasks on mlsched.tasks.<type>", msg.Subject())
	}
	o.submitted = time.UnixMilli(ms)
	return o, nil
}

// service runs the parked consumers: those this replica parks on, and
// every parkScan those any replica left with tasks.
func (p *parking) service() lifecycle.Service {
	return lifecycle.Run(func(ctx context.Context, ready func()) error {
		ready()
		if p.above <= 0 {
			<-ctx.Done()
			return nil
		}
		t := time.NewTicker(parkScan)
		defer t.Stop()
		p.scan(ctx)
		for {
			select {
			case <-ctx.Done():
				p.stopAll()
				return nil
			case bt := <-p.wanted:
				p.consume(ctx, bt.band, bt.tenant)
			case <-t.C:
				p.scan(ctx)
			}
		}
	})
}

// scan starts a consumer for every parked subject with tasks and stops
// those whose subject was found empty twice in a row.
func (p *parking) scan(ctx context.Context) {
	sctx, cancel := context.WithTimeout(ctx, parkScan)
	defer cancel()
	s, err := p.js.Stream(sctx, topology.StreamTasks)
	if err != nil {
		p.log.Debug().Err(err).Msg("parked tasks: stream info failed")
		return
	}
	found := map[string]bool{}
	for _, f := range topology.ParkedFilters() {
		info, err := s.Info(sctx, jetstream.WithSubjectFilter(f))
		if err != nil {
			p.log.Debug().Err(err).Msg("parked tasks: stream info failed")
			return
		}
		for subj, n := range info.State.Subjects {
			band, tenant, ok := topology.ParseParkedSubject(subj)
			if !ok || n == 0 {
				continue
			}
			found[topology.ParkedConsumer(band, tenant)] = true
			p.consume(ctx, band, tenant)
		}
	}
	p.mu.Lock()
	var idle []*parkedConsumer
	for name, pc := range p.consumers {
		if found[name] {
			pc.empty = 0
		} else if pc.empty++; pc.empty >= 2 {
			idle = append(idle, pc)
			delete(p.consumers, name)
		}
	}
	p.mu.Unlock()
	for _, pc := range idle {
		_ = pc.c.Stop()
	}
}

// consume starts the band's and tenant's parked consumer unless it runs.
func (p *parking) consume(ctx context.Context, band int, tenant string) {
	name := topology.ParkedConsumer(band, tenant)
	p.mu.Lock()
	if pc := p.consumers[name]; pc != nil {
		pc.empty = 0
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	c := &jsplumb.Consumer{JS: p.js, Stream: topology.StreamTasks, Handle: p.handle,
		Config: jetstream.ConsumerConfig{
			Durable:       name,
			FilterSubject: topology.ParkedSubject(band, tenant),
			AckPolicy:     jetstream.AckExplicitPolicy,
			AckWait:       p.ackWait,
			MaxAckPending: 2 * p.above,
			MaxDeliver:    -1, // settled by us, as the band consumers
			// nobody has consumed it for that long: no task is parked there
			InactiveThreshold: 10 * time.Minute,
		},
		Pull: min(p.above, 256), Heartbeat: 5 * time.Second, Check: 5 * time.Second,
		Log: p.log.With().Str("consumer", name).Logger()}
	if err := c.Start(ctx); err != nil {
		if ctx.Err() == nil {
			p.log.Warn().Err(err).Str("consumer", name).Msg("cannot consume parked tasks; retried at the next scan")
		}
		return
	}
	p.mu.Lock()
	p.consumers[name] = &parkedConsumer{c: c}
	p.mu.Unlock()
}

// running lists the parked consumers this replica runs, with their
// filters, for the task pruner.
func (p *parking) running() (durables, filters []string) {
	if p == nil {
		return nil, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for name, pc := range p.consumers {
		durables, filters = append(durables, name), append(filters, pc.c.Config.FilterSubject)
	}
	return durables, filters
}

func (p *parking) stopAll() {
	p.mu.Lock()
	all := p.consumers
	p.consumers = map[string]*parkedConsumer{}
	p.mu.Unlock()
	var wg sync.WaitGroup
	for _, pc := range all {
		wg.Go(func() { _ = pc.c.Stop() })
	}
	wg.Wait()
}

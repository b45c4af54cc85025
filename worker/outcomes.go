package worker

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/shared/jspub"
	"github.com/mlsched/mlsched/shared/protocol"
)

// outcomePublisher publishes outcomes asynchronously and acks each dispatch
// only once its outcome is settled: a task's slot is free as soon as its
// outcome is handed to the connection, instead of waiting a round trip (and
// the server's fsync) for the answer. At most window outcomes are
// unconfirmed at once on each path. It is shared/jspub's publisher: each
// answer, read by hand on one reply subscription, acks its dispatch by
// callback (no future, channel or confirming goroutine per outcome).
//
// A successful outcome goes first to a dispatcher as a direct report
// (topology.ReportSubject), which answers once the task's result is stored;
// without a positive answer (none running, a refusal, a timeout) it is
// stored in MLSCHED_OUTCOMES like every other outcome. Either way the
// dispatch is acked only after its outcome is settled or stored.
type outcomePublisher struct {
	nc  *nats.Conn
	pub *jspub.Publisher
	// direct sends direct reports (nil: every outcome is stored).
	direct *jspub.Publisher
	// refused is set once NATS refused a direct report for want of
	// permission (an auth.conf written before them): every outcome is
	// stored from then on, instead of waiting for an answer each time.
	refused atomic.Bool
	// finished runs once per outcome, after its dispatch was acked or
	// nak'ed (the worker's task accounting).
	finished func()
	// reports counts direct reports from their publish until their
	// callback is done, including the stored publish a failed one starts:
	// close waits for it before it stops the stored publisher. closing
	// (under mu) sends what comes after close begins (a task abandoned at
	// the shutdown grace, finishing late) to the stopped stored publisher.
	mu      sync.Mutex
	closing bool
	reports sync.WaitGroup
}

func newOutcomePublisher(ctx context.Context, nc *nats.Conn, window int, timeout time.Duration, direct bool, finished func()) (*outcomePublisher, error) {
	pub := jspub.New(nc, jspub.Config{MaxPending: window, Timeout: timeout})
	if err := pub.Start(ctx); err != nil {
		return nil, err
	}
	p := &outcomePublisher{nc: nc, pub: pub, finished: finished}
	if direct {
		// An empty answer is JetStream confirming the dispatch's ack, which
		// the dispatcher published for us (dispatcher/reports.go).
		p.direct = jspub.New(nc, jspub.Config{MaxPending: window, Timeout: timeout, EmptyReplyOK: true})
		if err := p.direct.Start(ctx); err != nil {
			_ = pub.Stop()
			return nil, err
		}
	}
	return p, nil
}

// publish hands the outcome to the connection and returns; the dispatch
// msg is acked once the outcome is settled (direct) or stored, or nak'ed
// for redelivery when it cannot be (stop runs first in both cases). It
// blocks while window outcomes are unconfirmed. An error means the publish
// could not even start; the caller still owns msg. directSubject, when not
// empty, sends the outcome there first.
func (p *outcomePublisher) publish(om *nats.Msg, msgID, directSubject string, msg jetstream.Msg, log zerolog.Logger, stop func()) error {
	if p.direct == nil || directSubject == "" || p.refused.Load() {
		return p.store(context.Background(), om, msgID, msg, log, stop)
	}
	p.mu.Lock()
	if p.closing {
		p.mu.Unlock()
		return p.store(context.Background(), om, msgID, msg, log, stop)
	}
	p.reports.Add(1)
	p.mu.Unlock()
	stored := om.Subject
	om.Subject = directSubject
	if ack := msg.Reply(); ack != "" {
		om.Header[protocol.HdrAck] = []string{ack}
	}
	err := p.direct.Publish(context.Background(), om, msgID, func(a *jetstream.PubAck, err error) {
		if err == nil {
			defer p.reports.Done()
			if a.Stream == "" { // JetStream's confirmation: the dispatcher acked the dispatch
				stop()
				p.finished()
				return
			}
			p.settled(msg, log, stop)
			return
		}
		switch {
		case errors.Is(err, jspub.ErrTimeout) && p.permissionRefused(directSubject):
			if !p.refused.Swap(true) {
				log.Warn().Str("subject", directSubject).Msg("NATS refuses this node's direct reports (an authorization " +
					"written before them: regenerate it with mlsched auth init, or set MLSCHED_STORED_OUTCOMES_ONLY=true): " +
					"storing every outcome from now on")
			}
		case !errors.Is(err, jspub.ErrNoResponders):
			log.Debug().Err(err).Msg("direct report not settled: storing the outcome")
		}
		// Off the reply goroutine: the stored publish may wait for room.
		om.Subject, om.Reply = stored, ""
		delete(om.Header, protocol.HdrAck)
		go func() {
			defer p.reports.Done()
			if err := p.store(context.Background(), om, msgID, msg, log, stop); err != nil {
				p.failed(msg, log, stop, err)
			}
		}()
	})
	if err != nil {
		p.reports.Done() // the callback will not run
	}
	return err
}

// permissionRefused reports whether the connection's last error is the
// server refusing a publish on subject.
func (p *outcomePublisher) permissionRefused(subject string) bool {
	err := p.nc.LastError()
	return err != nil && errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), `"`+subject+`"`)
}

// store publishes the outcome to MLSCHED_OUTCOMES and acks msg once stored.
func (p *outcomePublisher) store(ctx context.Context, om *nats.Msg, msgID string, msg jetstream.Msg, log zerolog.Logger, stop func()) error {
	return p.pub.Publish(ctx, om, msgID, func(_ *jetstream.PubAck, err error) {
		if err != nil {
			p.failed(msg, log, stop, err)
			return
		}
		p.settled(msg, log, stop)
	})
}

func (p *outcomePublisher) settled(msg jetstream.Msg, log zerolog.Logger, stop func()) {
	stop()
	if err := msg.Ack(); err != nil {
		// A plain ack, not a double ack: the outcome is stored or settled,
		// so a lost ack costs only a redelivery, whose re-run outcome
		// JetStream drops as a duplicate (same Nats-Msg-Id) and which the
		// dispatcher would refuse as a second result anyway.
		log.Warn().Err(err).Msg("ack of the dispatch failed")
	}
	p.finished()
}

func (p *outcomePublisher) failed(msg jetstream.Msg, log zerolog.Logger, stop func(), err error) {
	stop()
	log.Error().Err(err).Msg("outcome not published; dispatch nak'ed for redelivery")
	if err := msg.NakWithDelay(nakDelay); err != nil {
		log.Warn().Err(err).Msg("nak failed")
	}
	p.finished()
}

// close waits for every pending outcome (at most the publish timeout per
// path); publish must not be called after.
func (p *outcomePublisher) close() {
	p.mu.Lock()
	p.closing = true
	p.mu.Unlock()
	if p.direct != nil {
		_ = p.direct.Stop()
	}
	p.reports.Wait() // every callback done, every fallback handed to the stored publisher
	_ = p.pub.Stop()
}

// progressTimer signals InProgress every interval until stop: a timer, not
// a goroutine per task.
func progressTimer(msg jetstream.Msg, every time.Duration, log zerolog.Logger) (stop func()) {
	var mu sync.Mutex
	stopped := false
	var t *time.Timer
	mu.Lock()
	defer mu.Unlock()
	t = time.AfterFunc(every, func() {
		if err := msg.InProgress(); err != nil {
			log.Debug().Err(err).Msg("in-progress signal failed")
		}
		mu.Lock()
		defer mu.Unlock()
		if !stopped {
			t.Reset(every)
		}
	})
	return func() {
		mu.Lock()
		defer mu.Unlock()
		stopped = true
		t.Stop()
	}
}

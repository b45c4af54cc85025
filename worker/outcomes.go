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

	"github.com/mlsched/mlsched/shared/jsplumb"
	"github.com/mlsched/mlsched/shared/protocol"
)

// outcomePublisher publishes outcomes asynchronously and acks each dispatch
// only once its outcome is settled: a task's slot is free as soon as its
// outcome is handed to the connection, instead of waiting a round trip (and
// the server's fsync) for the answer. At most window outcomes are
// unconfirmed at once on each path. It is shared/jsplumb's publisher: each
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
	pub *jsplumb.Publisher
	// direct sends direct reports (nil: every outcome is stored).
	direct *jsplumb.Publisher
	// complete settles every dispatch (the seam: nothing else here acks,
	// naks or keeps one in progress); its Settled hook must call settled.
	complete *jsplumb.Completer
	// unsettled counts the outcomes handed to publish until their dispatch
	// is acked or nak'ed (or acked by the dispatcher for us), so that a
	// shutdown waits for them (wait); settled is its one release.
	unsettled sync.WaitGroup
	// unstored keeps the outcomes that could not be stored, for their
	// dispatch's redelivery (unreported.go); delivered learns which
	// dispatches' outcomes are settled, and which go back unsettled
	// (redelivered.go).
	unstored  *unreported
	delivered *deliveries
	// refused is set once NATS refused a direct report for want of
	// permission (an auth.conf written before them): every outcome is
	// stored from then on, instead of waiting for an answer each time.
	refused atomic.Bool
	// reports counts direct reports from their publish until their
	// callback is done, including the stored publish a failed one starts:
	// close waits for it before it stops the stored publisher. closing
	// (under mu) sends what comes after close begins (a task abandoned at
	// the shutdown grace, finishing late) to the stopped stored publisher.
	mu      sync.Mutex
	closing bool
	reports sync.WaitGroup
}

// newOutcomePublisher starts the publisher. complete's Settled hook must
// call the publisher's settled: every dispatch it settles after a publish
// is one of the publisher's outcomes.
func newOutcomePublisher(ctx context.Context, nc *nats.Conn, complete *jsplumb.Completer, unstored *unreported, delivered *deliveries, window int, timeout time.Duration, direct bool) (*outcomePublisher, error) {
	pub := jsplumb.NewPublisher(nc, jsplumb.PublisherConfig{MaxPending: window, Timeout: timeout})
	if err := pub.Start(ctx); err != nil {
		return nil, err
	}
	p := &outcomePublisher{nc: nc, pub: pub, complete: complete, unstored: unstored, delivered: delivered}
	if direct {
		p.direct = jsplumb.NewPublisher(nc, jsplumb.PublisherConfig{MaxPending: window, Timeout: timeout})
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
	p.unsettled.Add(1)
	err := p.send(om, msgID, directSubject, msg, log, stop)
	if err != nil {
		p.unstored.keep(msgID, om.Data)
		p.delivered.forget(msgID)
		p.settled() // nothing will settle it here: the caller owns msg
	}
	return err
}

// settled: an outcome handed to publish is done with, its dispatch acked
// or nak'ed (or acked by the dispatcher for us), or its publish could not
// start. The one release of unsettled: the Completer's Settled hook calls
// it for what a stored publish settles.
func (p *outcomePublisher) settled() { p.unsettled.Done() }

// wait waits until every outcome handed to publish is settled.
func (p *outcomePublisher) wait() { p.unsettled.Wait() }

// send is publish without the accounting.
func (p *outcomePublisher) send(om *nats.Msg, msgID, directSubject string, msg jetstream.Msg, log zerolog.Logger, stop func()) error {
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
	err := p.direct.Request(context.Background(), om, msgID, func(reply *nats.Msg, err error) {
		var r protocol.ReportReply
		if err == nil {
			r, err = protocol.DecodeReportReply(reply.Data)
		}
		switch {
		case err == nil && r.Status == protocol.ReportAcked: // the dispatcher acked the dispatch for us
			defer p.reports.Done()
			stop()
			p.delivered.settled(msgID) // should that ack be lost, the redelivery is acked, not run
			p.settled()
			return
		case err == nil && r.Status == protocol.ReportSettled:
			defer p.reports.Done()
			stop()
			p.delivered.settled(msgID)
			p.complete.Settle(msg, nil)
			p.settled()
			return
		case err == nil: // deferred: the stored path handles it
			log.Debug().Str("reason", r.Reason).Msg("direct report deferred: storing the outcome")
		case errors.Is(err, jsplumb.ErrTimeout) && p.permissionRefused(directSubject):
			if !p.refused.Swap(true) {
				log.Warn().Str("subject", directSubject).Msg("NATS refuses this node's direct reports (an authorization " +
					"written before them: regenerate it with mlsched auth init, or set MLSCHED_STORED_OUTCOMES_ONLY=true): " +
					"storing every outcome from now on")
			}
		case !errors.Is(err, jsplumb.ErrNoResponders):
			log.Debug().Err(err).Msg("direct report not settled: storing the outcome")
		}
		// Off the reply goroutine: the stored publish may wait for room.
		om.Subject, om.Reply = stored, ""
		delete(om.Header, protocol.HdrAck)
		go func() {
			defer p.reports.Done()
			if err := p.store(context.Background(), om, msgID, msg, log, stop); err != nil {
				p.unstored.keep(msgID, om.Data)
				p.delivered.forget(msgID)
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
// server refusing a publish on subject. nats.go reports a refused publish
// only as the connection's last error (nats.ErrPermissionViolation), not
// per message, and only the server's text names the subject.
func (p *outcomePublisher) permissionRefused(subject string) bool {
	err := p.nc.LastError()
	return err != nil && errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), `"`+subject+`"`)
}

// store publishes the outcome to MLSCHED_OUTCOMES; the Completer acks msg
// once it is stored, or naks it.
func (p *outcomePublisher) store(ctx context.Context, om *nats.Msg, msgID string, msg jetstream.Msg, log zerolog.Logger, stop func()) error {
	return p.complete.Publish(ctx, p.pub, msg, om, msgID, func(_ *jetstream.PubAck, err error) error {
		stop()
		if err != nil {
			p.unstored.keep(msgID, om.Data) // reported, not run, when the dispatch is back
			p.delivered.forget(msgID)
			log.Error().Err(err).Msg("outcome not published; dispatch nak'ed for redelivery")
			return err
		}
		p.delivered.settled(msgID) // stored: should its ack be lost, the redelivery is acked, not run
		return nil
	})
}

// failed naks the dispatch of an outcome that could not be published.
func (p *outcomePublisher) failed(msg jetstream.Msg, log zerolog.Logger, stop func(), err error) {
	stop()
	log.Error().Err(err).Msg("outcome not published; dispatch nak'ed for redelivery")
	p.complete.Settle(msg, err)
	p.settled()
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

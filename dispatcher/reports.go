package dispatcher

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mlsched/mlsched/shared/jsplumb"
	"github.com/mlsched/mlsched/shared/lifecycle"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// Direct reports (docs/protocol.md): a worker sends a successful outcome as
// a core-NATS request on mlsched.report.<node>, to one dispatcher replica of
// the queue group. The replica settles it exactly as it settles a stored
// outcome (same checks, same settle rules, same publish-then-ack), and its
// "ack" is the answer to the request, sent once the task's result is
// stored: only then does the worker ack its dispatch, so the dispatch stays
// the record of the attempt until the result exists, as with a stored
// outcome. Whatever cannot be settled at once (not a success, headers that
// do not parse, a failed result publish) is answered ReportDeferred, and
// the worker stores the outcome in MLSCHED_OUTCOMES instead, where the
// usual path handles it. A lost answer (a replica killed mid-report) costs
// the worker a timeout, then the same fallback; the result's expected
// sequence refuses the second result.
//
// This saves, per task, the outcome's store, its delivery to a consumer and
// its removal: three stored messages per task instead of four.

// deferredReply answers what the stored path must handle.
var deferredReply = protocol.ReportReply{Status: protocol.ReportDeferred,
	Reason: "not settled at once: store this outcome in MLSCHED_OUTCOMES"}.AppendJSON(nil)

// handleReport is one direct report.
func (oc *outcomes) handleReport(m *nats.Msg) {
	if m.Reply == "" {
		return // nobody to answer: a worker always asks for an answer
	}
	r := &report{m: m, nc: oc.nc, ack: reportAckSubject(m)}
	o, err := protocol.DecodeOutcome(m.Data)
	if err != nil || o.TaskID == "" || o.Status != protocol.OutcomeSuccess {
		// Not for this path: the stored path dead-letters or retries it,
		// with the stream's ids and redelivery.
		r.deferToStream(oc.counters)
		return
	}
	pd, err := protocol.ParseDispatch(m.Header)
	if err != nil {
		r.deferToStream(oc.counters)
		return
	}
	oc.counters.Reports.Add(1)
	oc.settleOutcome(r, m.Subject, o, pd, true)
}

// reportsService serves direct reports while running. Stopping drains the
// subscription: reports already received are settled and answered (the
// publishers stop after it), later ones find no responder and are stored.
func (oc *outcomes) reportsService() lifecycle.Service {
	var sub *nats.Subscription
	return &lifecycle.Func{
		OnStart: func(context.Context) (err error) {
			sub, err = oc.nc.QueueSubscribe(topology.SubjectReportsAll, topology.QueueDispatchers, oc.handleReport)
			return err
		},
		OnStop: func() error {
			closed := sub.StatusChanged(nats.SubscriptionClosed)
			if err := sub.Drain(); err != nil {
				return sub.Unsubscribe()
			}
			select { // every report received is handled; bounded, should the connection hang
			case <-closed:
			case <-time.After(10 * time.Second):
			}
			return nil
		},
	}
}

// report is a direct report, settled by the outcome path through the same
// seam as a stored outcome (jsplumb.Completer, whose jsplumb.Msg it is): Ack
// answers "settled", a nak answers "store it" (ReportDeferred). It answers
// once; what comes after is ignored.
//
// When the report names its dispatch's acknowledgement subject (HdrAck),
// Ack first acknowledges the dispatch itself, then answers ReportAcked:
// the worker acks nothing, one message less per task than answering and
// letting the worker ack. Both go out on one connection, in that order, and
// are as reliable as the worker's own plain ack would be: a lost one costs
// a redelivery of the dispatch, whose second result is refused.
type report struct {
	m    *nats.Msg
	nc   *nats.Conn
	ack  string // the dispatch's ack subject, or "" to answer ReportSettled
	once sync.Once
}

var _ jsplumb.Msg = (*report)(nil)

// reportAckSubject is the report's HdrAck when it acknowledges a dispatch
// of the reporting node's own consumer (anything else a node could ack
// itself anyway, but the dispatcher publishes nothing else for it), else "".
func reportAckSubject(m *nats.Msg) string {
	subj := m.Header.Get(protocol.HdrAck)
	node, ok := strings.CutPrefix(m.Subject, topology.ReportSubject(""))
	if subj == "" || !ok {
		return ""
	}
	rest, ok := strings.CutPrefix(subj, "$JS.ACK."+topology.StreamDispatch+"."+topology.NodeConsumer(node)+".")
	if !ok || rest == "" || strings.ContainsAny(rest, "*> \t\r\n") {
		return ""
	}
	return subj
}

func (r *report) answer(b []byte) error {
	err := errors.New("answered already")
	r.once.Do(func() { err = r.nc.Publish(r.m.Reply, b) })
	return err
}

func (r *report) deferToStream(c *Counters) {
	c.ReportsDeferred.Add(1)
	_ = r.answer(deferredReply)
}

// Ack answers that the report is settled (its result stored).
func (r *report) Ack() error {
	if r.ack == "" {
		return r.answer(protocol.ReportReply{Status: protocol.ReportSettled}.AppendJSON(nil))
	}
	err := errors.New("answered already")
	r.once.Do(func() {
		if err = r.nc.Publish(r.ack, []byte("+ACK")); err == nil {
			err = r.nc.Publish(r.m.Reply, protocol.ReportReply{Status: protocol.ReportAcked}.AppendJSON(nil))
		}
	})
	return err
}

// NakWithDelay answers "store it": the stored path redelivers and backs
// off, which a request cannot.
func (r *report) NakWithDelay(time.Duration) error { return r.answer(deferredReply) }

// InProgress keeps the dispatch alive when the report named its ack
// subject; the worker does so anyway until it is answered.
func (r *report) InProgress() error {
	if r.ack == "" {
		return nil
	}
	return r.nc.Publish(r.ack, []byte("+WPI"))
}

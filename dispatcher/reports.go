package dispatcher

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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
// do not parse, a failed result publish) is answered with an error, and
// the worker stores the outcome in MLSCHED_OUTCOMES instead, where the
// usual path handles it. A lost answer (a replica killed mid-report) costs
// the worker a timeout, then the same fallback; the result's expected
// sequence refuses the second result.
//
// This saves, per task, the outcome's store, its delivery to a consumer and
// its removal: three stored messages per task instead of four.

// Answers to a direct report. reportOK reads as a JetStream publish
// acknowledgement, so the worker's publisher (shared/jspub) takes it as
// "stored"; an error answer reads as a JetStream API error.
var (
	reportOK       = []byte(`{"stream":"mlsched-report","seq":0}`)
	reportDeferred = []byte(`{"error":{"code":409,"err_code":0,"description":"mlsched: store this outcome in MLSCHED_OUTCOMES"}}`)
)

// handleReport is one direct report.
func (d *Dispatcher) handleReport(m *nats.Msg) {
	if m.Reply == "" {
		return // nobody to answer: a worker always asks for an answer
	}
	r := &reportMsg{m: m, nc: d.nc, ack: reportAckSubject(m)}
	o, err := protocol.DecodeOutcome(m.Data)
	if err != nil || o.TaskID == "" || o.Status != protocol.OutcomeSuccess {
		// Not for this path: the stored path dead-letters or retries it,
		// with the stream's ids and redelivery.
		r.deferToStream(&d.counters)
		return
	}
	pd, err := protocol.ParseDispatch(m.Header)
	if err != nil {
		r.deferToStream(&d.counters)
		return
	}
	d.counters.Reports.Add(1)
	d.settleOutcome(r, o, pd, true)
}

// reportsService serves direct reports while running. Stopping drains the
// subscription: reports already received are settled and answered (the
// publishers stop after it), later ones find no responder and are stored.
func (d *Dispatcher) reportsService() lifecycle.Service {
	var sub *nats.Subscription
	return &lifecycle.Func{
		OnStart: func(context.Context) (err error) {
			sub, err = d.nc.QueueSubscribe(topology.SubjectReportsAll, topology.QueueDispatchers, d.handleReport)
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

// reportMsg is a direct report seen as a consumed message, so that the
// outcome path settles it unchanged: Ack answers "settled", a nak answers
// "store it". It answers once; what comes after is ignored.
//
// When the report names its dispatch's acknowledgement subject (HdrAck),
// Ack publishes that acknowledgement itself, with the report's reply
// subject: JetStream acks the dispatch and confirms it to the worker, which
// is the answer. That is one message less per task than answering and
// letting the worker ack.
type reportMsg struct {
	m    *nats.Msg
	nc   *nats.Conn
	ack  string // the dispatch's ack subject, or "" to answer reportOK
	once sync.Once
}

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

var _ jetstream.Msg = (*reportMsg)(nil)

// errNoMetadata: a direct report was never stored.
var errNoMetadata = errors.New("a direct report has no stream metadata")

func (r *reportMsg) answer(b []byte) error {
	err := errors.New("answered already")
	r.once.Do(func() { err = r.nc.Publish(r.m.Reply, b) })
	return err
}

func (r *reportMsg) deferToStream(c *Counters) {
	c.ReportsDeferred.Add(1)
	_ = r.answer(reportDeferred)
}

func (r *reportMsg) Metadata() (*jetstream.MsgMetadata, error) { return nil, errNoMetadata }
func (r *reportMsg) Data() []byte                              { return r.m.Data }
func (r *reportMsg) Headers() nats.Header                      { return r.m.Header }
func (r *reportMsg) Subject() string                           { return r.m.Subject }
func (r *reportMsg) Reply() string                             { return r.m.Reply }
func (r *reportMsg) Ack() error {
	if r.ack == "" {
		return r.answer(reportOK)
	}
	err := errors.New("answered already")
	r.once.Do(func() { err = r.nc.PublishMsg(&nats.Msg{Subject: r.ack, Reply: r.m.Reply}) })
	return err
}
func (r *reportMsg) DoubleAck(context.Context) error  { return r.Ack() }
func (r *reportMsg) Term() error                      { return r.Ack() }
func (r *reportMsg) TermWithReason(string) error      { return r.Ack() }
func (r *reportMsg) InProgress() error                { return nil }
func (r *reportMsg) Nak() error                       { return r.answer(reportDeferred) }
func (r *reportMsg) NakWithDelay(time.Duration) error { return r.answer(reportDeferred) }

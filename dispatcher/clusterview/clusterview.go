// Package clusterview builds the whole cluster's view from every dispatcher
// replica's report: the dashboard and `mlsched top` show the same thing.
//
// Every replica answers protocol.SubjectAdminStats with its StatsReport.
// Model statistics and breakers live in the shared store, so the freshest
// snapshot among the replicas speaks for all of them; counters are per
// replica and are summed; nodes are the union of the live registry entries;
// degraded mode is per replica and is listed per replica. The recent dead
// letters are read from MLSCHED_DLQ.
package clusterview

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/dispatcher/autoscale"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// View is the merged view of the cluster at one moment.
type View struct {
	At       time.Time              `json:"at"`
	Window   time.Duration          `json:"window_ns"`
	Replicas []Replica              `json:"replicas"`
	Models   []protocol.ModelReport `json:"models"`
	Nodes    []Node                 `json:"nodes"`
	// Backlog maps task types to the tasks waiting in MLSCHED_TASKS.
	Backlog map[string]int64 `json:"backlog"`
	// Types sums every replica's final results per task type.
	Types map[string]protocol.TypeCounts `json:"types"`
	// Counters are the replicas' counters summed.
	Counters    map[string]int64 `json:"counters"`
	DeadLetters []DeadLetter     `json:"dead_letters"`
	// DeadLettersTotal counts every entry stored in MLSCHED_DLQ.
	DeadLettersTotal uint64 `json:"dead_letters_total"`
	// Rollouts are the model rollouts, one per family, as the replica
	// that counted the most of each reports it.
	Rollouts []protocol.RolloutReport `json:"rollouts,omitempty"`
	// HeldBy sums the tasks the replicas hold by priority band and tenant
	// (the HeldTenants tenants holding most, the rest as "other"), and
	// EndedBy the tasks they ended without starting, by band and code:
	// the dashboard's flow-control panel.
	HeldBy  []protocol.HeldCount  `json:"held_by,omitempty"`
	EndedBy []protocol.EndedCount `json:"ended_by,omitempty"`
	// QueueTargets are each (model, node)'s queue target, as the replica
	// with the freshest statistics applies it (docs/policies.md, "The
	// queue target").
	QueueTargets []protocol.QueueTargetReport `json:"queue_targets,omitempty"`
	// Budgets are the cost budgets, each with the highest spending a
	// replica read (they share it through Redis), and Cost the declared
	// cost of the replicas' attempts summed, by type, model and tenant.
	Budgets []protocol.BudgetReport `json:"budgets,omitempty"`
	Cost    *protocol.CostReport    `json:"cost,omitempty"`
	// Autoscale are the autoscaler's last decisions, one per worker pool
	// (replicas now, recommended, and why), from MLSCHED_AUTOSCALE; none
	// when no autoscaler runs.
	Autoscale []autoscale.Decision `json:"autoscale,omitempty"`
	// Problems lists what could not be read (the rest of the view stands).
	Problems []string `json:"problems,omitempty"`
}

// Replica is one dispatcher replica's own state.
type Replica struct {
	Name           string            `json:"name"`
	Store          string            `json:"store"`
	Degraded       bool              `json:"degraded"`
	DegradedReason string            `json:"degraded_reason,omitempty"`
	SnapshotAt     time.Time         `json:"snapshot_at"`
	Buffered       int64             `json:"buffered"`
	Dropped        int64             `json:"dropped"`
	Policies       map[string]string `json:"policies"`
	Counters       map[string]int64  `json:"counters"`
}

// Node is a live worker node and its load.
type Node struct {
	Name string `json:"name"`
	// Host is the host (container) name the node announces, "" when it
	// announces none or one that cannot be shown (Heartbeat.HostName).
	Host     string   `json:"host,omitempty"`
	Models   []string `json:"models"`
	Capacity int      `json:"capacity"`
	InFlight int      `json:"in_flight"`
	// Load is InFlight / Capacity (0 when the capacity is unknown).
	Load     float64   `json:"load"`
	Draining bool      `json:"draining,omitempty"`
	SentAt   time.Time `json:"sent_at"`
	// Unready are the models the node hosts but does not announce now
	// (a model server down, an exec process not started), and why.
	Unready []protocol.UnreadyModel `json:"unready,omitempty"`
}

// DeadLetter is one recent entry of MLSCHED_DLQ, without its bytes.
type DeadLetter struct {
	Seq    uint64        `json:"seq"`
	At     time.Time     `json:"at"`
	Kind   string        `json:"kind"`
	TaskID string        `json:"task_id,omitempty"`
	Code   protocol.Code `json:"code"`
	Reason string        `json:"reason"`
}

// Options of Gather.
type Options struct {
	// Wait bounds the collection of reports, and then the reading of the
	// dead letters (default 2s each).
	Wait time.Duration
	// Quiet ends the gathering once no new replica has answered for this
	// long after the first answer (default 200ms).
	Quiet time.Duration
	// DeadLetters is how many recent entries to read (default 10).
	DeadLetters int
}

func (o Options) withDefaults() Options {
	if o.Wait <= 0 {
		o.Wait = 2 * time.Second
	}
	if o.Quiet <= 0 {
		o.Quiet = 200 * time.Millisecond
	}
	if o.DeadLetters <= 0 {
		o.DeadLetters = 10
	}
	return o
}

// ErrNoDispatcher means no replica answered.
var ErrNoDispatcher = errors.New("no dispatcher answered")

// Gather asks every replica for its report and merges them, with the recent
// dead letters.
func Gather(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, opt Options) (*View, error) {
	opt = opt.withDefaults()
	rctx, cancel := context.WithTimeout(ctx, opt.Wait)
	reports, problems, err := Reports(rctx, nc, opt.Quiet)
	cancel()
	if err != nil {
		return nil, err
	}
	ctx, cancel = context.WithTimeout(ctx, opt.Wait)
	defer cancel()
	v := Merge(reports, time.Now())
	v.Problems = append(v.Problems, problems...)
	if js != nil {
		dls, total, err := RecentDeadLetters(ctx, js, opt.DeadLetters)
		if err != nil {
			v.Problems = append(v.Problems, "dead letters: "+err.Error())
		}
		v.DeadLetters, v.DeadLettersTotal = dls, total
		ds, err := ReadAutoscale(ctx, js)
		if err != nil {
			v.Problems = append(v.Problems, "autoscale decisions: "+err.Error())
		}
		v.Autoscale = ds
	}
	return v, nil
}

// Reports sends one stats request and collects the replies until ctx ends or
// no new one arrived for quiet after the first. Malformed replies are
// reported as problems.
func Reports(ctx context.Context, nc *nats.Conn, quiet time.Duration) ([]protocol.StatsReport, []string, error) {
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, nil, err
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest(protocol.SubjectAdminStats, inbox, nil); err != nil {
		return nil, nil, fmt.Errorf("stats request: %w", err)
	}
	var out []protocol.StatsReport
	var problems []string
	for {
		cx, cancel := ctx, context.CancelFunc(func() {})
		if len(out)+len(problems) > 0 {
			cx, cancel = context.WithTimeout(ctx, quiet)
		}
		m, err := sub.NextMsgWithContext(cx)
		cancel()
		if err != nil {
			if len(out) > 0 {
				return out, problems, nil
			}
			if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
				return nil, problems, fmt.Errorf("%w on %s", ErrNoDispatcher, protocol.SubjectAdminStats)
			}
			return nil, problems, err
		}
		if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
			return nil, nil, fmt.Errorf("%w: nobody listens on %s", ErrNoDispatcher, protocol.SubjectAdminStats)
		}
		var r protocol.StatsReport
		if err := json.Unmarshal(m.Data, &r); err != nil {
			problems = append(problems, fmt.Sprintf("malformed stats report: %v", err))
			continue
		}
		out = append(out, r)
	}
}

// HeldTenants bounds the tenants the merged view names in HeldBy.
const HeldTenants = 20

// mergeFlow sums the replicas' flow-control counts: held by band and
// tenant (bounded: the tenants holding most, the rest "other"), ended by
// band and code.
func mergeFlow(reports []protocol.StatsReport) ([]protocol.HeldCount, []protocol.EndedCount) {
	type bt struct{ band, tenant string }
	held, per := map[bt]int{}, map[string]int{}
	type bc struct {
		band string
		code protocol.Code
	}
	ended := map[bc]int64{}
	for i := range reports {
		for _, h := range reports[i].HeldBy {
			held[bt{h.Band, h.Tenant}] += h.Held
			per[h.Tenant] += h.Held
		}
		for _, e := range reports[i].EndedBy {
			ended[bc{e.Band, e.Code}] += e.Tasks
		}
	}
	tenants := make([]string, 0, len(per))
	for t := range per {
		if t != "other" {
			tenants = append(tenants, t)
		}
	}
	sort.Slice(tenants, func(i, j int) bool {
		if per[tenants[i]] != per[tenants[j]] {
			return per[tenants[i]] > per[tenants[j]]
		}
		return tenants[i] < tenants[j]
	})
	named := map[string]bool{}
	for _, t := range tenants[:min(HeldTenants, len(tenants))] {
		named[t] = true
	}
	merged := map[bt]int{}
	for k, n := range held {
		if !named[k.tenant] {
			k.tenant = "other"
		}
		merged[k] += n
	}
	var hs []protocol.HeldCount
	for k, n := range merged {
		hs = append(hs, protocol.HeldCount{Band: k.band, Tenant: k.tenant, Held: n})
	}
	rank := map[string]int{"high": 0, "normal": 1, "low": 2}
	sort.Slice(hs, func(i, j int) bool {
		if hs[i].Band != hs[j].Band {
			return rank[hs[i].Band] < rank[hs[j].Band]
		}
		return hs[i].Tenant < hs[j].Tenant
	})
	var es []protocol.EndedCount
	for k, n := range ended {
		es = append(es, protocol.EndedCount{Band: k.band, Code: k.code, Tasks: n})
	}
	sort.Slice(es, func(i, j int) bool {
		if es[i].Band != es[j].Band {
			return rank[es[i].Band] < rank[es[j].Band]
		}
		return es[i].Code < es[j].Code
	})
	return hs, es
}

// mergeCosts keeps each budget's highest spending (the same shared figure,
// read at different moments) and sums the replicas' costs.
func mergeCosts(reports []protocol.StatsReport) ([]protocol.BudgetReport, *protocol.CostReport) {
	var bs []protocol.BudgetReport
	var cost *protocol.CostReport
	add := func(dst *map[string]float64, src map[string]float64) {
		for k, x := range src {
			if *dst == nil {
				*dst = map[string]float64{}
			}
			(*dst)[k] += x
		}
	}
	for _, r := range reports {
		for _, b := range r.Budgets {
			i := slices.IndexFunc(bs, func(x protocol.BudgetReport) bool { return x.Scope == b.Scope && x.Name == b.Name })
			switch {
			case i < 0:
				bs = append(bs, b)
			case b.Ends.After(bs[i].Ends) || b.Ends.Equal(bs[i].Ends) && b.Spent > bs[i].Spent:
				bs[i] = b // a later period, or more of this one seen
			}
		}
		if r.Cost != nil {
			if cost == nil {
				cost = &protocol.CostReport{}
			}
			add(&cost.ByType, r.Cost.ByType)
			add(&cost.ByModel, r.Cost.ByModel)
			add(&cost.ByTenant, r.Cost.ByTenant)
		}
	}
	sort.Slice(bs, func(i, j int) bool {
		if bs[i].Scope != bs[j].Scope {
			return bs[i].Scope < bs[j].Scope
		}
		return bs[i].Name < bs[j].Name
	})
	return bs, cost
}

// Merge builds a view from replica reports.
func Merge(reports []protocol.StatsReport, now time.Time) *View {
	v := &View{At: now, Counters: map[string]int64{}, Backlog: map[string]int64{}, Types: map[string]protocol.TypeCounts{}}
	var freshest *protocol.StatsReport
	var backlogAt *protocol.StatsReport
	nodes := map[string]protocol.Heartbeat{}
	for i := range reports {
		r := &reports[i]
		v.Replicas = append(v.Replicas, Replica{Name: r.Dispatcher, Store: r.Store, Degraded: r.Degraded,
			DegradedReason: r.DegradedReason, SnapshotAt: r.SnapshotAt, Buffered: r.Buffered, Dropped: r.Dropped,
			Policies: r.Policies, Counters: r.Counters})
		for k, n := range r.Counters {
			v.Counters[k] += n
		}
		for k, c := range r.Types {
			t := v.Types[k]
			t.Succeeded, t.Failed, t.Rejected, t.Cancelled = t.Succeeded+c.Succeeded, t.Failed+c.Failed, t.Rejected+c.Rejected, t.Cancelled+c.Cancelled
			v.Types[k] = t
		}
		if len(r.Models) > 0 && (freshest == nil || r.SnapshotAt.After(freshest.SnapshotAt)) {
			freshest = r
		}
		if r.Backlog != nil && backlogAt == nil {
			backlogAt = r
		}
		for _, hb := range r.Nodes {
			if old, ok := nodes[hb.Node]; !ok || hb.SentAt.After(old.SentAt) {
				nodes[hb.Node] = hb
			}
		}
		for _, ro := range r.Rollouts {
			i := slices.IndexFunc(v.Rollouts, func(x protocol.RolloutReport) bool { return x.Family == ro.Family })
			switch {
			case i < 0:
				v.Rollouts = append(v.Rollouts, ro)
			case rolloutAhead(ro, v.Rollouts[i]):
				v.Rollouts[i] = ro
			}
		}
	}
	sort.Slice(v.Rollouts, func(i, j int) bool { return v.Rollouts[i].Family < v.Rollouts[j].Family })
	v.HeldBy, v.EndedBy = mergeFlow(reports)
	v.Budgets, v.Cost = mergeCosts(reports)
	sort.Slice(v.Replicas, func(i, j int) bool { return v.Replicas[i].Name < v.Replicas[j].Name })
	if freshest != nil {
		v.Window = freshest.Window
		v.Models = append(v.Models, freshest.Models...)
		v.QueueTargets = append(v.QueueTargets, freshest.QueueTargets...)
		sort.Slice(v.Models, func(i, j int) bool { return v.Models[i].Name < v.Models[j].Name })
	} else if len(reports) > 0 {
		v.Window = reports[0].Window
	}
	if backlogAt != nil {
		for k, n := range backlogAt.Backlog {
			v.Backlog[k] = n
		}
	}
	for _, hb := range nodes {
		n := Node{Name: hb.Node, Host: hb.HostName(), Capacity: hb.Capacity, InFlight: hb.InFlight, Draining: hb.Draining, SentAt: hb.SentAt,
			Unready: hb.Unready}
		for _, m := range hb.Models {
			n.Models = append(n.Models, m.Name)
		}
		sort.Strings(n.Models)
		if hb.Capacity > 0 {
			n.Load = float64(hb.InFlight) / float64(hb.Capacity)
		}
		v.Nodes = append(v.Nodes, n)
	}
	sort.Slice(v.Nodes, func(i, j int) bool { return v.Nodes[i].Name < v.Nodes[j].Name })
	return v
}

// UnreadyModel is a model a node hosts but does not announce.
type UnreadyModel struct {
	Model, Node, Reason string
}

// Unready lists every hosted model not ready now, node by node: tasks
// cannot go there, and a type whose only models are unready is rejected.
func (v *View) Unready() []UnreadyModel {
	var out []UnreadyModel
	for _, n := range v.Nodes {
		for _, u := range n.Unready {
			out = append(out, UnreadyModel{Model: u.Name, Node: n.Name, Reason: u.Reason})
		}
	}
	return out
}

// UnreadyNames are the unready models' names, each once, sorted.
func (v *View) UnreadyNames() []string {
	seen := map[string]bool{}
	var out []string
	for _, u := range v.Unready() {
		if !seen[u.Model] {
			seen[u.Model] = true
			out = append(out, u.Model)
		}
	}
	sort.Strings(out)
	return out
}

// Degraded lists the replicas in degraded mode.
func (v *View) Degraded() []Replica {
	var out []Replica
	for _, r := range v.Replicas {
		if r.Degraded {
			out = append(out, r)
		}
	}
	return out
}

// BacklogTotal sums the backlog over task types.
func (v *View) BacklogTotal() int64 {
	var n int64
	for _, b := range v.Backlog {
		n += b
	}
	return n
}

// RecentDeadLetters reads the last n entries of MLSCHED_DLQ, newest first,
// and the number of entries stored.
func RecentDeadLetters(ctx context.Context, js jetstream.JetStream, n int) ([]DeadLetter, uint64, error) {
	s, err := js.Stream(ctx, topology.StreamDLQ)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, 0, err
	}
	st := info.State
	var out []DeadLetter
	// Entries may have been deleted (replayed); look a bounded way back.
	for seq, tries := st.LastSeq, 0; st.Msgs > 0 && seq >= st.FirstSeq && seq > 0 && len(out) < n && tries < 4*n; seq, tries = seq-1, tries+1 {
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return out, st.Msgs, err
		}
		e := DeadLetter{Seq: m.Sequence, At: m.Time, Kind: strings.TrimPrefix(m.Subject, "mlsched.dlq.")}
		var dl protocol.DeadLetter
		if err := json.Unmarshal(m.Data, &dl); err != nil {
			e.Reason = "unreadable entry: " + err.Error()
		} else {
			e.TaskID, e.Code, e.Reason = dl.TaskID, dl.Code, dl.Reason
			if !dl.At.IsZero() {
				e.At = dl.At
			}
		}
		out = append(out, e)
	}
	return out, st.Msgs, nil
}

// rolloutAhead reports whether a replica's reading of a rollout is newer
// than another's: a later step, or more outcomes counted in the same one.
func rolloutAhead(a, b protocol.RolloutReport) bool {
	if !a.StepSince.Equal(b.StepSince) {
		return a.StepSince.After(b.StepSince)
	}
	n := func(r protocol.RolloutReport) int64 {
		return r.New.Successes + r.New.Failures + r.Incumbent.Successes + r.Incumbent.Failures
	}
	return n(a) > n(b)
}

// ReadAutoscale reads every pool's last decision from MLSCHED_AUTOSCALE
// (none when the bucket does not exist: no autoscaler ever ran).
func ReadAutoscale(ctx context.Context, js jetstream.JetStream) ([]autoscale.Decision, error) {
	kv, err := js.KeyValue(ctx, topology.BucketAutoscale)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return ReadAutoscaleFrom(ctx, kv)
}

// ReadAutoscaleFrom reads every decision of the bucket, by pool name;
// unreadable entries are skipped.
func ReadAutoscaleFrom(ctx context.Context, kv jetstream.KeyValue) ([]autoscale.Decision, error) {
	lister, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	defer lister.Stop()
	var out []autoscale.Decision
	for k := range lister.Keys() {
		e, err := kv.Get(ctx, k)
		if err != nil {
			continue
		}
		var d autoscale.Decision
		if json.Unmarshal(e.Value(), &d) == nil && d.Pool != "" {
			out = append(out, d)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Pool < out[j].Pool })
	return out, nil
}

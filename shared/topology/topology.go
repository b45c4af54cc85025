// Package topology names mlsched's subjects, streams, consumers and buckets,
// and creates them idempotently. A stream or consumer that already exists
// with an incompatible configuration is an error (ErrIncompatible): we never
// overwrite what an operator or another version created.
package topology

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Stream, bucket and subject names of protocol v1.
const (
	StreamTasks    = "MLSCHED_TASKS"
	StreamDispatch = "MLSCHED_DISPATCH"
	StreamOutcomes = "MLSCHED_OUTCOMES"
	StreamResults  = "MLSCHED_RESULTS"
	StreamDLQ      = "MLSCHED_DLQ"
	BucketNodes    = "MLSCHED_NODES"
	// BucketSuperseded records attempts the dispatcher declared lost and
	// re-dispatched, so that their late outcomes are not taken as final.
	BucketSuperseded = "MLSCHED_SUPERSEDED"
	// BucketDispatcher holds what only dispatchers may read: the key that
	// seals dispatches (protocol.Dispatch.Seal).
	BucketDispatcher = "MLSCHED_DISPATCHER"
	// BucketRollouts holds one key per model family with a rollout: its
	// current (or last) rollout and history (dispatcher/rollout). Every
	// dispatcher replica watches it and updates it by compare-and-set.
	BucketRollouts = "MLSCHED_ROLLOUTS"
	// BucketPipeline holds the outputs of a pipeline's ensemble members
	// as they end, one key per member (docs/protocol.md, "Pipelines"):
	// members run in parallel, and the last to end merges them. Bounded
	// like the results (their max age and bytes).
	BucketPipeline = "MLSCHED_PIPELINE"
	// BucketAutoscale holds one key per worker pool: the autoscaler's last
	// decision for it (replicas now, recommended, and why), written by
	// `mlsched autoscale` and read by the dashboard and `mlsched top`.
	BucketAutoscale = "MLSCHED_AUTOSCALE"

	SubjectTasksAll    = "mlsched.tasks.>"
	SubjectDispatchAll = "mlsched.node.*.tasks"
	SubjectOutcomesAll = "mlsched.outcomes.>"
	SubjectResultsAll  = "mlsched.results.>"
	SubjectDLQAll      = "mlsched.dlq.>"
	// SubjectReportsAll is every node's direct reports: core NATS, no
	// stream captures it (see ReportSubject).
	SubjectReportsAll = "mlsched.report.*"
	// SubjectLoad is where dispatcher replicas tell each other the load
	// they add to and take from the nodes (protocol.LoadShare): core NATS,
	// no stream captures it.
	SubjectLoad = "mlsched.load"

	// QueueDispatchers is the queue group in which dispatcher replicas
	// share the direct reports: each report goes to one replica.
	QueueDispatchers = "mlsched-dispatchers"

	// ConsumerDispatcher is the durable name the dispatcher replicas share,
	// on both the task and the outcome stream.
	ConsumerDispatcher = "dispatcher"
)

// TaskSubject is where producers publish a task of the given type: band 0
// of the priority bands (BandTaskSubject).
func TaskSubject(taskType string) string { return "mlsched.tasks." + taskType }

// Priority bands. The task stream is pulled through one durable consumer
// per band, with non-overlapping filters (a work-queue stream allows no
// other kind), and every band has its own MaxAckPending: the tasks a
// replica holds in band 0 never stop it pulling band 1, so a priority-9
// task behind 50 000 queued priority-0 tasks is pulled at once
// (docs/policies.md, "Flow control"). Inside what is pulled, the hold
// orders by exact priority.
const (
	BandLow    = -1 // priority < 0: sheddable
	BandNormal = 0  // priority 0, and every task on TaskSubject
	BandHigh   = 1  // priority > 0
)

// Bands lists the bands, highest first.
var Bands = [...]int{BandHigh, BandNormal, BandLow}

// BandIndex is the index of a priority's band in Bands (0 high, 1
// normal, 2 low): the one mapping of the arrays kept per band.
func BandIndex(priority int) int { return BandHigh - BandOf(priority) }

// BandOf is the band of a priority.
func BandOf(priority int) int {
	switch {
	case priority > 0:
		return BandHigh
	case priority < 0:
		return BandLow
	}
	return BandNormal
}

// bandSuffix is the last subject token of a band's tasks ("" for band 0).
func bandSuffix(band int) string {
	switch band {
	case BandHigh:
		return "high"
	case BandLow:
		return "low"
	}
	return ""
}

// BandTaskSubject is where a producer publishes a task of the given type
// and priority: mlsched.tasks.<type> for priority 0,
// mlsched.tasks.<type>.high above, mlsched.tasks.<type>.low below.
func BandTaskSubject(taskType string, priority int) string {
	if sfx := bandSuffix(BandOf(priority)); sfx != "" {
		return "mlsched.tasks." + taskType + "." + sfx
	}
	return TaskSubject(taskType)
}

// ParseTaskSubject splits a task subject into its type and band; ok is
// false for a subject no band consumer reads as such (the dispatcher
// rejects the task).
func ParseTaskSubject(subject string) (taskType string, band int, ok bool) {
	rest, found := strings.CutPrefix(subject, "mlsched.tasks.")
	if !found {
		return "", 0, false
	}
	typ, sfx, banded := strings.Cut(rest, ".")
	if !banded {
		return typ, BandNormal, true
	}
	switch sfx {
	case "high":
		return typ, BandHigh, true
	case "low":
		return typ, BandLow, true
	}
	return typ, BandNormal, false
}

// BandConsumer is the durable name and filters of a band's consumer on
// MLSCHED_TASKS. Band 0 keeps ConsumerDispatcher, the name of the one
// task consumer of earlier versions, and subjects of five tokens or more
// too, so that they are read and rejected, not left in the stream. A
// four-token subject other than a band's (mlsched.tasks.<type>.<other>)
// is not read by any: a work-queue stream's filters cannot express "every
// fourth token but two" (docs/protocol.md says to publish nothing there).
func BandConsumer(band int) (durable string, filters []string) {
	switch band {
	case BandHigh:
		return ConsumerDispatcher + "-high", []string{"mlsched.tasks.*.high"}
	case BandLow:
		return ConsumerDispatcher + "-low", []string{"mlsched.tasks.*.low"}
	}
	return ConsumerDispatcher, []string{"mlsched.tasks.*", "mlsched.tasks.*.*.>"}
}

// Parking (dispatcher/internal/intake/park.go): a tenant's tasks beyond its share of a
// band's pull window are moved, publish then ack, to a subject of their own
// in MLSCHED_TASKS, mlsched.tasks._park[-high|-low].t_<tenant>, and pulled
// back through a durable consumer per band and tenant, so that one tenant's
// backlog never stands in the stream before another's tasks. These four-token
// subjects are read by no band consumer (BandConsumer): the tenant's token
// is prefixed, so that a tenant named high or low does not make a band's
// subject of it; a task type may not be named _park, _park-high or
// _park-low.
const parkPrefix = "mlsched.tasks._park"

// ParkedSubject is where the dispatcher parks a tenant's task of a band.
func ParkedSubject(band int, tenant string) string {
	return parkToken(band) + "." + parkTenant + tenant
}

// parkTenant prefixes the tenant's token of a parked subject.
const parkTenant = "t_"

func parkToken(band int) string {
	if sfx := bandSuffix(band); sfx != "" {
		return parkPrefix + "-" + sfx
	}
	return parkPrefix
}

// ParkedFilters are the subjects of every parked task, one per band.
func ParkedFilters() []string {
	out := make([]string, 0, len(Bands))
	for _, b := range Bands {
		out = append(out, parkToken(b)+".*")
	}
	return out
}

// ParseParkedSubject returns the band and tenant of a parked task's
// subject; ok is false for any other subject.
func ParseParkedSubject(subject string) (band int, tenant string, ok bool) {
	head, token, found := strings.Cut(strings.TrimPrefix(subject, "mlsched.tasks."), ".")
	tenant, prefixed := strings.CutPrefix(token, parkTenant)
	if !found || !prefixed || tenant == "" || strings.Contains(tenant, ".") || !strings.HasPrefix(subject, parkPrefix) {
		return 0, "", false
	}
	for _, b := range Bands {
		if "mlsched.tasks."+head == parkToken(b) {
			return b, tenant, true
		}
	}
	return 0, "", false
}

// ParkedConsumerPrefix begins every parked consumer's name.
const ParkedConsumerPrefix = "parked-"

// ParkedConsumer is the durable name of the consumer every replica shares
// for one band's parked tasks of one tenant: parked-<band>-<tenant>, or a
// hash of the tenant when it holds a character a consumer name may not.
func ParkedConsumer(band int, tenant string) string {
	name := ParkedConsumerPrefix + bandName(band) + "-"
	for i := 0; i < len(tenant); i++ {
		c := tenant[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			h := fnv.New64a()
			h.Write([]byte(tenant))
			return fmt.Sprintf("%sx%016x", name, h.Sum64())
		}
	}
	return name + tenant
}

func bandName(band int) string {
	if sfx := bandSuffix(band); sfx != "" {
		return sfx
	}
	return "normal"
}

// DispatchSubject is the subject a node consumes its dispatches from.
func DispatchSubject(node string) string { return "mlsched.node." + node + ".tasks" }

// OutcomeSubject is where a node reports outcomes.
func OutcomeSubject(node string) string { return "mlsched.outcomes." + node }

// ReportSubject is where a node sends a successful outcome straight to a
// dispatcher, as a core-NATS request: the dispatcher settles it as it would
// the stored outcome and answers once the task's result is stored, and the
// node acks its dispatch only then. Without an answer the node stores the
// outcome in MLSCHED_OUTCOMES instead (docs/protocol.md, "Direct reports").
// This saves one stored message, its delivery and its removal per task.
func ReportSubject(node string) string { return "mlsched.report." + node }

// ResultSubject is where a task's final result is kept.
func ResultSubject(id string) string { return "mlsched.results." + id }

// DLQSubject is where dead letters of a kind ("invalid", "exhausted") go.
func DLQSubject(kind string) string { return "mlsched.dlq." + kind }

// NodeConsumer is the durable consumer name of a node.
func NodeConsumer(node string) string { return "node-" + node }

// Config tunes the streams. The zero value gives the defaults.
type Config struct {
	// Storage for every stream (default file).
	Storage jetstream.StorageType
	// AttemptStorage is the storage of MLSCHED_DISPATCH and
	// MLSCHED_OUTCOMES when Storage is file (default file; the binaries'
	// MLSCHED_ATTEMPT_STORAGE defaults to memory). They need no fsync of
	// their own: a task stays unacknowledged in MLSCHED_TASKS until its
	// final result is stored, so an attempt they lose in a crash is
	// recovered from the task (docs/protocol.md, "What is stored where").
	// It is a preference: an existing attempt stream of the other storage
	// is used as it is, and only a dispatcher (UpdateLimits) re-creates it,
	// when it is empty.
	AttemptStorage jetstream.StorageType
	// Notice, when set, is told what Ensure decided that an operator should
	// know (an attempt stream kept on its old storage, or re-created).
	Notice func(msg string)
	// Replicas per stream (default 1).
	Replicas int
	// ResultsMaxAge is how long results are kept at most (default 24h).
	ResultsMaxAge time.Duration
	// ResultsMaxMsgs bounds how many results are kept (default 1 000 000);
	// beyond it the oldest is discarded. nats-server keeps an in-memory
	// index entry per result subject (one per task), so this, not the rate
	// times ResultsMaxAge, is what bounds its memory (docs/operations.md,
	// "Sizing").
	ResultsMaxMsgs int64
	// ResultsMaxBytes bounds the results stream's store (default 1 GiB);
	// beyond it the oldest results are discarded.
	ResultsMaxBytes int64
	// DLQMaxAge is how long dead letters are kept (default 7 days).
	DLQMaxAge time.Duration
	// DLQMaxBytes bounds the dead-letter stream (default 256 MiB); beyond
	// it the oldest dead letters are discarded.
	DLQMaxBytes int64
	// DuplicateWindow is the Nats-Msg-Id deduplication window (default 2m).
	DuplicateWindow time.Duration
	// NodeTTL is how long a node's heartbeat is kept (default 10s).
	NodeTTL time.Duration
	// TasksMaxBytes bounds the task stream; beyond it new tasks are refused
	// (default 128 MiB: the backlog of 100k+ typical tasks).
	TasksMaxBytes int64
	// TasksMaxMsgSize bounds one task message (default 4 MiB); the
	// dispatcher rejects tasks above its own MLSCHED_MAX_PAYLOAD_BYTES.
	TasksMaxMsgSize int32
	// UpdateLimits brings the size limits (MaxBytes, MaxMsgSize, Discard)
	// of existing streams to these, so that a stream created by an older
	// version, without limits, gets them. Only the streams' owner, the
	// dispatcher, sets it: other roles may not update streams.
	UpdateLimits bool
}

func (c Config) withDefaults() Config {
	if c.Replicas <= 0 {
		c.Replicas = 1
	}
	if c.ResultsMaxAge <= 0 {
		c.ResultsMaxAge = 24 * time.Hour
	}
	if c.ResultsMaxMsgs <= 0 {
		c.ResultsMaxMsgs = DefaultResultsMaxMsgs
	}
	if c.ResultsMaxBytes <= 0 {
		c.ResultsMaxBytes = DefaultResultsMaxBytes
	}
	if c.DLQMaxAge <= 0 {
		c.DLQMaxAge = 7 * 24 * time.Hour
	}
	if c.DLQMaxBytes <= 0 {
		c.DLQMaxBytes = DefaultDLQMaxBytes
	}
	if c.DuplicateWindow <= 0 {
		c.DuplicateWindow = 2 * time.Minute
	}
	if c.NodeTTL <= 0 {
		c.NodeTTL = 10 * time.Second
	}
	if c.TasksMaxBytes <= 0 {
		c.TasksMaxBytes = 128 << 20
	}
	if c.TasksMaxMsgSize <= 0 {
		c.TasksMaxMsgSize = 4 << 20
	}
	return c
}

// Default bounds of the results and dead-letter streams: they fit a modest
// server (docs/operations.md, "Sizing": about 250 MB of nats-server memory
// and 600 MB of disk for a full results stream).
const (
	DefaultResultsMaxMsgs  = 1_000_000
	DefaultResultsMaxBytes = 1 << 30
	DefaultDLQMaxBytes     = 256 << 20
)

// ErrIncompatible is returned when a stream, consumer or bucket exists with a
// configuration that mlsched cannot use.
var ErrIncompatible = errors.New("exists with an incompatible configuration")

// Streams returns the stream configurations of protocol v1.
func Streams(c Config) []jetstream.StreamConfig {
	c = c.withDefaults()
	base := func(name, subj string, ret jetstream.RetentionPolicy) jetstream.StreamConfig {
		return jetstream.StreamConfig{
			Name: name, Subjects: []string{subj}, Retention: ret,
			Storage: c.Storage, Replicas: c.Replicas, Duplicates: c.DuplicateWindow,
		}
	}
	results := base(StreamResults, SubjectResultsAll, jetstream.LimitsPolicy)
	results.MaxMsgsPerSubject = 1
	results.MaxAge = c.ResultsMaxAge
	// Bounded by count and bytes, whatever the rate: the oldest results go
	// first (DiscardOld), so a result is kept for min(MaxAge,
	// MaxMsgs/rate) — the results window of docs/operations.md.
	results.MaxMsgs, results.MaxBytes, results.Discard = c.ResultsMaxMsgs, c.ResultsMaxBytes, jetstream.DiscardOld
	results.AllowDirect = true
	// Atomic batches are how a single server group-commits: the results
	// and tasks published while the stream is busy are written with one
	// fsync (jsplumb.GroupCommit, docs/benchmarks.md "Group commit").
	results.AllowAtomicPublish = true
	dlq := base(StreamDLQ, SubjectDLQAll, jetstream.LimitsPolicy)
	dlq.MaxAge = c.DLQMaxAge
	dlq.MaxBytes, dlq.Discard = c.DLQMaxBytes, jetstream.DiscardOld
	// Intake is bounded: a producer gets a clear publish error (message too
	// large, or maximum bytes exceeded) instead of filling the server.
	// Limits retention, not a work queue: an ack then removes nothing, so
	// it costs no tombstone and no fsync of its own; the dispatcher removes
	// finished tasks in batches (TasksRetention).
	tasks := base(StreamTasks, SubjectTasksAll, TasksRetention)
	tasks.MaxBytes, tasks.MaxMsgSize, tasks.Discard = c.TasksMaxBytes, c.TasksMaxMsgSize, jetstream.DiscardNew
	tasks.AllowAtomicPublish = true
	dispatch := base(StreamDispatch, SubjectDispatchAll, jetstream.WorkQueuePolicy)
	dispatch.AllowDirect = true // the dispatcher reads in-flight dispatches by sequence
	outcomes := base(StreamOutcomes, SubjectOutcomesAll, jetstream.WorkQueuePolicy)
	if c.AttemptStorage == jetstream.MemoryStorage {
		dispatch.Storage, outcomes.Storage = jetstream.MemoryStorage, jetstream.MemoryStorage
	}
	return []jetstream.StreamConfig{
		tasks,
		dispatch,
		outcomes,
		results,
		dlq,
	}
}

// TasksRetention is the retention of a new MLSCHED_TASKS: limits. On a
// work-queue stream every ack removes its task at once, and with
// sync_interval always that removal (a tombstone) is an fsync of its own,
// serialised with the stream's stores: two fsyncs per task on one stream.
// Under limits retention an ack only moves the consumer's ack state, and
// the dispatcher removes finished tasks in batches, one fsync per batch
// (dispatcher/taskprune.go; docs/protocol.md, "What is stored where").
// A work-queue MLSCHED_TASKS of an earlier version is used as it is: the
// retention of a stream cannot change to or from work queue in place, and
// re-creating it could lose a task published meanwhile, so only an
// operator migrates it (docs/protocol.md gives the steps).
const TasksRetention = jetstream.LimitsPolicy

// TasksRetentionOK reports whether r is a retention mlsched can run the
// task stream with: limits (pruned by the dispatcher) or a work queue (an
// earlier version's, removing each task on its ack).
func TasksRetentionOK(r jetstream.RetentionPolicy) bool {
	return r == jetstream.LimitsPolicy || r == jetstream.WorkQueuePolicy
}

// IsAttemptStream reports whether the stream holds attempts (dispatches and
// outcomes), whose storage is a preference (Config.AttemptStorage).
func IsAttemptStream(name string) bool { return name == StreamDispatch || name == StreamOutcomes }

// Ensure creates every stream and the node bucket, or checks that existing
// ones are compatible (and, with UpdateLimits, updates their size limits).
func Ensure(ctx context.Context, js jetstream.JetStream, c Config) error {
	for _, sc := range Streams(c) {
		s, err := EnsureStream(ctx, js, sc)
		if err != nil {
			return err
		}
		if c.UpdateLimits && c.Notice != nil && sc.Name == StreamTasks && s.CachedInfo().Config.Retention != sc.Retention {
			c.Notice(fmt.Sprintf("stream %s has %v retention, kept as it is: every task's removal on its ack then costs an fsync of its own; "+
				"docs/protocol.md (\"Migrating the task stream\") says how to re-create it with %v retention", sc.Name, s.CachedInfo().Config.Retention, sc.Retention))
		}
		if c.UpdateLimits && s.CachedInfo().Config.Storage != sc.Storage {
			if s, err = migrateStorage(ctx, js, s, sc, c.Notice); err != nil {
				return err
			}
		}
		if c.UpdateLimits {
			if err := updateLimits(ctx, js, s, sc); err != nil {
				return err
			}
		}
	}
	_, err := EnsureNodesBucket(ctx, js, c)
	return err
}

// EnsureStream creates the stream, or returns the existing one when its
// subjects, retention and storage match.
func EnsureStream(ctx context.Context, js jetstream.JetStream, want jetstream.StreamConfig) (jetstream.Stream, error) {
	s, err := js.Stream(ctx, want.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		s, err = js.CreateStream(ctx, want)
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) { // lost a creation race
			s, err = js.Stream(ctx, want.Name)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", want.Name, err)
	}
	got := s.CachedInfo().Config
	retentionOK := got.Retention == want.Retention ||
		(want.Name == StreamTasks && TasksRetentionOK(got.Retention))
	if !slices.Equal(got.Subjects, want.Subjects) || !retentionOK ||
		(got.Storage != want.Storage && !IsAttemptStream(want.Name)) || unlimited(got.MaxMsgsPerSubject) != unlimited(want.MaxMsgsPerSubject) {
		return nil, fmt.Errorf("stream %s %w: have subjects=%v retention=%v storage=%v max_msgs_per_subject=%d, want subjects=%v retention=%v storage=%v max_msgs_per_subject=%d",
			want.Name, ErrIncompatible, got.Subjects, got.Retention, got.Storage, got.MaxMsgsPerSubject,
			want.Subjects, want.Retention, want.Storage, want.MaxMsgsPerSubject)
	}
	return s, nil
}

// migrateStorage re-creates an attempt stream on the storage want names,
// which JetStream cannot change in place: only when it is empty (deleting
// it deletes its consumers, which their owners re-create). A stream holding
// messages is kept as it is, on its old storage, and a later start of a
// dispatcher, once it is empty, re-creates it. A dispatch or outcome
// published between the check and the deletion is lost; its task is not
// (it stays unacknowledged until its result), so this costs one attempt.
func migrateStorage(ctx context.Context, js jetstream.JetStream, s jetstream.Stream, want jetstream.StreamConfig, notice func(string)) (jetstream.Stream, error) {
	say := func(format string, args ...any) {
		if notice != nil {
			notice(fmt.Sprintf(format, args...))
		}
	}
	if !IsAttemptStream(want.Name) {
		return s, nil
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", want.Name, err)
	}
	if info.State.Msgs > 0 {
		say("stream %s is on %v storage with %d messages, kept as it is: it is re-created on %v storage by a dispatcher started once it is empty",
			want.Name, info.Config.Storage, info.State.Msgs, want.Storage)
		return s, nil
	}
	// Re-created as it was but for its storage: limits or replicas an
	// operator set on it stay.
	again := info.Config
	again.Storage = want.Storage
	if err := js.DeleteStream(ctx, want.Name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("stream %s: delete to change its storage: %w", want.Name, err)
	}
	ns, err := EnsureStream(ctx, js, again)
	if err != nil {
		return nil, err
	}
	say("stream %s was empty on %v storage: re-created on %v storage", want.Name, info.Config.Storage, ns.CachedInfo().Config.Storage)
	return ns, nil
}

// updateLimits brings the limits mlsched sets on a stream (MaxMsgs,
// MaxBytes, MaxMsgSize, MaxAge and with them Discard) to want's, keeping
// the rest of its configuration and its messages: an update, never a
// re-creation. A limit want leaves unset is an operator's stay. Lowering a
// bound below what a stream holds discards its oldest messages (DiscardOld
// streams) as the bound itself would.
func updateLimits(ctx context.Context, js jetstream.JetStream, s jetstream.Stream, want jetstream.StreamConfig) error {
	got := s.CachedInfo().Config
	if want.MaxMsgs <= 0 && want.MaxBytes <= 0 && want.MaxMsgSize <= 0 && want.MaxAge <= 0 {
		return nil // mlsched sets no limits here: an operator's stay
	}
	cfg := got
	if want.MaxMsgs > 0 {
		cfg.MaxMsgs = want.MaxMsgs
	}
	if want.MaxBytes > 0 {
		cfg.MaxBytes = want.MaxBytes
	}
	if want.MaxMsgSize > 0 {
		cfg.MaxMsgSize = want.MaxMsgSize
	}
	if want.MaxAge > 0 {
		cfg.MaxAge = want.MaxAge
	}
	cfg.Discard = want.Discard
	// A stream of an earlier version gets atomic publishes (group commit);
	// a server older than 2.12 ignores the field, and nothing batches.
	cfg.AllowAtomicPublish = got.AllowAtomicPublish || want.AllowAtomicPublish
	if cfg.MaxMsgs == got.MaxMsgs && cfg.MaxBytes == got.MaxBytes && cfg.MaxMsgSize == got.MaxMsgSize &&
		cfg.MaxAge == got.MaxAge && cfg.Discard == got.Discard && cfg.AllowAtomicPublish == got.AllowAtomicPublish {
		return nil
	}
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		return fmt.Errorf("stream %s: update limits max_msgs=%d max_bytes=%d max_msg_size=%d max_age=%v discard=%v allow_atomic=%v (have %d, %d, %d, %v, %v, %v): %w",
			want.Name, cfg.MaxMsgs, cfg.MaxBytes, cfg.MaxMsgSize, cfg.MaxAge, cfg.Discard, cfg.AllowAtomicPublish,
			got.MaxMsgs, got.MaxBytes, got.MaxMsgSize, got.MaxAge, got.Discard, got.AllowAtomicPublish, err)
	}
	return nil
}

// GroupCommits reports whether publishes into the stream described by info
// gain from group commit (jsplumb.GroupCommit): it is on disk, where every
// stored message costs an fsync of its own on a single server, and it
// takes atomic batches. In memory a batch only costs more.
func GroupCommits(info *jetstream.StreamInfo) bool {
	return info != nil && info.Config.Storage == jetstream.FileStorage && info.Config.AllowAtomicPublish
}

// unlimited maps every "no limit" value to -1: the server reports -1 for a
// limit that was asked for as 0.
func unlimited(n int64) int64 {
	if n <= 0 {
		return -1
	}
	return n
}

// EnsureConsumer creates a durable consumer, or returns the existing one when
// its filter and ack policy match. Tunables (AckWait, MaxAckPending) of an
// existing consumer are updated, since they are safe to change.
func EnsureConsumer(ctx context.Context, s jetstream.Stream, want jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	c, err := s.Consumer(ctx, want.Durable)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		c, err = s.CreateConsumer(ctx, want)
		if errors.Is(err, jetstream.ErrConsumerExists) {
			c, err = s.Consumer(ctx, want.Durable)
		}
		if err != nil {
			return nil, fmt.Errorf("consumer %s: %w", want.Durable, err)
		}
		return c, nil
	}
	if err != nil {
		return nil, fmt.Errorf("consumer %s: %w", want.Durable, err)
	}
	got := c.CachedInfo().Config
	if got.FilterSubject == "" && len(got.FilterSubjects) == 0 && (want.FilterSubject != "" || len(want.FilterSubjects) > 0) &&
		got.AckPolicy == want.AckPolicy && got.DeliverPolicy == want.DeliverPolicy {
		// An unfiltered consumer of an earlier version (the task stream's
		// before the priority bands) is narrowed to its band: an update,
		// which keeps its pending messages.
		return s.UpdateConsumer(ctx, want)
	}
	if got.FilterSubject != want.FilterSubject || !slices.Equal(got.FilterSubjects, want.FilterSubjects) ||
		got.AckPolicy != want.AckPolicy || got.DeliverPolicy != want.DeliverPolicy {
		return nil, fmt.Errorf("consumer %s %w: have filter=%q ack=%v, want filter=%q ack=%v",
			want.Durable, ErrIncompatible, got.FilterSubject, got.AckPolicy, want.FilterSubject, want.AckPolicy)
	}
	if got.AckWait != want.AckWait || got.MaxAckPending != want.MaxAckPending || got.MaxDeliver != want.MaxDeliver ||
		got.InactiveThreshold != want.InactiveThreshold {
		c, err = s.UpdateConsumer(ctx, want)
		if err != nil {
			return nil, fmt.Errorf("consumer %s: update: %w", want.Durable, err)
		}
	}
	return c, nil
}

// EnsureNodesBucket creates the node registry bucket, whose entries expire
// NodeTTL after a node's last heartbeat.
func EnsureNodesBucket(ctx context.Context, js jetstream.JetStream, c Config) (jetstream.KeyValue, error) {
	c = c.withDefaults()
	kv, err := js.KeyValue(ctx, BucketNodes)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: BucketNodes, TTL: c.NodeTTL, Storage: jetstream.MemoryStorage, Replicas: c.Replicas,
		})
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = js.KeyValue(ctx, BucketNodes)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", BucketNodes, err)
	}
	return kv, nil
}

// EnsureSupersededBucket creates the bucket of superseded attempts; entries
// live for a day, far longer than any attempt.
func EnsureSupersededBucket(ctx context.Context, js jetstream.JetStream, c Config) (jetstream.KeyValue, error) {
	c = c.withDefaults()
	kv, err := js.KeyValue(ctx, BucketSuperseded)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: BucketSuperseded, TTL: 24 * time.Hour, Storage: c.Storage, Replicas: c.Replicas,
		})
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = js.KeyValue(ctx, BucketSuperseded)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", BucketSuperseded, err)
	}
	return kv, nil
}

// EnsurePipelineBucket creates the bucket of ensemble members' outputs;
// entries live as long as results (ResultsMaxAge), within ResultsMaxBytes.
func EnsurePipelineBucket(ctx context.Context, js jetstream.JetStream, c Config) (jetstream.KeyValue, error) {
	c = c.withDefaults()
	kv, err := js.KeyValue(ctx, BucketPipeline)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: BucketPipeline, TTL: c.ResultsMaxAge, MaxBytes: c.ResultsMaxBytes, Storage: c.Storage, Replicas: c.Replicas,
		})
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = js.KeyValue(ctx, BucketPipeline)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", BucketPipeline, err)
	}
	return leaderReads(ctx, js, kv)
}

// leaderReads makes a bucket's reads go to its stream's leader. A bucket is
// created allowing direct gets, which any replica answers from what it has
// applied so far: on an R3 stream a read right after another client's
// acknowledged write can miss it. The ensemble members each write, then read
// their siblings' entries to learn which of them goes on; two reads served
// by lagging replicas would each miss the other's entry and leave the
// pipeline without its result (make chaos-cluster, seed 2072686146).
func leaderReads(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue) (jetstream.KeyValue, error) {
	name := "KV_" + kv.Bucket()
	s, err := js.Stream(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", kv.Bucket(), err)
	}
	cfg := s.CachedInfo().Config
	if !cfg.AllowDirect {
		return kv, nil
	}
	cfg.AllowDirect = false
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		return nil, fmt.Errorf("bucket %s: reads from the leader: %w", kv.Bucket(), err)
	}
	return js.KeyValue(ctx, kv.Bucket()) // bound again: gets go to the leader now
}

// EnsureDispatcherBucket creates the dispatchers' private bucket (no TTL,
// one value per key).
func EnsureDispatcherBucket(ctx context.Context, js jetstream.JetStream, c Config) (jetstream.KeyValue, error) {
	c = c.withDefaults()
	kv, err := js.KeyValue(ctx, BucketDispatcher)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: BucketDispatcher, Storage: c.Storage, Replicas: c.Replicas,
		})
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = js.KeyValue(ctx, BucketDispatcher)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", BucketDispatcher, err)
	}
	return kv, nil
}

// EnsureAutoscaleBucket creates the autoscaler's decisions bucket (one
// entry per pool, the last decision only) or returns the existing one.
func EnsureAutoscaleBucket(ctx context.Context, js jetstream.JetStream, c Config) (jetstream.KeyValue, error) {
	c = c.withDefaults()
	kv, err := js.KeyValue(ctx, BucketAutoscale)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: BucketAutoscale, Storage: c.Storage, Replicas: c.Replicas, History: 1,
		})
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = js.KeyValue(ctx, BucketAutoscale)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", BucketAutoscale, err)
	}
	return kv, nil
}

// EnsureRolloutsBucket creates the rollouts bucket (no TTL: a rollout and
// its history survive restarts of every process).
func EnsureRolloutsBucket(ctx context.Context, js jetstream.JetStream, c Config) (jetstream.KeyValue, error) {
	c = c.withDefaults()
	kv, err := js.KeyValue(ctx, BucketRollouts)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: BucketRollouts, Storage: c.Storage, Replicas: c.Replicas, History: 1,
		})
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = js.KeyValue(ctx, BucketRollouts)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", BucketRollouts, err)
	}
	return kv, nil
}

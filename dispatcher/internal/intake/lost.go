package intake

import (
	"slices"

	"github.com/mlsched/mlsched/dispatcher/internal/admission"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/nats-io/nats.go/jetstream"
)

// lostWithStreams is the lost attempt's error in the task's history.
const lostWithStreams = "lost with the attempt streams: the nats-server restarted while it ran"

// resumeLost goes on with a task delivered again whose attempt rec was in
// flight when the attempt streams were lost: that attempt ends as lost and
// the task continues at the next one, or ends when none is left.
func (in *Stage) resumeLost(msg jetstream.Msg, a admission.Attempt, o taskOrigin, rec admission.Record) {
	a.History = append(slices.Clone(rec.History), protocol.Attempt{Attempt: rec.Attempt, Model: rec.Model, Node: rec.Node,
		Status: protocol.OutcomeLost, Error: lostWithStreams})
	a.Attempt = rec.Attempt + 1
	in.Superseded.Mark(a.Task.ID, a.Submission, rec.Attempt) // its late outcome is not final
	in.Lost.Add(1)
	in.Log.Warn().Str("task_id", a.Task.ID).Int("attempt", rec.Attempt).Str("model", rec.Model).Str("node", rec.Node).
		Msg("attempt lost with the attempt streams: going on from it")
	maxAttempts := rec.MaxAttempts
	if maxAttempts <= 0 {
		maxAttempts = a.MaxAttemptsOr(in.MaxAttempts)
	}
	if rec.Attempt >= maxAttempts {
		err := protocol.Errorf(protocol.CodeAttemptsExhausted, "all %d attempts failed; the last, on model %s node %s, was %s",
			rec.Attempt, rec.Model, rec.Node, lostWithStreams)
		in.Fin.End(a.Ends(msg, err, protocol.StatusFailed))
		return
	}
	in.enter(msg, a, o)
}

package dashboard

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/mlsched/mlsched/dispatcher/operator"
	"github.com/mlsched/mlsched/shared/client"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/secret"
)

// actionTimeout bounds one lookup or action.
const actionTimeout = 10 * time.Second

// serveTask answers GET /api/task?id=ID with what is known of the task: its
// final result with every attempt (model, node, status, error, latency), or
// that it has none yet. Read-only, like the rest of the views.
func (d *Dashboard) serveTask(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), actionTimeout)
	defer cancel()
	l, err := operator.LookupTask(ctx, d.js, strings.TrimSpace(r.URL.Query().Get("id")))
	switch {
	case protocol.CodeOf(err) == protocol.CodeInvalidID:
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
	case err != nil:
		writeJSON(w, http.StatusBadGateway, map[string]string{"error": err.Error()})
	default:
		writeJSON(w, http.StatusOK, l)
	}
}

// actionReply is what an action answers.
type actionReply struct {
	OK      bool   `json:"ok"`
	Message string `json:"message"`
}

// serveAction carries out POST /api/cancel and /api/dlq/replay for a
// request bearing the token.
func (d *Dashboard) serveAction(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	if status, why := d.authorize(r); status != 0 {
		writeJSON(w, status, actionReply{Message: why})
		return
	}
	var req struct {
		ID     string `json:"id"`
		Reason string `json:"reason"`
		Seq    uint64 `json:"seq"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10)).Decode(&req); err != nil {
		writeJSON(w, http.StatusBadRequest, actionReply{Message: "the body is not a JSON request: " + err.Error()})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), actionTimeout)
	defer cancel()
	if r.URL.Path == "/api/cancel" {
		d.cancel(ctx, w, req.ID, req.Reason)
		return
	}
	if req.Seq == 0 {
		writeJSON(w, http.StatusBadRequest, actionReply{Message: "seq: the dead letter's sequence number is missing"})
		return
	}
	id, taskSeq, err := operator.ReplaySeq(ctx, d.js, client.New(d.js), req.Seq)
	switch {
	case errors.Is(err, operator.ErrNotReplayable):
		writeJSON(w, http.StatusUnprocessableEntity, actionReply{Message: fmt.Sprintf("dead letter %d %v", req.Seq, err)})
	case err != nil:
		writeJSON(w, http.StatusBadGateway, actionReply{Message: fmt.Sprintf("dead letter %d: %v", req.Seq, err)})
	default:
		d.log.Info().Uint64("seq", req.Seq).Str("task_id", id).Msg("dashboard: dead letter replayed")
		writeJSON(w, http.StatusOK, actionReply{OK: true, Message: fmt.Sprintf(
			"replayed dead letter %d as task %s (task seq %d); its previous result was removed and the replay's result replaces it", req.Seq, id, taskSeq)})
	}
}

func (d *Dashboard) cancel(ctx context.Context, w http.ResponseWriter, id, reason string) {
	if reason == "" {
		reason = "cancelled from the dashboard"
	}
	rep, err := operator.Cancel(ctx, d.nc, strings.TrimSpace(id), reason)
	if err != nil {
		writeJSON(w, http.StatusBadGateway, actionReply{Message: err.Error()})
		return
	}
	switch rep.Outcome {
	case protocol.CancelDone:
		d.log.Info().Str("task_id", id).Msg("dashboard: task cancelled")
		writeJSON(w, http.StatusOK, actionReply{OK: true, Message: fmt.Sprintf("cancelled %s (it was %s)", id, strings.Join(rep.Where, ", "))})
	case protocol.CancelFinished:
		writeJSON(w, http.StatusConflict, actionReply{Message: fmt.Sprintf("task %s already finished: its result is %s", id, rep.Status)})
	case protocol.CancelUnknown:
		writeJSON(w, http.StatusNotFound, actionReply{Message: fmt.Sprintf("no task %s is waiting, running or finished", id)})
	default:
		writeJSON(w, http.StatusBadRequest, actionReply{Message: rep.Error})
	}
}

// authorize returns 0 when r bears the token, else the status and why.
func (d *Dashboard) authorize(r *http.Request) (int, string) {
	if d.cfg.TokenFile == "" {
		return http.StatusForbidden, "actions are off: start the dispatcher with MLSCHED_HTTP_TOKEN_FILE naming a file that holds a token"
	}
	want, err := secret.ReadFile(d.cfg.TokenFile)
	if err != nil {
		d.log.Warn().Err(err).Msg("dashboard: cannot read MLSCHED_HTTP_TOKEN_FILE: refusing the action")
		return http.StatusServiceUnavailable, "the dispatcher cannot read its token file"
	}
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || subtle.ConstantTimeCompare([]byte(strings.TrimSpace(got)), []byte(want)) != 1 {
		return http.StatusUnauthorized, "a valid token is required (Authorization: Bearer <the token in MLSCHED_HTTP_TOKEN_FILE>)"
	}
	return 0, ""
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

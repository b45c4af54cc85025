package dispatcher

import (
	"bytes"
	"context"
	"crypto/hmac"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/dispatcher/internal/pipeline"
	"github.com/mlsched/mlsched/shared/topology"
)

// Pipelines (docs/protocol.md, "Pipelines"). A pipeline task runs its first
// step as a plain task of its type. Each later step is a task message of
// its own, on its step type's subject of MLSCHED_TASKS, with the same id
// and the pipeline's progress (pipeline.Progress, sealed like a dispatch) in
// the Mlsched-Pipeline header, carried on every dispatch of the step and
// echoed on its outcomes, so that any replica goes on from any outcome.
//
// When a step's attempt succeeds, the finish stage's End (internal/finish, the one
// way a task ends) does not store a result: it stores the next step's
// message (Nats-Msg-Id p:<id>:<submitted>:<seq>, so a redelivered outcome
// stores it once), and only then acks the step's task message with the
// outcome. The previous output is thus stored before the next step starts,
// in the task stream and bounded by its limits, and a crash at any point
// redelivers either the step or its successor. The last step, a failed
// step, a switch that matches no case, or the pipeline's deadline end it
// with its one final result, through the same end.

var errPipelineSeal = errors.New("the pipeline's progress does not carry a dispatcher's seal")

// pipelineDomain separates the progress's MAC from a dispatch's seal.
const pipelineDomain = "mlsched-pipeline\x00"

// sealPipeline encodes p as HdrPipeline's value: base64url(JSON) "."
// hex(HMAC).
func (s *sealer) sealPipeline(p *pipeline.Progress) (string, error) {
	data, err := json.Marshal(p)
	if err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(data) + "." + hex.EncodeToString(s.pipelineMAC(data)), nil
}

// openPipeline verifies and decodes HdrPipeline's value.
func (s *sealer) openPipeline(v string) (*pipeline.Progress, error) {
	i := bytes.LastIndexByte([]byte(v), '.')
	if i < 0 {
		return nil, errPipelineSeal
	}
	data, err := base64.RawURLEncoding.DecodeString(v[:i])
	if err != nil {
		return nil, errPipelineSeal
	}
	mac, err := hex.DecodeString(v[i+1:])
	if err != nil || !hmac.Equal(mac, s.pipelineMAC(data)) {
		return nil, errPipelineSeal
	}
	var p pipeline.Progress
	if err := json.Unmarshal(data, &p); err != nil || !p.Valid() {
		return nil, errPipelineSeal
	}
	return &p, nil
}

// pipelineSeal is the sealer as the finish stage reads and writes a
// pipeline's progress, and the MLSCHED_PIPELINE bucket where a parallel
// ensemble's members store their outputs (finish.Pipelines).
type pipelineSeal struct {
	s  *sealer
	kv jetstream.KeyValue
}

func (p pipelineSeal) Open(v string) (*pipeline.Progress, error) { return p.s.openPipeline(v) }
func (p pipelineSeal) Seal(q *pipeline.Progress) (string, error) { return p.s.sealPipeline(q) }

func (p pipelineSeal) StoreMember(ctx context.Context, key string, out []byte) (uint64, error) {
	if p.kv == nil {
		return 0, errNoPipelineBucket
	}
	return p.kv.Put(ctx, key, out)
}

func (p pipelineSeal) LoadMember(ctx context.Context, key string) ([]byte, uint64, bool, error) {
	if p.kv == nil {
		return nil, 0, false, errNoPipelineBucket
	}
	e, err := p.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, false, nil
	}
	if err != nil {
		return nil, 0, false, err
	}
	return e.Value(), e.Revision(), true, nil
}

var errNoPipelineBucket = errors.New("no " + topology.BucketPipeline + " bucket")

func (s *sealer) pipelineMAC(data []byte) []byte {
	st := s.pool.Get().(*sealState)
	st.mac.Reset()
	st.mac.Write([]byte(pipelineDomain))
	st.mac.Write(data)
	sum := st.mac.Sum(nil)
	s.pool.Put(st)
	return sum
}

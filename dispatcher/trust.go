package dispatcher

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// sealKeyName is the key of the seal key in topology.BucketDispatcher.
const sealKeyName = "seal-key"

// loadSealKey returns the key every replica seals dispatches with: the
// first replica creates it, the others (and restarts) read it. Only the
// dispatcher role may read the bucket (docs/security.md).
func loadSealKey(ctx context.Context, kv jetstream.KeyValue) ([]byte, error) {
	for range 3 {
		e, err := kv.Get(ctx, sealKeyName)
		if err == nil && len(e.Value()) >= 32 {
			return e.Value(), nil
		}
		if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, fmt.Errorf("read the seal key: %w", err)
		}
		key := make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, err
		}
		if _, err := kv.Create(ctx, sealKeyName, key); err == nil {
			return key, nil
		} else if !errors.Is(err, jetstream.ErrKeyExists) {
			return nil, fmt.Errorf("create the seal key: %w", err)
		}
		// Another replica created it first: read theirs.
	}
	return nil, fmt.Errorf("bucket %s: no usable %s", topology.BucketDispatcher, sealKeyName)
}

// sealer seals dispatches and verifies seals under the key every replica
// shares, twice per attempt (its dispatch and its outcome). The seal is the
// HMAC-SHA256 of every field of the dispatch but Seal, in a length-prefixed
// encoding (no two dispatches share one), carried in protocol.HdrSeal: the
// worker echoes it on the outcome, so a dispatcher recognises an outcome
// that answers a dispatch it made and refuses one that does not (a forged
// task id, attempt, node, model or submission breaks the seal; task bytes
// that are not the dispatched ones do not match protocol.HdrTaskSum).
// Keyed hashes and their scratch buffers are pooled, so that verifying does
// not allocate and sealing allocates only the seal.
type sealer struct {
	pool sync.Pool // of *sealState
}

type sealState struct {
	mac hash.Hash // HMAC-SHA256 under the key
	buf []byte    // the sealed encoding
	sum []byte    // the HMAC
}

func newSealer(key []byte) *sealer {
	key = bytes.Clone(key)
	return &sealer{pool: sync.Pool{New: func() any {
		return &sealState{mac: hmac.New(sha256.New, key), buf: make([]byte, 0, 512), sum: make([]byte, 0, sha256.Size)}
	}}}
}

// Seal returns d's seal, in hex.
func (s *sealer) Seal(d *protocol.Dispatch) string {
	st := s.sum(d)
	seal := hex.EncodeToString(st.sum)
	s.pool.Put(st)
	return seal
}

// Valid reports whether d.Seal is d's seal.
func (s *sealer) Valid(d *protocol.Dispatch) bool {
	var got [sha256.Size]byte
	if len(d.Seal) != 2*sha256.Size {
		return false
	}
	if _, err := hex.Decode(got[:], []byte(d.Seal)); err != nil {
		return false
	}
	st := s.sum(d)
	ok := hmac.Equal(got[:], st.sum)
	s.pool.Put(st)
	return ok
}

// sum computes the HMAC of d's sealed encoding into a pooled state's sum;
// the caller puts the state back.
func (s *sealer) sum(d *protocol.Dispatch) *sealState {
	st := s.pool.Get().(*sealState)
	st.buf = appendSealed(st.buf[:0], d)
	st.mac.Reset()
	st.mac.Write(st.buf)
	st.sum = st.mac.Sum(st.sum[:0])
	if cap(st.buf) > 64<<10 { // a long history: do not keep its buffer
		st.buf = nil
	}
	return st
}

// appendSealed appends the encoding the seal covers: each field in a fixed
// order, strings prefixed by their length, numbers as 8 bytes big-endian.
// It covers the fields, not their wire encoding (either dispatch header
// form verifies). Changing it invalidates every seal in flight, and
// replicas of two versions share the key during a rolling upgrade
// (TestSealEncodingIsStable).
func appendSealed(b []byte, d *protocol.Dispatch) []byte {
	str := func(s string) {
		b = binary.BigEndian.AppendUint64(b, uint64(len(s)))
		b = append(b, s...)
	}
	num := func(v int64) { b = binary.BigEndian.AppendUint64(b, uint64(v)) }
	str("mlsched-dispatch-v1")
	str(d.TaskID)
	str(d.Type)
	str(d.Model)
	str(d.Node)
	num(int64(d.Attempt))
	num(int64(d.MaxAttempts))
	num(d.Deadline.UnixMilli())
	num(d.Timeout.Milliseconds())
	if d.Submitted.IsZero() {
		num(0)
	} else {
		num(d.Submitted.UnixMilli())
	}
	str(d.Submission)
	str(d.TaskSum)
	if len(d.History) > 0 {
		hist, _ := json.Marshal(d.History)
		b = binary.BigEndian.AppendUint64(b, uint64(len(hist)))
		b = append(b, hist...)
	} else {
		str("")
	}
	return b
}

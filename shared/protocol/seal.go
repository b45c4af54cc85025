package protocol

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"hash"
	"sync"
)

// Headers that make a dispatch verifiable. A dispatcher seals each dispatch
// with a key only dispatchers hold; the worker echoes both headers on the
// outcome, so the dispatcher recognises an outcome that answers a dispatch
// it made and refuses one that does not (a forged task id, attempt, node,
// model or submission breaks the seal; task bytes that are not the
// dispatched ones do not match the sum).
const (
	HdrTaskSum = "Mlsched-Task-Sum"
	HdrSeal    = "Mlsched-Seal"
)

// TaskSum is the hex SHA-256 of a task's bytes, as in HdrTaskSum.
func TaskSum(task []byte) string {
	s := sha256.Sum256(task)
	return hex.EncodeToString(s[:])
}

// ComputeSeal returns the HMAC-SHA256 under key of every field of d but
// Seal, in a length-prefixed encoding (no two dispatches share one). A
// dispatcher seals and verifies through a Sealer, which keeps its keyed
// hashes for reuse.
func (d *Dispatch) ComputeSeal(key []byte) string { return NewSealer(key).Seal(d) }

// SealValid reports whether d.Seal is the seal of d under key.
func (d *Dispatch) SealValid(key []byte) bool { return NewSealer(key).Valid(d) }

// Sealer seals dispatches and verifies seals under one key, twice per
// attempt (its dispatch and its outcome): keyed hashes and their scratch
// buffers are pooled, so that verifying does not allocate and sealing
// allocates only the seal.
type Sealer struct {
	pool sync.Pool // of *sealState
}

type sealState struct {
	mac hash.Hash // HMAC-SHA256 under the key
	buf []byte    // the sealed encoding
	sum []byte    // the HMAC
}

// NewSealer returns a Sealer for key.
func NewSealer(key []byte) *Sealer {
	key = bytes.Clone(key)
	return &Sealer{pool: sync.Pool{New: func() any {
		return &sealState{mac: hmac.New(sha256.New, key), buf: make([]byte, 0, 512), sum: make([]byte, 0, sha256.Size)}
	}}}
}

// Seal returns d's seal (hex), as ComputeSeal.
func (s *Sealer) Seal(d *Dispatch) string {
	st := s.sum(d)
	seal := hex.EncodeToString(st.sum)
	s.pool.Put(st)
	return seal
}

// Valid reports whether d.Seal is d's seal, as SealValid.
func (s *Sealer) Valid(d *Dispatch) bool {
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
func (s *Sealer) sum(d *Dispatch) *sealState {
	st := s.pool.Get().(*sealState)
	st.buf = d.appendSealed(st.buf[:0])
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
// Changing it invalidates every seal in flight (TestSealEncodingIsStable).
func (d *Dispatch) appendSealed(b []byte) []byte {
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

package protocol

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"hash"
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
// Seal, in a length-prefixed encoding (no two dispatches share one).
func (d *Dispatch) ComputeSeal(key []byte) string {
	m := hmac.New(sha256.New, key)
	d.writeSealed(m)
	return hex.EncodeToString(m.Sum(nil))
}

// SealValid reports whether d.Seal is the seal of d under key.
func (d *Dispatch) SealValid(key []byte) bool {
	got, err := hex.DecodeString(d.Seal)
	if err != nil || len(got) != sha256.Size {
		return false
	}
	m := hmac.New(sha256.New, key)
	d.writeSealed(m)
	return hmac.Equal(got, m.Sum(nil))
}

func (d *Dispatch) writeSealed(h hash.Hash) {
	var n [8]byte
	str := func(s string) {
		binary.BigEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	num := func(v int64) {
		binary.BigEndian.PutUint64(n[:], uint64(v))
		h.Write(n[:])
	}
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
		str(string(hist))
	} else {
		str("")
	}
}

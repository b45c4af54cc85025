package protocol_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"hash"
	"strings"
	"testing"
	"time"

	"github.com/mlsched/mlsched/shared/protocol"
)

func TestSealSurvivesHeadersAndCatchesEdits(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	d := protocol.Dispatch{TaskID: "t1", Type: "x", Model: "m", Node: "n1", Attempt: 2, MaxAttempts: 3,
		Deadline: time.Now().Add(time.Minute), Timeout: 1500 * time.Millisecond, Submitted: time.Now(), Submission: "42",
		History: []protocol.Attempt{{Attempt: 1, Model: "m0", Node: "n0", Status: protocol.OutcomeTimeout, LatencyMs: 12.345}},
		TaskSum: protocol.TaskSum([]byte(`{"id":"t1"}`))}
	d.Seal = d.ComputeSeal(key)
	back, err := protocol.ParseDispatch(protocol.OutcomeHeader(d.Header(), "n1"))
	if err != nil {
		t.Fatal(err)
	}
	if !back.SealValid(key) {
		t.Fatal("a sealed dispatch does not verify after its headers round trip")
	}
	if back.SealValid([]byte("another key")) {
		t.Fatal("verifies under another key")
	}
	for _, edit := range []func(*protocol.Dispatch){
		func(d *protocol.Dispatch) { d.TaskID = "t2" },
		func(d *protocol.Dispatch) { d.Node = "n2" },
		func(d *protocol.Dispatch) { d.Model = "m2" },
		func(d *protocol.Dispatch) { d.Attempt = 3 },
		func(d *protocol.Dispatch) { d.Submission = "43" },
		func(d *protocol.Dispatch) { d.TaskSum = protocol.TaskSum([]byte("x")) },
		func(d *protocol.Dispatch) { d.History = nil },
		func(d *protocol.Dispatch) { d.Seal = "zz" },
	} {
		c := back
		edit(&c)
		if c.SealValid(key) {
			t.Errorf("an edited dispatch verifies: %+v", c)
		}
	}
}

// The sealed encoding never changes by accident: replicas of two versions
// share the key during a rolling upgrade and must agree on every seal.
// (Values computed by the first implementation.)
func TestSealEncodingIsStable(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	full := fullDispatch()
	short := protocol.Dispatch{TaskID: "t1", Type: "x", Model: "m", Node: "n1", Attempt: 1, MaxAttempts: 3,
		Deadline: time.UnixMilli(1_800_000_000_123)}
	s := protocol.NewSealer(key)
	for _, c := range []struct {
		d    protocol.Dispatch
		want string
	}{
		{full, "87a03b7b46fdbbfb91ebec10868a92aed95c36a94927e4708a40a2e6108d3cf3"},
		{short, "0f95d9715ec2e42de4f6251bbf522191bcdf3a7164ba98b1053e3fac6c0de2fa"},
	} {
		if got := c.d.ComputeSeal(key); got != c.want {
			t.Errorf("ComputeSeal %s, want %s", got, c.want)
		}
		for range 3 { // pooled hashes are reset between uses
			if got := s.Seal(&c.d); got != c.want {
				t.Errorf("Sealer.Seal %s, want %s", got, c.want)
			}
		}
		c.d.Seal = c.want
		if !s.Valid(&c.d) || !c.d.SealValid(key) {
			t.Errorf("the seal %s does not verify", c.want)
		}
		c.d.Seal = strings.ToUpper(c.want) // hex of either case, as hex.DecodeString reads it
		if !s.Valid(&c.d) {
			t.Errorf("the upper-case seal does not verify")
		}
		c.d.Seal = c.want[:62]
		if s.Valid(&c.d) {
			t.Errorf("a short seal verifies")
		}
	}
	if protocol.NewSealer([]byte("another key")).Seal(&full) == s.Seal(&full) {
		t.Error("two keys give one seal")
	}
}

// BenchmarkSeal is what a dispatcher pays per attempt to seal its dispatch
// and to verify the seal its outcome echoes: per call (the old way) and
// with a Sealer.
func BenchmarkSeal(b *testing.B) {
	key := []byte("0123456789abcdef0123456789abcdef")
	d := fullDispatch()
	d.Attempt, d.History = 1, nil
	d.Seal = d.ComputeSeal(key)
	s := protocol.NewSealer(key)
	b.Run("old", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if oldComputeSeal(&d, key) == "" || !oldSealValid(&d, key) {
				b.Fatal("no seal")
			}
		}
	})
	b.Run("Sealer", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if s.Seal(&d) == "" || !s.Valid(&d) {
				b.Fatal("no seal")
			}
		}
	})
}

// oldComputeSeal and oldSealValid are the first implementation (a keyed
// hash per call, a write per field), kept for BenchmarkSeal's comparison.
func oldComputeSeal(d *protocol.Dispatch, key []byte) string {
	m := hmac.New(sha256.New, key)
	oldWriteSealed(d, m)
	return hex.EncodeToString(m.Sum(nil))
}

func oldSealValid(d *protocol.Dispatch, key []byte) bool {
	got, err := hex.DecodeString(d.Seal)
	if err != nil || len(got) != sha256.Size {
		return false
	}
	m := hmac.New(sha256.New, key)
	oldWriteSealed(d, m)
	return hmac.Equal(got, m.Sum(nil))
}

func oldWriteSealed(d *protocol.Dispatch, h hash.Hash) {
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

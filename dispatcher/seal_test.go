package dispatcher

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

	"github.com/nats-io/nats.go"

	"github.com/mlsched/mlsched/shared/protocol"
)

func TestSealSurvivesHeadersAndCatchesEdits(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	d := protocol.Dispatch{TaskID: "t1", Type: "x", Model: "m", Node: "n1", Attempt: 2, MaxAttempts: 3,
		Deadline: time.Now().Add(time.Minute), Timeout: 1500 * time.Millisecond, Submitted: time.Now(), Submission: "42",
		History: []protocol.Attempt{{Attempt: 1, Model: "m0", Node: "n0", Status: protocol.OutcomeTimeout, LatencyMs: 12.345}},
		TaskSum: protocol.TaskSum([]byte(`{"id":"t1"}`))}
	d.Seal = newSealer(key).Seal(&d)
	back, err := protocol.ParseDispatch(protocol.OutcomeHeader(d.Header(), "n1"))
	if err != nil {
		t.Fatal(err)
	}
	if !newSealer(key).Valid(&back) {
		t.Fatal("a sealed dispatch does not verify after its headers round trip")
	}
	if newSealer([]byte("another key")).Valid(&back) {
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
		if newSealer(key).Valid(&c) {
			t.Errorf("an edited dispatch verifies: %+v", c)
		}
	}
}

// The sealed encoding never changes by accident: replicas of two versions
// share the key during a rolling upgrade and must agree on every seal.
// (Values computed by the first implementation.)
func TestSealEncodingIsStable(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	full := sealedFields()
	short := protocol.Dispatch{TaskID: "t1", Type: "x", Model: "m", Node: "n1", Attempt: 1, MaxAttempts: 3,
		Deadline: time.UnixMilli(1_800_000_000_123)}
	s := newSealer(key)
	for _, c := range []struct {
		d    protocol.Dispatch
		want string
	}{
		{full, "87a03b7b46fdbbfb91ebec10868a92aed95c36a94927e4708a40a2e6108d3cf3"},
		{short, "0f95d9715ec2e42de4f6251bbf522191bcdf3a7164ba98b1053e3fac6c0de2fa"},
	} {
		if got := newSealer(key).Seal(&c.d); got != c.want {
			t.Errorf("a new sealer's seal %s, want %s", got, c.want)
		}
		for range 3 { // pooled hashes are reset between uses
			if got := s.Seal(&c.d); got != c.want {
				t.Errorf("Sealer.Seal %s, want %s", got, c.want)
			}
		}
		c.d.Seal = c.want
		if !s.Valid(&c.d) || !newSealer(key).Valid(&c.d) {
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
	if newSealer([]byte("another key")).Seal(&full) == s.Seal(&full) {
		t.Error("two keys give one seal")
	}
}

// BenchmarkSeal is what a dispatcher pays per attempt to seal its dispatch
// and to verify the seal its outcome echoes: per call (the old way) and
// with a Sealer.
func BenchmarkSeal(b *testing.B) {
	key := []byte("0123456789abcdef0123456789abcdef")
	d := sealedFields()
	d.Attempt, d.History = 1, nil
	d.Seal = newSealer(key).Seal(&d)
	s := newSealer(key)
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

// sealedFields is a dispatch with every field the seal covers set (the
// values TestSealEncodingIsStable's first seal was computed over).
func sealedFields() protocol.Dispatch {
	return protocol.Dispatch{
		TaskID: "task-1", Type: "ocr", Model: "tesseract", Node: "gpu-1", Attempt: 2, MaxAttempts: 3,
		Deadline:  time.UnixMilli(1_800_000_000_123),
		Timeout:   1500 * time.Millisecond,
		Submitted: time.UnixMilli(1_800_000_000_000), Submission: "42",
		History: []protocol.Attempt{{Attempt: 1, Model: "easyocr", Node: "gpu-2", Status: protocol.OutcomeTimeout,
			Error: "no answer", LatencyMs: 1500}},
		Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		TaskSum:     protocol.TaskSum([]byte(`{"id":"task-1","type":"ocr"}`)), Seal: "00ff",
		TaskAck: "$JS.ACK.MLSCHED_TASKS.dispatcher.1.42.7.1800000000000000000.0",
	}
}

// TestSealSurvivesBothEncodings: a seal made over the full headers
// verifies over the compact one and back, since it covers the fields.
func TestSealSurvivesBothEncodings(t *testing.T) {
	s := newSealer([]byte("0123456789abcdef0123456789abcdef"))
	d := sealedFields()
	d.Seal = s.Seal(&d)
	for name, h := range map[string]nats.Header{"full": d.Header(), "compact": d.CompactHeader()} {
		again, err := protocol.ParseDispatch(h)
		if err != nil || !s.Valid(&again) {
			t.Errorf("%s: the seal does not survive the encoding (%v)", name, err)
		}
	}
}

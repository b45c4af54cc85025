package protocol_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/mlsched/mlsched/shared/protocol"
)

// BenchmarkDecodeTask measures the per-task validation cost the dispatcher
// pays on intake.
func BenchmarkDecodeTask(b *testing.B) {
	small := []byte(`{"id":"task-000123","type":"classify","payload":{"text":"is this spam?"},"models":["bert","distil"],"timeout_ms":500,"max_attempts":3}`)
	text := strings.Repeat("lorem ipsum dolor sit amet ", 4096/27+1)[:4096]
	large := []byte(fmt.Sprintf(`{"id":"task-000124","type":"summarize","payload":{"text":%q},"timeout_ms":5000}`, text))
	invalid := []byte(`{"id":"task-000125","type":"classify","timeout_ms":"soon"}`)
	for _, bc := range []struct {
		name string
		data []byte
	}{{"small", small}, {"4KiB", large}, {"rejected", invalid}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(bc.data)))
			for b.Loop() {
				_, err := protocol.DecodeTask(bc.data, protocol.Limits{})
				if (err == nil) != (bc.name != "rejected") {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDispatchHeader measures what the dispatcher pays to encode an
// attempt (first attempt, and a retry carrying its history).
func BenchmarkDispatchHeader(b *testing.B) {
	first := fullDispatch()
	first.Attempt, first.History = 1, nil
	retry := fullDispatch()
	for name, d := range map[string]protocol.Dispatch{"first": first, "retry": retry} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if h := d.Header(); len(h) < 7 {
					b.Fatal(h)
				}
			}
		})
	}
}

// BenchmarkParseDispatch measures what a worker (dispatch) and the
// dispatcher (outcome) pay to decode an attempt.
func BenchmarkParseDispatch(b *testing.B) {
	first := fullDispatch()
	first.Attempt, first.History = 1, nil
	retry := fullDispatch()
	for name, d := range map[string]protocol.Dispatch{"first": first, "retry": retry} {
		h := d.Header()
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := protocol.ParseDispatch(h); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

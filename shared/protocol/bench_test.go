package protocol_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

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
		for _, dec := range []struct {
			name string
			f    func([]byte, protocol.Limits) (protocol.Task, error)
		}{{"", protocol.DecodeTask}, {"/encoding-json", protocol.DecodeTaskReflect}} {
			// DecodeTask (one pass, decodeTaskFast) against its encoding/json
			// reference in the same run.
			b.Run(bc.name+dec.name, func(b *testing.B) {
				b.ReportAllocs()
				b.SetBytes(int64(len(bc.data)))
				for b.Loop() {
					_, err := dec.f(bc.data, protocol.Limits{})
					if (err == nil) != (bc.name != "rejected") {
						b.Fatal(err)
					}
				}
			})
		}
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
		// HeaderInto with a reused buffer, as the dispatcher does.
		b.Run(name+"/reused", func(b *testing.B) {
			b.ReportAllocs()
			var buf protocol.HeaderBuf
			for b.Loop() {
				if h := d.HeaderInto(&buf); len(h) < 7 {
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

// BenchmarkDecodeOutcome compares what the dispatcher pays to decode an
// outcome, encoding/json against DecodeOutcome, for a success and for a
// failure carrying the task's bytes.
func BenchmarkDecodeOutcome(b *testing.B) {
	success := []byte(`{"task_id":"task-000123","type":"classify","attempt":1,"model":"bert-v2","node":"node-3","status":"success","output":{"label":"spam","score":0.97},"latency_ms":3.217}`)
	failure := []byte(`{"task_id":"task-000123","type":"classify","attempt":2,"model":"bert-v2","node":"node-3","status":"model_error","error":"model server answered 503","latency_ms":12.5,"task":{"id":"task-000123","type":"classify","payload":{"text":"is this spam?"},"max_attempts":3}}`)
	for _, bc := range []struct {
		name string
		data []byte
	}{{"success", success}, {"failure", failure}} {
		b.Run(bc.name+"/json", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(bc.data)))
			for b.Loop() {
				var o protocol.Outcome
				if err := json.Unmarshal(bc.data, &o); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(bc.name+"/DecodeOutcome", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(bc.data)))
			for b.Loop() {
				if _, err := protocol.DecodeOutcome(bc.data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDecodeResult compares what a producer pays to read a result:
// encoding/json into a Result (shared/client before), into a struct of the
// status alone (the benchmark's reader before), and DecodeResult.
func BenchmarkDecodeResult(b *testing.B) {
	data := []byte(`{"id":"task-000123","type":"classify","status":"succeeded","model":"bert-v2","node":"node-3","attempts":1,"output":{"label":"spam","score":0.97},"latency_ms":7.5,"history":[{"attempt":1,"model":"bert-v2","node":"node-3","status":"success","latency_ms":3.217}],"finished_at":"2026-12-01T08:00:00.123456789Z"}`)
	b.Run("json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var r protocol.Result
			if err := json.Unmarshal(data, &r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("json-status-only", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var r struct {
				Status protocol.Status `json:"status"`
			}
			if err := json.Unmarshal(data, &r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("DecodeResult", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := protocol.DecodeResult(data); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkDispatchWire is what one dispatch's headers cost on the wire, v1
// against the compact encoding: the dispatcher encodes them (as nats.go
// writes a header block), the worker's nats.go parses the block into a map
// (nats.DecodeHeadersMsg, as it does on every message) and ParseDispatch
// reads it. The worker's echo and the dispatcher's parse of it repeat the
// last two steps.
func BenchmarkDispatchWire(b *testing.B) {
	d := fullDispatch()
	d.Attempt, d.History = 1, nil
	for _, enc := range []struct {
		name string
		into func(*protocol.HeaderBuf) nats.Header
	}{{"v1", d.HeaderInto}, {"compact", d.CompactHeaderInto}} {
		b.Run(enc.name, func(b *testing.B) {
			b.ReportAllocs()
			var buf protocol.HeaderBuf
			var block []byte
			for b.Loop() {
				h := enc.into(&buf)
				block = append(block[:0], "NATS/1.0\r\n"...)
				for k, vs := range h {
					for _, v := range vs {
						block = append(append(append(append(block, k...), ": "...), v...), "\r\n"...)
					}
				}
				block = append(block, "\r\n"...)
				got, err := nats.DecodeHeadersMsg(block)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := protocol.ParseDispatch(got); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(block)), "header-bytes")
		})
	}
}

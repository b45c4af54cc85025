package e2e_test

import (
	"encoding/json"
	"syscall"
	"testing"
	"time"

	gojson "github.com/goccy/go-json"

	"github.com/mlsched/mlsched/shared/protocol"
)

// BenchmarkCodecs: every message one successful task is encoded or decoded
// as on its way (docs/protocol.md), through protocol's decoders
// ("protocol": segmentio/encoding behind encoding/json's rules, codec.go),
// encoding/json ("json"; run with GOEXPERIMENT=jsonv2 for the v1 API on the
// v2 implementation) and github.com/goccy/go-json ("goccy"), in the same
// run. Each message is coded once per task, so the difference of ns/op is
// the difference per task (issue 18: under 3 us, a library replaces
// hand-written code). The hand-written encoders and decoders went that way,
// to segmentio/encoding (goccy, as fast, accepts invalid JSON: codec.go says
// which).
func BenchmarkCodecs(b *testing.B) {
	task := []byte(`{"id":"task-000123","type":"classify","payload":{"text":"is this spam?"},"models":["bert","distil"],"timeout_ms":500,"max_attempts":3}`)
	outcome := []byte(`{"task_id":"task-000123","type":"classify","attempt":1,"model":"bert-v2","node":"node-3","status":"success","output":{"label":"spam","score":0.97},"latency_ms":3.217}`)
	result := []byte(`{"id":"task-000123","type":"classify","status":"succeeded","model":"bert-v2","node":"node-3","attempts":1,"output":{"label":"spam","score":0.97},"latency_ms":7.5,"history":[{"attempt":1,"model":"bert-v2","node":"node-3","status":"success","latency_ms":3.217}],"finished_at":"2026-12-01T08:00:00.123456789Z"}`)
	var o protocol.Outcome
	var r protocol.Result
	if err := json.Unmarshal(outcome, &o); err != nil {
		b.Fatal(err)
	}
	if err := json.Unmarshal(result, &r); err != nil {
		b.Fatal(err)
	}
	r.FinishedAt = time.Now()
	type head = protocol.TaskHead
	type codec struct {
		name string
		f    func() error
	}
	messages := []struct {
		name   string
		codecs []codec
	}{
		{"DecodeTask", []codec{ // dispatcher intake (validation follows in every case)
			{"protocol", func() error { _, err := protocol.DecodeTask(task, protocol.Limits{}); return err }},
			{"json", func() error {
				var t protocol.Task
				if err := json.Unmarshal(task, &t); err != nil {
					return err
				}
				return t.Validate(protocol.Limits{})
			}},
			{"goccy", func() error {
				var t protocol.Task
				if err := gojson.Unmarshal(task, &t); err != nil {
					return err
				}
				return t.Validate(protocol.Limits{})
			}},
		}},
		{"DecodeTaskHead", []codec{ // worker
			{"protocol", func() error { _, err := protocol.DecodeTaskHead(task); return err }},
			{"json", func() error { var h head; return json.Unmarshal(task, &h) }},
			{"goccy", func() error { var h head; return gojson.Unmarshal(task, &h) }},
		}},
		{"EncodeOutcome", []codec{ // worker
			{"protocol", func() error { _, err := protocol.EncodeOutcome(&o); return err }},
			{"json", func() error { _, err := json.Marshal(&o); return err }},
			{"goccy", func() error { _, err := gojson.Marshal(&o); return err }},
		}},
		{"DecodeOutcome", []codec{ // dispatcher, direct report
			{"protocol", func() error { _, err := protocol.DecodeOutcome(outcome); return err }},
			{"json", func() error { var x protocol.Outcome; return json.Unmarshal(outcome, &x) }},
			{"goccy", func() error { var x protocol.Outcome; return gojson.Unmarshal(outcome, &x) }},
		}},
		{"EncodeResult", []codec{ // dispatcher
			{"protocol", func() error { _, err := protocol.EncodeResult(&r); return err }},
			{"json", func() error { _, err := json.Marshal(&r); return err }},
			{"goccy", func() error { _, err := gojson.Marshal(&r); return err }},
		}},
		{"DecodeResult", []codec{ // producer (client.Wait)
			{"protocol", func() error { _, err := protocol.DecodeResult(result); return err }},
			{"json", func() error { var x protocol.Result; return json.Unmarshal(result, &x) }},
			{"goccy", func() error { var x protocol.Result; return gojson.Unmarshal(result, &x) }},
		}},
	}
	for _, m := range messages {
		for _, c := range m.codecs {
			b.Run(m.name+"/"+c.name, func(b *testing.B) {
				b.ReportAllocs()
				// CPU per operation: steadier than wall time on a shared machine
				var ru0, ru1 syscall.Rusage
				_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
				defer func() {
					_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
					cpu := ru1.Utime.Nano() + ru1.Stime.Nano() - ru0.Utime.Nano() - ru0.Stime.Nano()
					b.ReportMetric(float64(cpu)/float64(b.N), "cpu-ns/op")
				}()
				for b.Loop() {
					if err := c.f(); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

package worker

import (
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
	"github.com/mlsched/mlsched/worker/model"
)

// BenchmarkNodeThroughput measures one node end to end on a real embedded
// server: dispatch published → task run → outcome published and acked →
// dispatch double-acked. The model is the built-in noop (or a 1ms sim).
func BenchmarkNodeThroughput(b *testing.B) {
	for _, bc := range []struct {
		name string
		spec ModelSpec
	}{
		{"noop", goModel("m", "noop")},
		{"sim1ms", ModelSpec{Name: "m", Types: []string{"t"}, Executor: model.ExecutorSim,
			Sim: &model.SimSpec{Latency: model.Latency{Dist: model.DistFixed, Value: model.Duration(time.Millisecond)}}}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			h := newHarness(b, "bench")
			cfg := h.config()
			cfg.Concurrency = 32
			h.start(cfg, WithModels([]ModelSpec{bc.spec}))
			deadline := time.Now().Add(time.Hour)
			b.ReportAllocs()
			b.ResetTimer()
			go func() {
				for i := range b.N {
					id := "b" + strconv.Itoa(i)
					pd := protocol.Dispatch{TaskID: id, Type: "t", Model: "m", Node: "bench", Attempt: 1, MaxAttempts: 1, Deadline: deadline}
					m := &nats.Msg{Subject: topology.DispatchSubject("bench"), Data: taskBody(id, "null"), Header: pd.Header()}
					if _, err := h.srv.JS.PublishMsgAsync(m, jetstream.WithMsgID(pd.MsgID("d"))); err != nil {
						b.Error(err)
						return
					}
				}
			}()
			got := 0
			for got < b.N {
				batch, err := h.outc.FetchNoWait(256)
				if err != nil {
					b.Fatal(err)
				}
				n := 0
				for m := range batch.Messages() {
					_ = m.Ack()
					n++
				}
				if n == 0 {
					batch, err = h.outc.Fetch(256, jetstream.FetchMaxWait(50*time.Millisecond))
					if err != nil {
						b.Fatal(err)
					}
					for m := range batch.Messages() {
						_ = m.Ack()
						n++
					}
				}
				got += n
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tasks/s")
		})
	}
}

package jsplumb_test

import (
	"context"
	"encoding/json"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	fastjson "github.com/segmentio/encoding/json"

	"github.com/mlsched/mlsched/shared/jsplumb"
	"github.com/mlsched/mlsched/shared/natstest"
)

// BenchmarkParseAck: reading one acknowledgement as Publisher does
// (parseReply: the canonical form read in place), against the library it
// falls back to (segmentio/encoding) and encoding/json, into the same
// struct, in the same run.
func BenchmarkParseAck(b *testing.B) {
	body := []byte(`{"stream":"MLSCHED_DISPATCH","seq":1234567}`)
	b.Run("jsplumb", func(b *testing.B) {
		b.ReportAllocs()
		defer reportCPU(b, cpuTime())
		m := &nats.Msg{Data: body}
		for b.Loop() {
			if ack, err := jsplumb.ParseReply(m); err != nil || ack.Sequence != 1234567 {
				b.Fatal(ack, err)
			}
		}
	})
	for _, lib := range []struct {
		name      string
		unmarshal func([]byte, any) error
	}{{"segmentio", fastjson.Unmarshal}, {"encoding-json", json.Unmarshal}} {
		b.Run(lib.name, func(b *testing.B) {
			b.ReportAllocs()
			defer reportCPU(b, cpuTime())
			for b.Loop() {
				var r struct {
					Error *jetstream.APIError `json:"error"`
					*jetstream.PubAck
				}
				if err := lib.unmarshal(body, &r); err != nil || r.Sequence != 1234567 {
					b.Fatal(err)
				}
			}
		})
	}
}

// cpuTime is the process's user+system CPU time so far: on a shared
// machine CPU per publish (client and embedded server together) is steadier
// than wall time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports the CPU per operation since start.
func reportCPU(b *testing.B, start time.Duration) {
	b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op")
}

// BenchmarkPublish: one asynchronous publish to a stream and its
// acknowledgement handled, through Publisher against
// jetstream.PublishMsgAsync with a goroutine resolving the futures in order
// (the dispatcher's former settler), in the same run on an embedded server
// (whose CPU counts too: compare the difference, not the ratio).
func BenchmarkPublish(b *testing.B) {
	s := natstest.New(b)
	ctx := context.Background()
	if _, err := s.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "B", Subjects: []string{"b.>"},
		Storage: jetstream.MemoryStorage}); err != nil {
		b.Fatal(err)
	}
	data := make([]byte, 256)
	var n atomic.Int64
	b.Run("jspub", func(b *testing.B) {
		b.ReportAllocs()
		defer reportCPU(b, cpuTime())
		p := jsplumb.NewPublisher(s.NC, jsplumb.PublisherConfig{MaxPending: 1024})
		if err := p.Start(ctx); err != nil {
			b.Fatal(err)
		}
		done := make(chan struct{}, 1024)
		cb := func(_ *jetstream.PubAck, err error) {
			if err != nil {
				b.Error(err)
			}
			done <- struct{}{}
		}
		sent := 0
		for b.Loop() {
			m := &nats.Msg{Subject: "b.x", Data: data, Header: make(nats.Header, 1)}
			if err := p.Publish(ctx, m, "j"+strconv.FormatInt(n.Add(1), 10), cb); err != nil {
				b.Fatal(err)
			}
			sent++
			for sent > 512 {
				<-done
				sent--
			}
		}
		for ; sent > 0; sent-- {
			<-done
		}
		_ = p.Stop()
	})
	b.Run("jetstream-async", func(b *testing.B) {
		b.ReportAllocs()
		defer reportCPU(b, cpuTime())
		js, err := jetstream.New(s.NC, jetstream.WithPublishAsyncMaxPending(1024))
		if err != nil {
			b.Fatal(err)
		}
		futs := make(chan jetstream.PubAckFuture, 1024)
		resolved := make(chan struct{})
		go func() {
			defer close(resolved)
			for f := range futs {
				select {
				case <-f.Ok():
				case err := <-f.Err():
					b.Error(err)
				}
			}
		}()
		for b.Loop() {
			m := &nats.Msg{Subject: "b.x", Data: data, Header: make(nats.Header, 1)}
			f, err := js.PublishMsgAsync(m, jetstream.WithMsgID("a"+strconv.FormatInt(n.Add(1), 10)))
			if err != nil {
				b.Fatal(err)
			}
			futs <- f
		}
		close(futs)
		<-resolved
	})
	// nats.go's own callback options: one ack handler and one error handler
	// for the JetStream context, each given the published *nats.Msg; the
	// per-publish callback is found by that pointer (what settling the
	// consumed message that caused the publish needs).
	b.Run("jetstream-handlers", func(b *testing.B) {
		b.ReportAllocs()
		defer reportCPU(b, cpuTime())
		var cbs sync.Map // *nats.Msg -> func(error)
		done := make(chan struct{}, 1024)
		call := func(m *nats.Msg, err error) {
			if cb, ok := cbs.LoadAndDelete(m); ok {
				cb.(func(error))(err)
			}
		}
		js, err := jetstream.New(s.NC, jetstream.WithPublishAsyncMaxPending(1024),
			jetstream.WithPublishAsyncAckHandler(func(_ jetstream.JetStream, m *nats.Msg, _ *jetstream.PubAck) { call(m, nil) }),
			jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, m *nats.Msg, err error) { call(m, err) }))
		if err != nil {
			b.Fatal(err)
		}
		cb := func(err error) {
			if err != nil {
				b.Error(err)
			}
			done <- struct{}{}
		}
		sent := 0
		for b.Loop() {
			m := &nats.Msg{Subject: "b.x", Data: data, Header: make(nats.Header, 1)}
			cbs.Store(m, cb)
			if _, err := js.PublishMsgAsync(m, jetstream.WithMsgID("h"+strconv.FormatInt(n.Add(1), 10))); err != nil {
				b.Fatal(err)
			}
			sent++
			for sent > 512 {
				<-done
				sent--
			}
		}
		for ; sent > 0; sent-- {
			<-done
		}
	})
}

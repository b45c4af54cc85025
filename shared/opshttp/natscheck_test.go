package opshttp_test

import (
	"context"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/shared/natstest"
	"github.com/mlsched/mlsched/shared/opshttp"
)

func TestNATSChecks(t *testing.T) {
	ns := natstest.New(t)
	ctx := context.Background()
	if _, err := ns.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "S1", Subjects: []string{"s1"}}); err != nil {
		t.Fatal(err)
	}
	st := opshttp.Status{Checks: opshttp.NATSChecks(ctx, ns.NC, ns.JS, "S1")}
	if !st.Ready() {
		t.Fatalf("checks with the stream present: %+v", st.Checks)
	}
	st = opshttp.Status{Checks: opshttp.NATSChecks(ctx, ns.NC, ns.JS, "S1", "MISSING")}
	if st.Ready() || st.Checks[0].Err != nil || st.Checks[1].Err == nil || !strings.Contains(st.Checks[1].Err.Error(), "MISSING") {
		t.Fatalf("checks with a stream missing: %+v", st.Checks)
	}
	nc, err := nats.Connect(ns.URL)
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	nc.Close()
	st = opshttp.Status{Checks: opshttp.NATSChecks(ctx, nc, js, "S1")}
	if st.Ready() || st.Checks[0].Err == nil || !strings.Contains(st.Checks[0].Err.Error(), "CLOSED") {
		t.Fatalf("checks on a closed connection: %+v", st.Checks)
	}
}

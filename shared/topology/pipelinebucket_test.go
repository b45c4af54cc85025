package topology_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/shared/natstest"
	"github.com/mlsched/mlsched/shared/topology"
)

// The ensemble members' bucket is read from its stream's leader, never by a
// direct get a lagging replica may answer: created so, and an existing bucket
// (of an earlier version, direct gets allowed) is changed so; what was
// stored is still read.
func TestPipelineBucketReadsFromTheLeader(t *testing.T) {
	srv := natstest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	allowDirect := func() bool {
		t.Helper()
		s, err := srv.JS.Stream(ctx, "KV_"+topology.BucketPipeline)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.Config.AllowDirect
	}
	// An earlier version's bucket: the library's default allows direct gets.
	old, err := srv.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: topology.BucketPipeline})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := old.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if !allowDirect() {
		t.Fatal("the library's bucket should allow direct gets (the case this guards against)")
	}
	kv, err := topology.EnsurePipelineBucket(ctx, srv.JS, topology.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if allowDirect() {
		t.Fatal("EnsurePipelineBucket left direct gets allowed: a replica behind the leader may answer a read")
	}
	if e, err := kv.Get(ctx, "k"); err != nil || string(e.Value()) != "v" {
		t.Fatalf("get after the change: %v %v", e, err)
	}
	// Ensured again (another replica starting): nothing to change.
	if _, err := topology.EnsurePipelineBucket(ctx, srv.JS, topology.Config{}); err != nil || allowDirect() {
		t.Fatalf("ensured again: %v, direct %v", err, allowDirect())
	}
}

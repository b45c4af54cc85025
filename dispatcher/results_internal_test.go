package dispatcher

import (
	"context"
	"testing"

	"github.com/mlsched/mlsched/dispatcher/internal/finish"
	"github.com/mlsched/mlsched/shared/natstest"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// finish.Lookup, the one reader of MLSCHED_RESULTS, tells a stored result
// (decoded with the protocol's codec), no result, and a stored result that
// does not decode (found, with an error) apart.
func TestLookupResult(t *testing.T) {
	t.Parallel()
	ns := natstest.New(t)
	ctx := context.Background()
	if err := topology.Ensure(ctx, ns.JS, topology.Config{}); err != nil {
		t.Fatal(err)
	}
	results, err := ns.JS.Stream(ctx, topology.StreamResults)
	if err != nil {
		t.Fatal(err)
	}
	data, err := protocol.EncodeResult(&protocol.Result{ID: "r1", Type: "t", Status: protocol.StatusFailed,
		ErrorCode: protocol.CodeSaturated, Attempts: 2})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ns.JS.Publish(ctx, topology.ResultSubject("r1"), data); err != nil {
		t.Fatal(err)
	}
	if _, err := ns.JS.Publish(ctx, topology.ResultSubject("junk1"), []byte("not json")); err != nil {
		t.Fatal(err)
	}
	res, found, err := finish.Lookup(ctx, results, "r1")
	if !found || err != nil || res.Status != protocol.StatusFailed || res.ErrorCode != protocol.CodeSaturated || res.Attempts != 2 {
		t.Fatalf("r1: %+v found=%v err=%v, want the stored failed/saturated result of 2 attempts", res, found, err)
	}
	if _, found, err := finish.Lookup(ctx, results, "none1"); found || err != nil {
		t.Fatalf("none1: found=%v err=%v, want not found and no error", found, err)
	}
	if _, found, err := finish.Lookup(ctx, results, "junk1"); !found || err == nil {
		t.Fatalf("junk1: found=%v err=%v, want found with a decoding error", found, err)
	}
}

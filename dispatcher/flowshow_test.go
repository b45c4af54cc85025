package dispatcher_test

import (
	"encoding/json"
	"testing"

	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// Tasks flow control ends without starting them are counted by priority
// band and code (bounded labels): in the stats report's ended_by and in
// mlsched_flow_ended_total{band,code}, every series present from the start.
func TestFlowEndedByBand(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.queued = 100_000 // on 8 slots: hours of work, so both are held
	e.startNode("busy", []string{"s"}, map[string]behavior{"m": succeed})
	base := baseURL(t, e.d)
	if fams, _ := scrape(t, base); func() bool {
		v, ok := value(fams, "mlsched_flow_ended_total", "band=high", "code=quota_exceeded")
		return !ok || v != 0
	}() {
		t.Fatal("mlsched_flow_ended_total{band=high,code=quota_exceeded} not at 0 from the start")
	}
	data, _ := json.Marshal(protocol.Task{ID: "shed1", Type: "s", TimeoutMs: 60_000, DeadlineMs: 2000, Priority: -3})
	e.publish(topology.BandTaskSubject("s", -3), data, "shed1")
	e.submit(protocol.Task{ID: "exp1", Type: "s", TimeoutMs: 60_000, DeadlineMs: 300})
	if r := e.result("shed1"); r.ErrorCode != protocol.CodeShed {
		t.Fatalf("shed1: %+v, want code shed", r)
	}
	if r := e.result("exp1"); r.ErrorCode != protocol.CodeExpired {
		t.Fatalf("exp1: %+v, want code expired", r)
	}
	got := map[string]int64{}
	for _, c := range e.d.Report().EndedBy {
		got[c.Band+"/"+string(c.Code)] += c.Tasks
	}
	if len(got) != 2 || got["low/shed"] != 1 || got["normal/expired"] != 1 {
		t.Fatalf("ended_by = %v, want low/shed=1 normal/expired=1", got)
	}
	fams, body := scrape(t, base)
	for _, c := range []struct {
		band, code string
		want       float64
	}{{"low", "shed", 1}, {"normal", "expired", 1}, {"high", "shed", 0}} {
		if v, ok := value(fams, "mlsched_flow_ended_total", "band="+c.band, "code="+c.code); !ok || v != c.want {
			t.Errorf("mlsched_flow_ended_total{band=%s,code=%s} = %v (present %v), want %v\n%s", c.band, c.code, v, ok, c.want, body)
		}
	}
}

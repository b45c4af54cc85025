package admission

import (
	"fmt"
	"testing"
	"time"

	"github.com/mlsched/mlsched/dispatcher/internal/finish"
	"github.com/mlsched/mlsched/shared/protocol"
)

// The hold orders its tasks with package fairorder (whose tests hold the
// order itself) and the tenants' weights of MLSCHED_TENANT_WEIGHTS: passes
// that send one task each (a saturated cluster frees one slot at a time)
// share 3:1:1 as 60/20/20 within ±5 points.
func TestHoldOrderOneTaskPerPassWeightedFair(t *testing.T) {
	rules := weights{"a": 3, "b": 1, "c": 1}
	h := newHoldRoom()
	base := time.Now()
	seq := 0
	add := func(tenant string) *heldTask {
		seq++
		return &heldTask{a: Attempt{Spec: finish.Spec{Task: protocol.Task{ID: fmt.Sprint(tenant, seq), Type: "x", Tenant: tenant}}},
			since: base.Add(time.Duration(seq) * time.Millisecond), key: "x", tenant: tenant}
	}
	var q []*heldTask
	for range 20 { // every tenant backlogged, a's tasks the oldest
		q = append(q, add("a"))
	}
	for range 20 {
		q = append(q, add("b"), add("c"))
	}
	served := map[string]int{}
	for range 1000 {
		h.mu.Lock()
		h.order(q, rules)
		h.mu.Unlock()
		ht := q[0] // one slot free per pass
		h.served(ht)
		served[ht.tenant]++
		q = append(q[1:], add(ht.tenant)) // the tenant stays backlogged
	}
	for tenant, want := range map[string]float64{"a": 60, "b": 20, "c": 20} {
		got := 100 * float64(served[tenant]) / 1000
		if got < want-5 || got > want+5 {
			t.Errorf("tenant %s got %.1f%% of 1000 one-task passes, want %.0f±5 (%v)", tenant, got, want, served)
		}
	}
}

// Which task goes first at a node that orders its queue (holdRoom.leads):
// a new task with nothing of higher priority held and none of its tenant's
// in its band; a held one only above the priority last sent on without the
// credit (what fills the nodes' queues).
func TestHoldLeads(t *testing.T) {
	h := newHoldRoom()
	hold := func(key, tenant string, prio int) {
		h.mu.Lock()
		h.countLocked(key, prio, 1)
		h.fair.CountTenant(prio, tenant, 1)
		h.mu.Unlock()
		h.n.Add(1)
	}
	if h.leads("x", 0, "b", false) {
		t.Fatal("leads with nothing held")
	}
	hold("x", "a", 0)
	hold("x", "a", 0)
	hold("x", "a", -5)
	cases := []struct {
		key, tenant string
		prio        int
		fromHold    bool
		want        bool
	}{
		{"x", "b", 0, false, true},   // a quiet tenant's new task
		{"x", "a", 0, false, false},  // behind its own tenant's held ones
		{"x", "a", 5, false, true},   // the first urgent one
		{"x", "b", -5, false, false}, // priority 0 is held above it
		{"y", "b", 0, false, false},  // nothing of its key held
		{"x", "a", 5, true, false},   // held: nothing sent plainly yet
	}
	for _, c := range cases {
		if got := h.leads(c.key, c.prio, c.tenant, c.fromHold); got != c.want {
			t.Errorf("leads(%s, %d, %s, fromHold=%v) = %v, want %v", c.key, c.prio, c.tenant, c.fromHold, got, c.want)
		}
	}
	h.sentPlain("x", 0)
	h.sentPlain("y", 0) // nothing of y held: not recorded
	hold("x", "a", 5)
	if !h.leads("x", 5, "a", true) {
		t.Error("a held priority-5 task does not lead while priority 0 is sent plainly")
	}
	if h.leads("x", 0, "a", true) {
		t.Error("a held priority-0 task leads while priority 0 is sent plainly: it would wait behind its like")
	}
	hold("y", "a", 5)
	if h.leads("y", 5, "a", true) {
		t.Error("a plain send recorded for a key with nothing held")
	}
}

// weights are Rules of tenants' weights alone.
type weights map[string]float64

func (w weights) Weight(tenant string) float64 {
	if v, ok := w[tenant]; ok {
		return v
	}
	return 1
}
func (weights) Expiry(*protocol.Task, time.Time) time.Time { return time.Time{} }
func (weights) Rate(string) float64                        { return 0 }
func (weights) Cap(string) int                             { return 0 }

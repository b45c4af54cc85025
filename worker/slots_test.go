package worker

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestNodeStartsQueuedDispatchesInPriorityAndTenantOrder: on a real server,
// a node with one slot, busy, receives five dispatches of tenant a, then
// one of priority 5 and one of tenant b. When the slot frees, the urgent
// one starts first, and b's starts after one of a's, not behind all five.
// In arrival order (MLSCHED_PREFETCH=0's behaviour) both would wait
// behind a's.
func TestNodeStartsQueuedDispatchesInPriorityAndTenantOrder(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "n-order")
	gate := make(chan struct{})
	var mu sync.Mutex
	var order []string
	cfg := h.config()
	cfg.Concurrency = 1
	r := h.start(cfg, WithHandler("rec", func(ctx context.Context, task Task) (any, error) {
		if task.ID == "busy" {
			select {
			case <-gate:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		mu.Lock()
		order = append(order, task.ID)
		mu.Unlock()
		return "ok", nil
	}), WithModels([]ModelSpec{goModel("m", "rec")}))
	h.dispatch("busy", "m", dispatchOpts{})
	waitFor(t, 10*time.Second, "the busy task running", func() bool { return r.w.InFlight() == 1 })
	for i := range 5 {
		h.dispatch(fmt.Sprintf("a%d", i), "m", dispatchOpts{body: `{"id":"a` + fmt.Sprint(i) + `","type":"t","tenant":"a","payload":null}`})
	}
	h.dispatch("urgent", "m", dispatchOpts{body: `{"id":"urgent","type":"t","tenant":"a","priority":5,"payload":null}`})
	h.dispatch("b0", "m", dispatchOpts{body: `{"id":"b0","type":"t","tenant":"b","payload":null}`})
	waitFor(t, 10*time.Second, "the seven dispatches waiting for the slot", func() bool {
		r.w.slots.mu.Lock()
		defer r.w.slots.mu.Unlock()
		return r.w.waiting.Load() == 7 && len(r.w.slots.waiting) == 7
	})
	close(gate)
	h.collect(8, 20*time.Second)
	mu.Lock()
	defer mu.Unlock()
	want := []string{"busy", "urgent", "a0", "b0", "a1", "a2", "a3", "a4"}
	if !slices.Equal(order, want) {
		t.Fatalf("started %s, want %s", strings.Join(order, " "), strings.Join(want, " "))
	}
}

// TestSlotsOrder holds the slot order itself: priority first, tenants in
// turn within a priority, an urgent grant not moving a band's turn, and a
// free slot taken at once.
func TestSlotsOrder(t *testing.T) {
	s := newSlots(1)
	s.acquire(0, "x") // free: at once
	type req struct {
		prio   int
		tenant string
		name   string
	}
	reqs := []req{{0, "a", "a1"}, {0, "a", "a2"}, {0, "a", "a3"}, {9, "a", "u1"}, {0, "b", "b1"}, {0, "b", "b2"},
		{-5, "c", "c1"}, {0, "c", "c2"}, {9, "b", "u2"}}
	var mu sync.Mutex
	var got []string
	done := make(chan struct{}, len(reqs))
	for _, r := range reqs {
		s.mu.Lock()
		before := len(s.waiting)
		s.mu.Unlock()
		go func() {
			s.acquire(r.prio, r.tenant)
			mu.Lock()
			got = append(got, r.name)
			mu.Unlock()
			done <- struct{}{}
		}()
		waitFor(t, 5*time.Second, r.name+" waiting", func() bool {
			s.mu.Lock()
			defer s.mu.Unlock()
			return len(s.waiting) == before+1
		})
	}
	for range reqs {
		s.release()
		<-done
	}
	want := []string{"u1", "u2", "a1", "b1", "c2", "a2", "b2", "a3", "c1"}
	if !slices.Equal(got, want) {
		t.Fatalf("granted %v, want %v", got, want)
	}
	s.release()
	if s.free != 1 || len(s.waiting) != 0 {
		t.Fatalf("free %d, waiting %d after every release, want 1 and 0", s.free, len(s.waiting))
	}
}

// TestSlotsBurstCredit: a tenant under its share starts a burst of up to
// one dispatch per slot before a flooding tenant's backlog, and no more:
// the next goes in turn. Two saturating tenants still alternate, and the
// credit of an idle one does not outlast its burst.
func TestSlotsBurstCredit(t *testing.T) {
	s := newSlots(2)
	var mu sync.Mutex
	var got []string
	done := make(chan struct{}, 64)
	queue := func(tenant, name string) {
		s.mu.Lock()
		before := len(s.waiting)
		s.mu.Unlock()
		go func() {
			s.acquire(0, tenant)
			mu.Lock()
			got = append(got, name)
			mu.Unlock()
			done <- struct{}{}
		}()
		waitFor(t, 5*time.Second, name+" waiting", func() bool {
			s.mu.Lock()
			defer s.mu.Unlock()
			return len(s.waiting) == before+1
		})
	}
	grant := func(n int) []string {
		for range n {
			s.release()
			<-done
		}
		mu.Lock()
		defer mu.Unlock()
		out := got
		got = nil
		return out
	}
	s.acquire(0, "a") // both slots busy with the flood
	s.acquire(0, "a")
	for i := range 8 {
		queue("a", fmt.Sprintf("a%d", i))
	}
	if g := grant(2); !slices.Equal(g, []string{"a0", "a1"}) {
		t.Fatalf("granted %v, want a0 a1", g)
	}
	for i := range 3 {
		queue("b", fmt.Sprintf("b%d", i))
	}
	// b's first two (the credit: two slots) go before a's backlog; its
	// third takes its turn with a's.
	if g, want := grant(5), []string{"b0", "b1", "a2", "b2", "a3"}; !slices.Equal(g, want) {
		t.Fatalf("granted %v, want %v", g, want)
	}
	// c arrives with a backlog of its own: its first two go on the credit,
	// b's next one on what is left of b's (one slot), and then the two
	// saturating tenants alternate.
	for i := range 4 {
		queue("c", fmt.Sprintf("c%d", i))
	}
	queue("b", "b3")
	if g, want := grant(8), []string{"c0", "c1", "b3", "a4", "c2", "a5", "c3", "a6"}; !slices.Equal(g, want) {
		t.Fatalf("granted %v, want %v", g, want)
	}
}

// TestSlotsTicketsKeepArrivalOrder: the place in line is the ticket's, taken
// on arrival, whatever order the waiting goroutines join in (onMessage
// takes tickets in delivery order; the tasks' goroutines run in any).
func TestSlotsTicketsKeepArrivalOrder(t *testing.T) {
	s := newSlots(1)
	s.acquire(0, "x") // the slot is busy
	tickets := []slotTicket{s.ticket(0, "a"), s.ticket(0, "a"), s.ticket(0, "a")}
	var mu sync.Mutex
	var got []int
	done := make(chan struct{}, len(tickets))
	for _, i := range []int{2, 0, 1} { // join in another order than they arrived
		go func() {
			s.wait(tickets[i])
			mu.Lock()
			got = append(got, i)
			mu.Unlock()
			done <- struct{}{}
		}()
		waitFor(t, 5*time.Second, fmt.Sprintf("ticket %d waiting", i), func() bool {
			s.mu.Lock()
			defer s.mu.Unlock()
			return slices.ContainsFunc(s.waiting, func(w *slotWaiter) bool { return w.slotTicket == tickets[i] })
		})
	}
	for range tickets {
		s.release()
		<-done
	}
	if want := []int{0, 1, 2}; !slices.Equal(got, want) {
		t.Fatalf("granted tickets %v, want %v", got, want)
	}
}

package budget_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mlsched/mlsched/dispatcher/internal/budget"
	"github.com/mlsched/mlsched/shared/redistest"
)

func mustParse(t *testing.T, scope budget.Scope, name, s string) budget.Budget {
	t.Helper()
	b, err := budget.Parse(scope, name, s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in     string
		limit  float64
		period time.Duration
		action budget.Action
		err    string
	}{
		{in: "100/1h", limit: 100, period: time.Hour, action: budget.Refuse},
		{in: "2.5/minute/degrade", limit: 2.5, period: time.Minute, action: budget.Degrade},
		{in: "5000/day/refuse", limit: 5000, period: 24 * time.Hour, action: budget.Refuse},
		{in: "100", err: "want LIMIT/PERIOD"},
		{in: "-1/1h", err: "not a positive number"},
		{in: "NaN/1h", err: "not a positive number"},
		{in: "10/10ms", err: "at least 1s"},
		{in: "10/week", err: "the period"},
		{in: "10/1h/spend", err: "neither refuse nor degrade"},
	} {
		b, err := budget.Parse(budget.Tenant, "acme", tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "tenant:acme") {
				t.Errorf("%q: got %v, want an error naming tenant:acme and %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || b.Limit != tc.limit || b.Period != tc.period || b.Action != tc.action {
			t.Errorf("%q: got %+v, %v", tc.in, b, err)
		}
	}
}

// Three replicas charging one tenant's budget at once through one Redis
// never spend more than the limit in a period, refuse the rest with the
// time left in the period, and leave other tenants alone.
func TestBudgetSharedAcrossReplicas(t *testing.T) {
	rs := redistest.Start(t)
	bs := []budget.Budget{mustParse(t, budget.Tenant, "a", "100/1h"), mustParse(t, budget.Type, "classify", "1000/1h")}
	var ledgers []*budget.Ledger
	for range 3 {
		ledgers = append(ledgers, budget.New(budget.Params{Budgets: bs, Redis: rs.Client(t)}))
	}
	ctx := context.Background()
	var mu sync.Mutex
	charged, refused := 0.0, 0
	periods := map[int64]bool{}
	var wg sync.WaitGroup
	for _, l := range ledgers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				v := l.Charge(ctx, "a", "classify", 0.75, false)
				mu.Lock()
				periods[time.Now().UnixMilli()/time.Hour.Milliseconds()] = true
				if v.OK {
					charged += 0.75
				} else {
					refused++
					if v.Over.Key() != "tenant:a" || v.RetryAfter <= 0 || v.RetryAfter > time.Hour {
						t.Errorf("refused by %s with retry-after %v, want tenant:a within the hour", v.Over.Key(), v.RetryAfter)
					}
				}
				mu.Unlock()
				if v2 := l.Charge(ctx, "b", "embed", 1e6, false); !v2.OK {
					t.Errorf("tenant b, type embed, without a budget: refused %+v", v2)
				}
			}
		}()
	}
	wg.Wait()
	if d := ledgers[0].Degraded(); d != "" {
		t.Fatalf("degraded with Redis up: %s", d)
	}
	n := len(periods) // an hour boundary crossed during the test allows one more period's limit
	if charged > 100*float64(n) || charged < 99 {
		t.Fatalf("charged %.2f over %d period(s), want the limit 100 (to within one 0.75 task) and no more", charged, n)
	}
	if refused == 0 {
		t.Fatal("nothing refused")
	}
	// The type's budget was charged by the same admitted attempts, all or
	// none: what tenant a's refusals did not spend is not counted.
	if err := ledgers[1].Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	for _, s := range ledgers[1].Statuses() {
		if s.Spent != charged {
			t.Errorf("%s spent %.2f, want %.2f (what was charged)", s.Key(), s.Spent, charged)
		}
	}
}

// A forced charge (a degraded task) is counted beyond the limit; the next
// plain charge is refused.
func TestForcedChargeIsCounted(t *testing.T) {
	l := budget.New(budget.Params{Budgets: []budget.Budget{mustParse(t, budget.Type, "x", "10/1h/degrade")}})
	ctx := context.Background()
	if v := l.Charge(ctx, "", "x", 8, false); !v.OK {
		t.Fatal("8 of 10 refused")
	}
	if v := l.Charge(ctx, "", "x", 8, false); v.OK || v.Over.Action != budget.Degrade {
		t.Fatalf("16 of 10 admitted (%+v)", v)
	}
	if v := l.Charge(ctx, "", "x", 8, true); !v.OK {
		t.Fatal("forced charge refused")
	}
	if s := l.Statuses(); len(s) != 1 || s[0].Spent != 16 {
		t.Fatalf("statuses %+v, want 16 spent", s)
	}
}

// A period ends: spending starts again from zero, and the retry-after of a
// refusal was the time left in the period.
func TestPeriodEnds(t *testing.T) {
	now := time.Date(2026, 12, 5, 10, 59, 30, 0, time.UTC)
	l := budget.New(budget.Params{Budgets: []budget.Budget{mustParse(t, budget.Tenant, "a", "1/hour")},
		Now: func() time.Time { return now }})
	ctx := context.Background()
	if v := l.Charge(ctx, "a", "t", 1, false); !v.OK {
		t.Fatal("first refused")
	}
	v := l.Charge(ctx, "a", "t", 1, false)
	if v.OK || v.RetryAfter != 30*time.Second {
		t.Fatalf("second: %+v, want refused with 30s left", v)
	}
	now = now.Add(30 * time.Second)
	if v := l.Charge(ctx, "a", "t", 1, false); !v.OK {
		t.Fatal("refused in the next period")
	}
}

// Redis down: each replica keeps its share of the budget and says so; no
// charge blocks on the outage.
func TestBudgetDegradedShare(t *testing.T) {
	rs := redistest.Start(t)
	l := budget.New(budget.Params{Budgets: []budget.Budget{mustParse(t, budget.Tenant, "a", "90/1h")}, Redis: rs.Client(t),
		Replicas: func(context.Context) int { return 3 }})
	ctx := context.Background()
	if v := l.Charge(ctx, "a", "t", 1, false); !v.OK || l.Degraded() != "" {
		t.Fatalf("with Redis up: %+v, degraded %q", v, l.Degraded())
	}
	rs.Stop()
	admitted := 0
	for range 100 {
		if l.Charge(ctx, "a", "t", 1, false).OK {
			admitted++
		}
	}
	if l.Degraded() == "" {
		t.Fatal("not degraded with Redis down")
	}
	if admitted != 30 {
		t.Fatalf("degraded replica admitted %d, want its share 30 of 90", admitted)
	}
}

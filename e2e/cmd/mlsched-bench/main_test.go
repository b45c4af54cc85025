package main

import (
	"slices"
	"testing"
)

func TestWithAuthPairsEachScenario(t *testing.T) {
	got := withAuth([]string{"relay", "mlsched", "mlsched-observed"})
	want := []string{"relay", "relay-auth", "mlsched", "mlsched-auth", "mlsched-observed"}
	if !slices.Equal(got, want) {
		t.Errorf("withAuth = %v, want %v", got, want)
	}
	if got := withAuth([]string{"mlsched", "mlsched-auth"}); !slices.Equal(got, []string{"mlsched", "mlsched-auth"}) {
		t.Errorf("withAuth added a scenario listed already: %v", got)
	}
}

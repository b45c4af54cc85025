package topology

import "testing"

// BandIndex and Bands agree: the arrays kept per band (flow control's
// counts, the simulator's band consumers) are indexed by one rule.
func TestBandIndexIndexesBands(t *testing.T) {
	for _, p := range []int{9, 1, 0, -1, -9} {
		if i := BandIndex(p); i < 0 || i >= len(Bands) || Bands[i] != BandOf(p) {
			t.Errorf("priority %d: index %d, band %d", p, i, BandOf(p))
		}
	}
	if BandIndex(1) != 0 || BandIndex(0) != 1 || BandIndex(-1) != 2 {
		t.Errorf("high, normal, low are 0, 1, 2: got %d, %d, %d", BandIndex(1), BandIndex(0), BandIndex(-1))
	}
}

package digits

import "testing"

func TestDatasetIsComplete(t *testing.T) {
	t.Parallel()
	all, err := Dataset()
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 1797 {
		t.Fatalf("%d images, want 1797", len(all))
	}
	var counts [Classes]int
	for _, s := range all {
		counts[s.Label]++
	}
	for c, n := range counts {
		if n < 170 || n > 190 {
			t.Errorf("label %d: %d images", c, n)
		}
	}
	if _, err := parse([]byte("not gzip")); err == nil {
		t.Error("a damaged dataset parsed")
	}
}

// The model trained at start classifies images it has never seen.
func TestDefaultModelAccuracyOnHeldOutImages(t *testing.T) {
	t.Parallel()
	m, err := Default()
	if err != nil {
		t.Fatal(err)
	}
	all, _ := Dataset()
	train, holdout := Split(all)
	if len(holdout) != 450 || len(train) != 1347 {
		t.Fatalf("split %d/%d", len(train), len(holdout))
	}
	acc := m.Accuracy(holdout)
	t.Logf("held-out accuracy %.3f, training accuracy %.3f", acc, m.Accuracy(train))
	if acc < 0.9 {
		t.Fatalf("held-out accuracy %.3f, want > 0.9", acc)
	}
	_, p := m.Predict(holdout[0].Pixels)
	var sum float64
	for _, v := range p {
		sum += v
	}
	if sum < 0.999 || sum > 1.001 {
		t.Fatalf("probabilities sum to %g", sum)
	}
}

func BenchmarkTrain(b *testing.B) {
	all, _ := Dataset()
	train, _ := Split(all)
	for b.Loop() {
		Train(train, 40, 1)
	}
}

package stats

import (
	"testing"
	"time"
)

func TestRecentDefaults(t *testing.T) {
	t.Parallel()
	cases := []struct {
		w    Window
		want int64
	}{
		{Window{}, 2}, // 5m in 10s buckets: the last 20s
		{Window{Size: time.Minute, Bucket: 5 * time.Second}, 2},
		{Window{Size: time.Minute, Bucket: 10 * time.Second, Recent: 25 * time.Second}, 3}, // rounded up
		{Window{Size: time.Minute, Bucket: 10 * time.Second, Recent: time.Second}, 1},
		{Window{Size: 20 * time.Second, Bucket: 10 * time.Second, Recent: time.Hour}, 2}, // capped at the window
		{Window{Size: 10 * time.Second, Bucket: 10 * time.Second}, 1},
	}
	for _, c := range cases {
		if got := c.w.RecentBuckets(); got != c.want {
			t.Errorf("%+v: RecentBuckets = %d, want %d", c.w, got, c.want)
		}
	}
	w := Window{Size: time.Minute, Bucket: 10 * time.Second}
	now := time.Unix(1000, 0)
	if first, cur := w.RecentFirst(now), w.Index(now); first != cur-1 {
		t.Errorf("RecentFirst = %d, want the bucket before the current one (%d)", first, cur-1)
	}
}

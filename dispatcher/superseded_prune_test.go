package dispatcher

import (
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// The superseded set forgets what the bucket forgot (its TTL), instead of
// growing for ever.
func TestSupersededSetIsPruned(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	s := newSupersededSet(nil, zerolog.Nop())
	s.now = func() time.Time { return now }
	for i := range 1000 {
		s.Mark("task-"+time.Duration(i).String(), "1", 1)
	}
	if err := s.Cancel(t.Context(), "cancelled", "7"); err != nil {
		t.Fatal(err)
	}
	if s.size() != 1001 || !s.Is("task-0s", "1", 1) || !s.Cancelled("cancelled", "7") {
		t.Fatalf("size %d", s.size())
	}
	now = now.Add(supersededRetention + 2*time.Minute)
	s.Mark("fresh", "1", 2)
	if s.size() != 1 || s.Is("task-0s", "1", 1) || s.Cancelled("cancelled", "7") || !s.Is("fresh", "1", 2) {
		t.Fatalf("after the retention: size %d", s.size())
	}
}

package bench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A trace's arrivals come back relative to its first, in time order, with
// their sizes; timestamps as the Azure traces write them and plain seconds
// both read; a bad row is named by its line.
func TestLoadTrace(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	azure := write("azure.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"+
		"2023-11-16 18:17:03.9799600,4808,10\n2023-11-16 18:17:04.0319600,3180,8\n2023-11-16 18:18:04.0000000,110,27\n")
	got, err := LoadTrace(azure, "TIMESTAMP", "ContextTokens", 0)
	if err != nil {
		t.Fatal(err)
	}
	want := []Arrival{{0, 4808}, {52 * time.Millisecond, 3180}, {60*time.Second + 20040*time.Microsecond, 110}}
	if len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("got %v, want %v", got, want)
	}
	if got, err := LoadTrace(azure, "TIMESTAMP", "", 2); err != nil || len(got) != 2 || got[1].Size != 0 {
		t.Fatalf("limit 2, no size: %v %v", got, err)
	}
	secs := write("secs.csv", "time,size\n10.5,3\n10,1\n12,2\n")
	got, err = LoadTrace(secs, "time", "size", 0)
	if err != nil || len(got) != 3 || got[0] != (Arrival{0, 1}) || got[1] != (Arrival{500 * time.Millisecond, 3}) || got[2].At != 2*time.Second {
		t.Fatalf("seconds, out of order: %v %v", got, err)
	}
	for _, tc := range []struct{ body, col, want string }{
		{"TIMESTAMP\nyesterday\n", "", "line 2: time \"yesterday\""},
		{"TIMESTAMP,tok\n1,-5\n", "tok", "line 2: size \"-5\""},
		{"TIMESTAMP\n1\n", "tok", "no column \"tok\""},
		{"TIMESTAMP\n", "", "no rows"},
	} {
		if _, err := LoadTrace(write("bad.csv", tc.body), "TIMESTAMP", tc.col, 0); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want %q", tc.body, err, tc.want)
		}
	}
}

package main

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/mlsched/mlsched/shared/logtest"
)

// The demo serves the dashboard by default and says where, and its summary
// says what the table shows (issue 22: no dashboard unless asked for, a
// summary that repeated the table).
func TestDemoServesTheDashboardAndExplainsItsSummary(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel()
	var out logtest.Buffer
	done := make(chan error, 1)
	go func() {
		done <- demo(ctx, &out, demoOptions{httpAddr: "127.0.0.1:0", rate: 100, every: time.Second, policy: "reliability"})
	}()
	url := regexp.MustCompile(`dashboard: (http://\S+/)`)
	deadline := time.Now().Add(8 * time.Second)
	for url.FindStringSubmatch(out.String()) == nil {
		if time.Now().After(deadline) {
			t.Fatalf("no dashboard URL printed:\n%s", out.String())
		}
		time.Sleep(20 * time.Millisecond) // polling interval
	}
	resp, err := http.Get(url.FindStringSubmatch(out.String())[1])
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), "mlsched dashboard") {
		t.Fatalf("dashboard: %d %.200s", resp.StatusCode, body)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	s := out.String()
	if !strings.Contains(s, "\nsummary\n") || !strings.Contains(s, "What this shows: the reliability policy sent the most classify tasks") {
		t.Fatalf("summary does not say what it shows:\n%s", s)
	}
}

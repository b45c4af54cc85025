package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mlsched/mlsched/shared/logtest"
)

// The dashboard service's proxy dials its target for every connection: a
// target that is down (a dispatcher being re-created) fails that
// connection only, and the next one reaches whatever listens there now.
func TestProxyDialsTheTargetPerConnection(t *testing.T) {
	hold, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	target := hold.Addr().String()
	hold.Close() // nothing listens there yet

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var logw logtest.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- forward(ctx, ln, target, &logw) }()
	t.Cleanup(func() {
		cancel()
		ln.Close()
		if err := <-done; err != nil {
			t.Errorf("forward after its listener closed: %v", err)
		}
	})
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	url := "http://" + ln.Addr().String() + "/api/view"

	if _, err := client.Get(url); err == nil {
		t.Fatal("a request through the proxy succeeded with nothing listening at the target")
	}
	if !strings.Contains(logw.String(), target) {
		t.Errorf("the refused target is not reported: %q", logw.String())
	}

	srvLn, err := net.Listen("tcp", target)
	if err != nil {
		t.Skipf("the target's port was taken meanwhile: %v", err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		_, _ = io.WriteString(w, r.URL.Path+" "+string(body))
	})}
	go func() { _ = srv.Serve(srvLn) }()
	t.Cleanup(func() { srv.Close() })

	big := strings.Repeat("x", 1<<20) // both ways, more than one buffer
	resp, err := client.Post(url, "text/plain", strings.NewReader(big))
	if err != nil {
		t.Fatalf("through the proxy once the target listens: %v", err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if want := "/api/view " + big; string(got) != want {
		t.Fatalf("answer through the proxy: %d bytes %.40q..., want %d bytes", len(got), got, len(want))
	}
}

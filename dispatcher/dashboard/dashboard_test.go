package dashboard_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/dispatcher"
	"github.com/mlsched/mlsched/dispatcher/autoscale"
	"github.com/mlsched/mlsched/dispatcher/clusterview"
	"github.com/mlsched/mlsched/dispatcher/dashboard"
	"github.com/mlsched/mlsched/shared/natstest"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// env is a real NATS server, a dispatcher replica in-process and a dashboard
// on an httptest server.
type env struct {
	t    *testing.T
	ns   *natstest.Server
	dash *dashboard.Dashboard
	srv  *httptest.Server
	ctx  context.Context
}

func newEnv(t *testing.T) *env {
	t.Helper()
	ns := natstest.New(t)
	cfg := dispatcher.DefaultConfig()
	cfg.NATS.URL, cfg.Name, cfg.SnapshotInterval = ns.URL, "replica-a", 50*time.Millisecond
	cfg.HTTPAddr = "off" // the test serves the dashboard itself
	_, ctx := runDispatcher(t, cfg)
	dash := dashboard.New(ns.NC, ns.JS, dashboard.Config{Interval: 100 * time.Millisecond}, zerolog.Nop())
	go dash.Run(ctx)
	srv := httptest.NewServer(dash)
	t.Cleanup(func() { // before the dispatcher stops (cleanups run last first)
		srv.CloseClientConnections()
		srv.Close()
	})
	return &env{t: t, ns: ns, dash: dash, srv: srv, ctx: ctx}
}

// runDispatcher runs a replica until the test ends; ctx ends with it.
func runDispatcher(t *testing.T, cfg dispatcher.Config) (*dispatcher.Dispatcher, context.Context) {
	t.Helper()
	d, err := dispatcher.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("dispatcher: %v", err)
		}
	})
	// Its streams exist once it is ready: a task published before that
	// finds no stream ("no response from stream").
	eventually(t, "the dispatcher ready", func() bool { return d.Ready(ctx).Ready() })
	return d, ctx
}

func (e *env) get(path string) (int, string, http.Header) {
	e.t.Helper()
	res, err := http.Get(e.srv.URL + path)
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(body), res.Header
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestRoutes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for path, want := range map[string]string{"/": "text/html", "/app.js": "text/javascript", "/style.css": "text/css"} {
		code, body, h := e.get(path)
		if code != http.StatusOK || !strings.HasPrefix(h.Get("Content-Type"), want) || len(body) < 100 {
			t.Errorf("GET %s: %d %s (%d bytes)", path, code, h.Get("Content-Type"), len(body))
		}
		// Offline: nothing is loaded from another origin.
		for _, ext := range []string{"http://", "https://", "//fonts.", "@import"} {
			if strings.Contains(body, ext) && !strings.Contains(body, "http://www.w3.org/2000/svg") {
				t.Errorf("%s refers to %q", path, ext)
			}
		}
	}
	for _, path := range []string{"/nope", "/api/", "/api/nope", "/app.js/x", "/index.html", "/static/app.js", "/metricsx"} {
		if code, _, _ := e.get(path); code != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", path, code)
		}
	}
	res, err := http.Post(e.srv.URL+"/", "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /: %d", res.StatusCode)
	}
}

// The view merges the replica's report and shows dead letters with their
// reason.
func TestViewShowsReplicaAndDeadLetters(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	// An unkeyable task is dead-lettered with its reason.
	if _, err := e.ns.JS.Publish(e.ctx, "mlsched.tasks.x", []byte("not json")); err != nil {
		t.Fatal(err)
	}
	var snap struct {
		View    clusterview.View  `json:"view"`
		History []dashboard.Point `json:"history"`
	}
	eventually(t, "the replica and the dead letter in /api/view", func() bool {
		_, body, _ := e.get("/api/view")
		if err := json.Unmarshal([]byte(body), &snap); err != nil {
			t.Fatalf("/api/view: %v: %s", err, body)
		}
		return len(snap.View.Replicas) == 1 && len(snap.View.DeadLetters) == 1
	})
	if r := snap.View.Replicas[0]; r.Name != "replica-a" || r.Store != "memory" {
		t.Errorf("replica = %+v", r)
	}
	dl := snap.View.DeadLetters[0]
	if dl.Kind != "invalid" || dl.Code != protocol.CodeMalformedJSON || !strings.Contains(dl.Reason, "JSON") {
		t.Errorf("dead letter = %+v", dl)
	}
	if snap.View.DeadLettersTotal != 1 {
		t.Errorf("total = %d", snap.View.DeadLettersTotal)
	}
}

// An event stream starts with the snapshot and then gets an update per
// gather.
func TestEventStream(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	res, err := http.Get(e.srv.URL + "/api/events")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if ct := res.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(nil, 1<<20)
	var events []string
	for len(events) < 3 && sc.Scan() {
		line := sc.Text()
		if ev, ok := strings.CutPrefix(line, "event: "); ok {
			events = append(events, ev)
			continue
		}
		if data, ok := strings.CutPrefix(line, "data: "); ok && !json.Valid([]byte(data)) {
			t.Fatalf("event data is not JSON: %.200s", data)
		}
	}
	if len(events) < 3 || events[0] != "snapshot" || events[1] != "update" || events[2] != "update" {
		t.Fatalf("events = %v (scan error %v)", events, sc.Err())
	}
}

// A client that stops reading never holds up the gather loop: it only misses
// intermediate views.
func TestStalledClientDoesNotBlockRefresh(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var stalled []*http.Response
	for range 5 {
		res, err := http.Get(e.srv.URL + "/api/events")
		if err != nil {
			t.Fatal(err)
		}
		stalled = append(stalled, res) // never read
	}
	defer func() {
		for _, r := range stalled {
			r.Body.Close()
		}
	}()
	eventually(t, "5 event streams", func() bool { return e.dash.Clients() == 5 })
	done := make(chan struct{})
	go func() {
		for range 50 {
			e.dash.Refresh(e.ctx)
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("Refresh blocked behind stalled event streams")
	}
}

// The dispatcher mounts the dashboard on its listener, next to /metrics;
// unknown paths stay 404.
func TestMountedOnTheDispatcherListener(t *testing.T) {
	t.Parallel()
	ns := natstest.New(t)
	cfg := dispatcher.DefaultConfig()
	cfg.NATS.URL, cfg.Name, cfg.HTTPAddr, cfg.DashboardRefresh = ns.URL, "replica-b", "127.0.0.1:0", 100*time.Millisecond
	d, _ := runDispatcher(t, cfg)
	eventually(t, "the listener", func() bool { return d.HTTPAddr() != nil })
	base := "http://" + d.HTTPAddr().String()
	get := func(path string) (int, string) {
		res, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(body)
	}
	eventually(t, "the dashboard page", func() bool {
		code, body := get("/")
		return code == http.StatusOK && strings.Contains(body, "<title>mlsched dashboard</title>")
	})
	eventually(t, "the replica in the view", func() bool {
		_, body := get("/api/view")
		return strings.Contains(body, `"name":"replica-b"`)
	})
	for _, path := range []string{"/nope", "/api/x", "/app.js/", "/index.html"} {
		if code, _ := get(path); code != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", path, code)
		}
	}
	if code, body := get("/metrics"); code != http.StatusOK || !strings.Contains(body, "mlsched_") {
		t.Errorf("/metrics next to the dashboard: %d", code)
	}
}

// The view carries the autoscaler's decisions from MLSCHED_AUTOSCALE: each
// pool's replicas, the recommendation and why, which the page shows.
func TestViewShowsAutoscaleDecisions(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	kv, err := topology.EnsureAutoscaleBucket(e.ctx, e.ns.JS, topology.Config{})
	if err != nil {
		t.Fatal(err)
	}
	d := autoscale.Decision{Pool: "worker", Current: 2, Target: 6, Needed: 9, Reason: "scale up 2→6: needs 70.0 slots", At: time.Now()}
	data, _ := json.Marshal(d)
	if _, err := kv.Put(e.ctx, "worker", data); err != nil {
		t.Fatal(err)
	}
	var snap struct {
		View clusterview.View `json:"view"`
	}
	eventually(t, "the pool's decision in /api/view", func() bool {
		_, body, _ := e.get("/api/view")
		if err := json.Unmarshal([]byte(body), &snap); err != nil {
			t.Fatalf("/api/view: %v: %s", err, body)
		}
		return len(snap.View.Autoscale) == 1
	})
	if got := snap.View.Autoscale[0]; got.Pool != "worker" || got.Current != 2 || got.Target != 6 || got.Reason != d.Reason {
		t.Fatalf("decision in the view: %+v", got)
	}
	_, page, _ := e.get("/")
	_, js, _ := e.get("/app.js")
	if !strings.Contains(page, `id="autoscale"`) || !strings.Contains(js, "v.autoscale") {
		t.Fatal("the page has no worker pools panel fed by the view's autoscale decisions")
	}
}

// Package dashboard is the dispatcher's live web dashboard, served at / on
// the process's HTTP listener. Its static files are embedded in the binary
// (no CDN, no external font: it works offline); the page draws its charts
// itself as inline SVG.
//
// One background loop gathers the merged cluster view (package clusterview)
// every Interval, keeps a bounded history for the charts, and fans the
// encoded view out to the server-sent-event clients. Nothing here runs on
// the dispatch path: a gather is a core-NATS request the replicas answer
// from memory, and a slow browser only ever misses intermediate views (each
// client has a one-slot mailbox holding the latest one).
//
// Routes: / (the page), /app.js, /style.css, /api/view (the view and the
// history as JSON), /api/events (text/event-stream: a "snapshot" event, then
// an "update" event per gather), /api/task?id=ID (a task's result and every
// attempt: operator.LookupTask). Two actions, POST with a JSON body,
// require "Authorization: Bearer <token>", the token in Config.TokenFile
// (MLSCHED_HTTP_TOKEN_FILE), and are refused without it: /api/cancel
// {"id", "reason"} and /api/dlq/replay {"seq"}. Any other path is 404.
package dashboard

import (
	"context"
	"embed"
	"encoding/json"
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/dispatcher/clusterview"
)

//go:embed static
var static embed.FS

// Config of a Dashboard.
type Config struct {
	// Interval between gathers (default 2s).
	Interval time.Duration
	// History is how many gathers the charts keep (default 450: 15 minutes
	// at the default interval).
	History int
	// MaxClients bounds the open event streams (default 64); more get 503.
	MaxClients int
	// Gather tunes the collection of replica reports.
	Gather clusterview.Options
	// TokenFile holds the token the actions require (empty: actions are
	// refused). It is read at each action.
	TokenFile string
}

func (c Config) withDefaults() Config {
	if c.Interval <= 0 {
		c.Interval = 2 * time.Second
	}
	if c.History <= 0 {
		c.History = 450
	}
	if c.MaxClients <= 0 {
		c.MaxClients = 64
	}
	if c.Gather.Wait <= 0 {
		c.Gather.Wait = min(c.Interval, 2*time.Second)
	}
	return c
}

// Point is one gather's per-model figures, for the charts.
type Point struct {
	At     time.Time             `json:"at"`
	Models map[string]ModelPoint `json:"models"`
}

// ModelPoint is a model's figures at one point.
type ModelPoint struct {
	Success float64 `json:"success"`
	P50     float64 `json:"p50"`
	P95     float64 `json:"p95"`
	Share   float64 `json:"share"`
}

// Dashboard serves the page and the live view.
type Dashboard struct {
	cfg Config
	nc  *nats.Conn
	js  jetstream.JetStream
	log zerolog.Logger

	mu      sync.Mutex
	view    *clusterview.View
	history []Point
	clients map[chan []byte]struct{}
	gathers int64
}

// New builds a dashboard that gathers through nc and js; Run starts it.
func New(nc *nats.Conn, js jetstream.JetStream, cfg Config, log zerolog.Logger) *Dashboard {
	return &Dashboard{cfg: cfg.withDefaults(), nc: nc, js: js, log: log, clients: map[chan []byte]struct{}{}}
}

// Run gathers the view every Interval until ctx is done.
func (d *Dashboard) Run(ctx context.Context) {
	d.Refresh(ctx)
	t := time.NewTicker(d.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			d.Refresh(ctx)
		}
	}
}

// Refresh gathers the view once and pushes it to the event streams.
func (d *Dashboard) Refresh(ctx context.Context) {
	v, err := clusterview.Gather(ctx, d.nc, d.js, d.cfg.Gather)
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		v = &clusterview.View{At: time.Now(), Problems: []string{err.Error()}}
	}
	p := Point{At: v.At, Models: map[string]ModelPoint{}}
	for _, m := range v.Models {
		p.Models[m.Name] = ModelPoint{Success: m.SuccessRate, P50: m.P50Ms, P95: m.P95Ms, Share: m.TrafficShare}
	}
	data, err := json.Marshal(update{View: v, Point: &p})
	if err != nil {
		d.log.Warn().Err(err).Msg("dashboard: cannot encode the view")
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.view = v
	d.gathers++
	if len(v.Models) > 0 {
		d.history = append(d.history, p)
		if over := len(d.history) - d.cfg.History; over > 0 {
			d.history = append(d.history[:0:0], d.history[over:]...)
		}
	}
	for c := range d.clients {
		offer(c, data)
	}
}

// offer puts data in a one-slot mailbox, replacing what the client has not
// read yet: a slow client misses views, it never holds up the loop.
func offer(c chan []byte, data []byte) {
	for {
		select {
		case c <- data:
			return
		default:
		}
		select {
		case <-c:
		default:
		}
	}
}

type update struct {
	View  *clusterview.View `json:"view"`
	Point *Point            `json:"point,omitempty"`
}

type snapshot struct {
	View    *clusterview.View `json:"view"`
	History []Point           `json:"history"`
}

func (d *Dashboard) snapshot() ([]byte, error) {
	d.mu.Lock()
	s := snapshot{View: d.view, History: append([]Point(nil), d.history...)}
	d.mu.Unlock()
	if s.View == nil {
		s.View = &clusterview.View{At: time.Now(), Problems: []string{"no view gathered yet"}}
	}
	return json.Marshal(s)
}

// Gathers counts the views gathered so far.
func (d *Dashboard) Gathers() int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.gathers
}

// Clients counts the open event streams.
func (d *Dashboard) Clients() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.clients)
}

// Patterns are the net/http ServeMux patterns the dashboard serves, to mount
// it next to other handlers with unknown paths left 404.
var Patterns = []string{"GET /{$}", "GET /app.js", "GET /style.css", "GET /api/view", "GET /api/events", "GET /api/task",
	"POST /api/cancel", "POST /api/dlq/replay"}

var files = map[string]string{
	"/":          "static/index.html",
	"/app.js":    "static/app.js",
	"/style.css": "static/style.css",
}

var contentTypes = map[string]string{
	"/": "text/html; charset=utf-8", "/app.js": "text/javascript; charset=utf-8", "/style.css": "text/css; charset=utf-8",
}

// ServeHTTP serves the routes listed in the package comment.
func (d *Dashboard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	switch path {
	case "/api/task":
		d.serveTask(w, r)
		return
	case "/api/cancel", "/api/dlq/replay":
		d.serveAction(w, r)
		return
	}
	name, isFile := files[path]
	if !isFile && path != "/api/view" && path != "/api/events" {
		http.NotFound(w, r)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("X-Content-Type-Options", "nosniff")
	switch {
	case isFile:
		data, err := static.ReadFile(name)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", contentTypes[path])
		w.Header().Set("Cache-Control", "no-cache")
		w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'")
		_, _ = w.Write(data)
	case path == "/api/view":
		data, err := d.snapshot()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write(data)
	default:
		d.serveEvents(w, r)
	}
}

// writeTimeout bounds one write to an event stream: a client that stops
// reading is dropped.
const writeTimeout = 10 * time.Second

func (d *Dashboard) serveEvents(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	c := make(chan []byte, 1)
	d.mu.Lock()
	if len(d.clients) >= d.cfg.MaxClients {
		d.mu.Unlock()
		http.Error(w, "too many dashboard event streams", http.StatusServiceUnavailable)
		return
	}
	d.clients[c] = struct{}{}
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		delete(d.clients, c)
		d.mu.Unlock()
	}()
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	first, err := d.snapshot()
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	send := func(event string, data []byte) error {
		_ = rc.SetWriteDeadline(time.Now().Add(writeTimeout))
		if _, err := w.Write([]byte("event: " + event + "\ndata: ")); err != nil {
			return err
		}
		if _, err := w.Write(data); err != nil {
			return err
		}
		if _, err := w.Write([]byte("\n\n")); err != nil {
			return err
		}
		return rc.Flush()
	}
	if err := send("snapshot", first); err != nil {
		return
	}
	keepAlive := time.NewTicker(15 * time.Second)
	defer keepAlive.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case data := <-c:
			if err := send("update", data); err != nil {
				return
			}
		case <-keepAlive.C:
			_ = rc.SetWriteDeadline(time.Now().Add(writeTimeout))
			if _, err := w.Write([]byte(": keep-alive\n\n")); err != nil {
				return
			}
			if rc.Flush() != nil {
				return
			}
		}
	}
}

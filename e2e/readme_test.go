package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/e2e/harness"
)

// maxSilence is the newcomer's target: no step of the README's path waits
// silently (no output at all) for longer than this. The test logs every
// step's longest silence against it, and fails only past silenceLimit: a
// wait that says nothing at all (the 30 s no-node wait this replaced),
// never a loaded CI machine's slow second.
const (
	maxSilence   = 2 * time.Second
	silenceLimit = 10 * time.Second
)

// readmeBlock is a fenced block of README.md marked for this test with
// <!-- readme-test: NAME --> on the line before it.
type readmeBlock struct {
	name, lang string
	lines      []string
}

func readmeBlocks(t *testing.T) (map[string]readmeBlock, string) {
	t.Helper()
	data, err := os.ReadFile(repoPath(t, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile("(?s)<!-- readme-test: ([a-z-]+) -->\n```([a-z]*)\n(.*?)\n```")
	out := map[string]readmeBlock{}
	for _, m := range re.FindAllStringSubmatch(string(data), -1) {
		out[m[1]] = readmeBlock{name: m[1], lang: m[2], lines: strings.Split(m[3], "\n")}
	}
	return out, string(data)
}

// TestReadmeCommands is the newcomer's path, from README.md itself: the
// by-hand recipe (nats-server with JetStream, redis-server, a dispatcher,
// two workers, a first task), the dashboard, the Go producer built in its
// own module and run, the CLI examples and the plain-NATS example. Ports
// and /tmp paths are replaced by free ones; every other word runs as
// written. A command exiting 1 (failure) or 2 (usage) fails the test, and
// so does a step that stays silent longer than silenceLimit (each step's
// silence is logged against the 2 s target, maxSilence).
func TestReadmeCommands(t *testing.T) {
	requireBinaries(t, "dispatcher", "worker", "mlsched", "nats-server")
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server is not installed (make redis-server)")
	}
	blocks, readme := readmeBlocks(t)
	if n := strings.Count(readme, "\n"); n > 260 {
		t.Errorf("README.md has %d lines, more than 260: it is a manual; history goes in docs/", n)
	}
	for _, name := range []string{"by-hand", "cli", "go-producer", "nats-cli"} {
		if _, ok := blocks[name]; !ok {
			t.Fatalf("README.md has no block marked <!-- readme-test: %s -->", name)
		}
	}
	// Every fenced block of the README runs here, or is a diagram or table.
	if n := strings.Count(readme, "\n```sh\n") + strings.Count(readme, "\n```go\n"); n != len(blocks) {
		t.Fatalf("README.md has %d sh/go blocks but %d are marked for this test: mark every one", n, len(blocks))
	}

	r := newReadmeRun(t)
	r.makeRun(readme)
	for _, line := range blocks["by-hand"].lines {
		r.step(line)
	}
	// The first task ran: the by-hand block's last command printed it.
	if !strings.Contains(r.lastOut, `"status":"succeeded"`) {
		t.Fatalf("the by-hand recipe's task did not succeed:\n%s", r.lastOut)
	}
	r.dashboard()
	r.goProducer(blocks["go-producer"], readme)
	for _, line := range blocks["cli"].lines {
		r.step(line)
	}
	r.natsCLI(blocks["nats-cli"])
	if n := countLines(filepath.Join(r.tmp, "results.jsonl")); n != 200 {
		t.Errorf("submit -f -wait wrote %d results, want 200", n)
	}
	t.Logf("longest silence of any step: %v (target ≤ %v)", r.longest, maxSilence)
}

type readmeRun struct {
	t       *testing.T
	root    string
	tmp     string
	bin     string
	env     []string
	repl    *strings.Replacer
	ports   map[string]string
	lastOut string
	longest time.Duration
	procs   []*exec.Cmd
}

func newReadmeRun(t *testing.T) *readmeRun {
	r := &readmeRun{t: t, root: repoPath(t, "."), tmp: t.TempDir(), bin: filepath.Dir(harness.Binary(t, "dispatcher")),
		ports: map[string]string{}}
	pairs := []string{}
	for _, p := range []string{"4222", "6379", "9090", "9091", "9092"} {
		free, err := harness.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		r.ports[p] = strconv.Itoa(free)
		pairs = append(pairs, ":"+p, ":"+r.ports[p], "--port "+p, "--port "+r.ports[p], "-p "+p, "-p "+r.ports[p])
	}
	pairs = append(pairs, "/tmp/", r.tmp+"/")
	r.repl = strings.NewReplacer(pairs...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MLSCHED_") {
			r.env = append(r.env, kv)
		}
	}
	t.Cleanup(r.stop)
	return r
}

var binWord = regexp.MustCompile(`(^|\s)bin/`)

// command is a README line as it runs here: free ports, the test's /tmp,
// the built binaries.
func (r *readmeRun) command(line string) string {
	line = r.repl.Replace(line)
	return binWord.ReplaceAllString(line, "${1}"+r.bin+"/")
}

func (r *readmeRun) step(line string) {
	t := r.t
	t.Helper()
	shell := strings.TrimSpace(stripComment(line))
	switch {
	case shell == "":
		return
	case shell == "make build":
		return // the harness built (or was given, MLSCHED_E2E_BIN) the binaries just checked
	case strings.HasPrefix(shell, "export "):
		r.env = append(r.env, strings.TrimPrefix(r.command(shell), "export "))
		return
	case strings.HasSuffix(shell, "&"):
		r.background(strings.TrimSpace(strings.TrimSuffix(shell, "&")))
		return
	}
	cmd := exec.Command("bash", "-c", r.command(shell))
	cmd.Dir, cmd.Env = r.root, r.env
	out := &gapWriter{last: time.Now()}
	cmd.Stdout, cmd.Stderr = out, out
	start := time.Now()
	err := cmd.Run()
	gap := out.finish()
	code := cmd.ProcessState.ExitCode()
	t.Logf("$ %s\n  exit %d in %v, longest silence %v\n%s", shell, code, time.Since(start).Round(time.Millisecond), gap, indent(out.String()))
	if err != nil && (code == 1 || code == 2 || code < 0) {
		t.Fatalf("README command failed (exit %d): %s\n%s", code, shell, out.String())
	}
	if gap > silenceLimit {
		t.Errorf("README command was silent for %v (> %v; target %v): %s", gap, silenceLimit, maxSilence, shell)
	}
	r.longest = max(r.longest, gap)
	r.lastOut = out.String()
}

// background starts a README line that ends with & and waits until the
// process serves: its port answers (nats-server, redis-server) or its
// /readyz does (dispatcher, worker). It must say something within
// maxSilence of starting.
func (r *readmeRun) background(shell string) {
	t := r.t
	t.Helper()
	cmd := exec.Command("bash", "-c", "exec env "+r.command(shell)) // env: the line may start with VAR=value
	cmd.Dir, cmd.Env = r.root, r.env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out := &gapWriter{last: time.Now()}
	cmd.Stdout, cmd.Stderr = out, out
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", shell, err)
	}
	r.procs = append(r.procs, cmd)
	ready := func() error { return nil }
	switch {
	case strings.Contains(shell, "nats-server"):
		ready = func() error { return dialPort(r.ports["4222"]) }
	case strings.Contains(shell, "redis-server"):
		ready = func() error { return dialPort(r.ports["6379"]) }
	default:
		m := regexp.MustCompile(`MLSCHED_HTTP_ADDR=:(\d+)`).FindStringSubmatch(shell)
		if m == nil {
			t.Fatalf("cannot tell when %q is ready (no MLSCHED_HTTP_ADDR)", shell)
		}
		port := r.ports[m[1]]
		ready = func() error {
			resp, err := http.Get("http://127.0.0.1:" + port + "/readyz")
			if err != nil {
				return err
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				return fmt.Errorf("/readyz %d", resp.StatusCode)
			}
			return nil
		}
	}
	deadline := time.Now().Add(harness.ReadyTimeout)
	for {
		err := ready()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready: %v\n%s", shell, err, out.String())
		}
		time.Sleep(20 * time.Millisecond) // polling interval
	}
	first := out.firstOutput(start)
	t.Logf("& %s\n  ready in %v, first output after %v", shell, time.Since(start).Round(time.Millisecond), first)
	if first > silenceLimit {
		t.Errorf("%s said nothing for %v after it started (> %v; target %v)", shell, first, silenceLimit, maxSilence)
	}
	r.longest = max(r.longest, first)
	if strings.Contains(shell, "bin/dispatcher") && !strings.Contains(out.String(), "the dashboard at /") {
		t.Errorf("the dispatcher's start log does not mention the dashboard:\n%s", out.String())
	}
}

// makeRun runs the README's first command, the demo, for a few seconds
// (DEMO_FLAGS, which the Makefile passes on, stops it), with its dashboard
// on a free port. Its silence is counted from the demo's first line: before
// it, make prints the build command and go builds the demo.
func (r *readmeRun) makeRun(readme string) {
	t := r.t
	if !strings.Contains(readme, "| `make run` |") {
		t.Fatal("README.md's table of the two commands has no make run")
	}
	cmd := exec.Command("make", "--no-print-directory", "run", "DEMO_FLAGS=-duration 6s -rate 50 -every 1s")
	cmd.Dir, cmd.Env = r.root, append(append([]string(nil), r.env...), "MLSCHED_HTTP_ADDR=127.0.0.1:0")
	out := &gapWriter{last: time.Now()}
	cmd.Stdout, cmd.Stderr = out, out
	err := cmd.Run()
	text := out.String()
	t.Logf("$ make run (6 s)\n%s", indent(text))
	if err != nil || !strings.Contains(text, "dashboard: http://") || !strings.Contains(text, "What this shows:") {
		t.Fatalf("make run: %v\n%s", err, text)
	}
	// The longest silence once the demo runs: between its lines.
	demoStart := strings.Index(text, "mlsched demo:")
	gaps := out.gapsAfter(demoStart)
	t.Logf("make run: longest silence once the demo runs %v", gaps)
	if gaps > silenceLimit {
		t.Errorf("the demo was silent for %v (> %v; target %v)", gaps, silenceLimit, maxSilence)
	}
	r.longest = max(r.longest, gaps)
}

func (r *readmeRun) stop() {
	for i := len(r.procs) - 1; i >= 0; i-- {
		p := r.procs[i]
		_ = syscall.Kill(-p.Process.Pid, syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = p.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = syscall.Kill(-p.Process.Pid, syscall.SIGKILL)
			<-done
		}
	}
}

// dashboard: the page the dispatcher's log names answers.
func (r *readmeRun) dashboard() {
	resp, err := http.Get("http://127.0.0.1:" + r.ports["9090"] + "/")
	if err != nil {
		r.t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Contains(body, []byte("mlsched dashboard")) {
		r.t.Fatalf("dashboard: %d %.200s", resp.StatusCode, body)
	}
}

// goProducer builds the README's Go program in a module of its own, the way
// the README says (go mod edit -require/-replace, go get), outside the
// workspace and offline, then runs it against the cluster.
func (r *readmeRun) goProducer(b readmeBlock, readme string) {
	t := r.t
	dir := filepath.Join(r.tmp, "producer")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(strings.Join(b.lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	edit := regexp.MustCompile("`(go mod edit[^`]+)`").FindStringSubmatch(readme)
	if edit == nil {
		t.Fatal("README.md does not say how to require the shared module (go mod edit ...)")
	}
	get := regexp.MustCompile("`(go get [^`]+)`").FindStringSubmatch(readme)
	if get == nil {
		t.Fatal("README.md does not say how to fetch the SDK's requirements (go get ...)")
	}
	// Outside the workspace, and offline: what it needs is in the module cache.
	env := append(append([]string(nil), r.env...), "GOWORK=off", "GOPROXY=off", "GOSUMDB=off")
	for _, c := range []string{
		"go mod init example.com/producer",
		strings.ReplaceAll(strings.Join(strings.Fields(edit[1]), " "), "/path/to/mlsched", r.root),
		strings.Join(strings.Fields(get[1]), " "),
		"go run .",
	} {
		cmd := exec.Command("bash", "-c", c)
		cmd.Dir, cmd.Env = dir, env
		out, err := cmd.CombinedOutput()
		t.Logf("(producer) $ %s\n%s", c, indent(string(out)))
		if err != nil {
			t.Fatalf("the README's Go producer: %s: %v\n%s", c, err, out)
		}
		if c == "go run ." && !strings.HasPrefix(string(out), "succeeded ") {
			t.Fatalf("the Go producer printed %q, want its task succeeded", out)
		}
	}
}

// natsCLI runs the README's plain-NATS example. The nats CLI is not
// installed here, so its two commands are done as it does them: a
// JetStream publish with the Nats-Msg-Id header, and a last-for-subject get.
func (r *readmeRun) natsCLI(b readmeBlock) {
	t := r.t
	nc, err := nats.Connect("nats://127.0.0.1:" + r.ports["4222"])
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pub := regexp.MustCompile(`^nats pub (\S+) '([^']*)' -H Nats-Msg-Id:(\S+) --jetstream$`)
	get := regexp.MustCompile(`^nats stream get (\S+) --last-for (\S+)$`)
	ran := 0
	for _, line := range b.lines {
		line = strings.TrimSpace(line)
		if m := pub.FindStringSubmatch(line); m != nil {
			if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: m[1], Data: []byte(m[2]), Header: nats.Header{"Nats-Msg-Id": {m[3]}}}); err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			ran++
		} else if m := get.FindStringSubmatch(line); m != nil {
			s, err := js.Stream(ctx, m[1])
			if err != nil {
				t.Fatal(err)
			}
			var msg *jetstream.RawStreamMsg
			harness.Eventually(t, 30*time.Second, "the result "+line+" reads", func() (err error) {
				msg, err = s.GetLastMsgForSubject(ctx, m[2])
				return err
			})
			if !bytes.Contains(msg.Data, []byte(`"status":"succeeded"`)) {
				t.Fatalf("%s: %s", line, msg.Data)
			}
			ran++
		} else if line != "" {
			t.Fatalf("the nats-cli block has a command this test cannot run: %q", line)
		}
	}
	if ran != 2 {
		t.Fatalf("ran %d nats CLI commands, want 2", ran)
	}
}

func dialPort(port string) error {
	c, err := net.DialTimeout("tcp", "127.0.0.1:"+port, time.Second)
	if err == nil {
		c.Close()
	}
	return err
}

// stripComment drops a trailing "# ..." comment outside quotes.
func stripComment(line string) string {
	inQuote := byte(0)
	for i := 0; i < len(line); i++ {
		switch c := line[i]; {
		case inQuote != 0:
			if c == inQuote {
				inQuote = 0
			}
		case c == '\'' || c == '"':
			inQuote = c
		case c == '#' && (i == 0 || line[i-1] == ' '):
			return line[:i]
		}
	}
	return line
}

func indent(s string) string {
	s = strings.TrimRight(s, "\n")
	if s == "" {
		return ""
	}
	if len(s) > 3000 {
		s = s[:1500] + "\n…\n" + s[len(s)-1500:]
	}
	return "  | " + strings.ReplaceAll(s, "\n", "\n  | ")
}

func countLines(path string) int {
	data, err := os.ReadFile(path)
	if err != nil {
		return -1
	}
	return bytes.Count(data, []byte("\n"))
}

// gapWriter records output and the longest time without any.
type gapWriter struct {
	mu      sync.Mutex
	b       bytes.Buffer
	last    time.Time
	first   time.Time
	longest time.Duration
	gaps    []gapAt // each write's offset and the silence before it
}

type gapAt struct {
	offset int
	gap    time.Duration
}

// gapsAfter is the longest silence before any write past offset.
func (g *gapWriter) gapsAfter(offset int) time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	var m time.Duration
	for _, x := range g.gaps {
		if x.offset > offset {
			m = max(m, x.gap)
		}
	}
	return m
}

func (g *gapWriter) Write(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now()
	if g.first.IsZero() {
		g.first = now
	}
	g.longest = max(g.longest, now.Sub(g.last))
	g.gaps = append(g.gaps, gapAt{offset: g.b.Len(), gap: now.Sub(g.last)})
	g.last = now
	return g.b.Write(p)
}

// finish counts the silence up to the end and returns the longest.
func (g *gapWriter) finish() time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	return max(g.longest, time.Since(g.last))
}

// firstOutput is how long after start the first output came (up to now).
func (g *gapWriter) firstOutput(start time.Time) time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.first.IsZero() {
		return time.Since(start)
	}
	return g.first.Sub(start)
}

func (g *gapWriter) String() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.b.String()
}

// TestReadmeComposeBlock keeps the README's compose quick start the
// commands TestComposeDocker runs (make secrets, docker compose up -d
// --build, the CLI; the test adds its own SECRETS_DIR, --profile monitoring
// and --wait): a README that drifts from them fails here.
func TestReadmeComposeBlock(t *testing.T) {
	blocks, _ := readmeBlocks(t)
	b, ok := blocks["compose"]
	if !ok {
		t.Fatal("README.md has no block marked <!-- readme-test: compose -->")
	}
	var cmds []string
	for _, line := range b.lines {
		if i := strings.Index(line, "#"); i >= 0 {
			line = line[:i]
		}
		if line = strings.Join(strings.Fields(line), " "); line != "" {
			cmds = append(cmds, line)
		}
	}
	want := []string{"make secrets", "docker compose up -d --build", "docker compose run --rm --no-deps mlsched nodes"}
	if !slices.Equal(cmds, want) {
		t.Errorf("README's compose block runs %q, want %q (what TestComposeDocker runs)", cmds, want)
	}
}

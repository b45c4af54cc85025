package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// The operator's path through the README's compose section (issue 40),
// run by TestComposeDocker on its project: the CLI, a third-party producer
// with the producer's credentials and inbox, the dashboard's fixed address
// across re-creation and scaling, and a models file changed without a
// rebuild.

// composeReadmeCommands are the commands of the README's compose block, in
// order, without comments.
func composeReadmeCommands(t *testing.T) []string {
	t.Helper()
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
	return cmds
}

// runSplit runs docker compose with args and returns stdout and stderr
// apart.
func (p *composeProject) runSplit(ctx context.Context, args ...string) (string, string, error) {
	cmd := exec.CommandContext(ctx, "docker", p.args(args...)...)
	cmd.Dir, cmd.Env = p.root, p.env
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if err != nil {
		err = fmt.Errorf("docker %s: %w\n%s%s", strings.Join(p.args(args...), " "), err, out.String(), errb.String())
	}
	return out.String(), errb.String(), err
}

// composeCLI runs the README's `docker compose run --rm --no-deps mlsched
// nodes`: the live nodes, each with its container's host name, and nothing
// on stderr (without --no-deps compose reports "Container … Running").
func composeCLI(ctx context.Context, t *testing.T, p *composeProject, line string, workers []string) {
	t.Helper()
	args, ok := strings.CutPrefix(line, "docker compose ")
	if !ok {
		t.Fatalf("README compose command %q", line)
	}
	var hosts []string
	for _, id := range workers {
		hosts = append(hosts, containerHostname(ctx, id))
	}
	var out, stderr string
	if err := eventually(30*time.Second, func() error {
		var err error
		out, stderr, err = p.runSplit(ctx, strings.Fields(args)...)
		if err != nil {
			return err
		}
		for _, h := range hosts {
			if !strings.Contains(out, " "+h+" ") {
				return fmt.Errorf("%s: no node on host %s:\n%s", line, h, out)
			}
		}
		return nil
	}); err != nil {
		t.Error(err)
		return
	}
	if f := strings.Fields(out); len(f) < 2 || f[0] != "NODE" || f[1] != "HOST" {
		t.Errorf("%s: header %q, want NODE HOST …", line, strings.SplitN(out, "\n", 2)[0])
	}
	if strings.Contains(stderr, "Container") { // compose's dependency check: "Container mlsched-nats-1 Running"
		t.Errorf("%s: compose reported containers on stderr: %q", line, stderr)
	}
	t.Logf("%s: every worker container's host name next to its node id:\n%s", line, out)
}

// composeProducer runs the README's third-party producer block (the nats
// CLI with the producer's creds and inbox prefix) as the nats CLI does it,
// since it is not installed here: a JetStream publish (whose ack is a reply
// to the client's inbox) and a last-for-subject get (a JetStream API
// request, answered on the inbox too). It also shows why the inbox prefix
// is needed: without it the publish's ack never arrives, though the task
// is stored and runs. Then a task cut short after its id: its rejected
// result is readable with the same credentials.
func composeProducer(ctx context.Context, t *testing.T, p *composeProject, natsURL string) {
	t.Helper()
	blocks, _ := readmeBlocks(t)
	b, ok := blocks["compose-producer"]
	if !ok {
		t.Fatal("README.md has no block marked <!-- readme-test: compose-producer -->")
	}
	conn := `nats -s nats://127\.0\.0\.1:4222 --creds (\S+) --inbox-prefix (\S+) `
	pub := regexp.MustCompile(`^` + conn + `pub (\S+) '([^']*)' -H Nats-Msg-Id:(\S+) --jetstream$`)
	get := regexp.MustCompile(`^` + conn + `stream get (\S+) --last-for (\S+)$`)
	dial := func(creds, prefix string) jetstream.JetStream {
		t.Helper()
		if !strings.HasPrefix(creds, "secrets/") {
			t.Fatalf("README's producer creds %q are not in ./secrets", creds)
		}
		opts := []nats.Option{nats.UserCredentials(filepath.Join(p.secrets, strings.TrimPrefix(creds, "secrets/"))),
			nats.Name("readme-nats-cli")}
		if prefix != "" {
			opts = append(opts, nats.CustomInboxPrefix(prefix))
		}
		nc, err := nats.Connect(natsURL, opts...)
		if err != nil {
			t.Fatalf("connect with %s: %v", creds, err)
		}
		t.Cleanup(nc.Close)
		js, _ := jetstream.New(nc)
		return js
	}
	var lines []string // continuation lines (\) joined
	cur := ""
	for _, l := range b.lines {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "#") {
			continue
		}
		if c, ok := strings.CutSuffix(l, `\`); ok {
			cur += c + " "
			continue
		}
		if cur += l; strings.TrimSpace(cur) != "" {
			lines = append(lines, cur)
		}
		cur = ""
	}
	ran := 0
	var creds, prefix string
	for _, line := range lines {
		line = strings.Join(strings.Fields(line), " ")
		if m := pub.FindStringSubmatch(line); m != nil {
			creds, prefix = m[1], m[2]
			js := dial(m[1], m[2])
			pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := js.PublishMsg(pctx, &nats.Msg{Subject: m[3], Data: []byte(m[4]), Header: nats.Header{"Nats-Msg-Id": {m[5]}}})
			cancel()
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			ran++
		} else if m := get.FindStringSubmatch(line); m != nil {
			js := dial(m[1], m[2])
			var msg *jetstream.RawStreamMsg
			if err := eventually(60*time.Second, func() error {
				s, err := js.Stream(ctx, m[3])
				if err == nil {
					msg, err = s.GetLastMsgForSubject(ctx, m[4])
				}
				return err
			}); err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			if !bytes.Contains(msg.Data, []byte(`"status":"succeeded"`)) {
				t.Fatalf("%s: %s", line, msg.Data)
			}
			t.Logf("%s: %s", line, msg.Data)
			ran++
		} else {
			t.Fatalf("the compose-producer block has a command this test cannot run: %q", line)
		}
	}
	if ran != 2 || prefix != "_INBOX.producer" || creds != "secrets/producer.creds" {
		t.Fatalf("ran %d nats CLI commands with %s and %s, want 2 with secrets/producer.creds and _INBOX.producer", ran, creds, prefix)
	}

	// Without the prefix the publish is stored but its ack cannot reach
	// the client: what the README warns about.
	nc, err := nats.Connect(natsURL, nats.UserCredentials(filepath.Join(p.secrets, "producer.creds")))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	bare, _ := jetstream.New(nc)
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	_, err = bare.Publish(pctx, "mlsched.tasks.classify", []byte(`{"id":"c-noinbox","type":"classify","payload":{}}`))
	cancel()
	if err == nil {
		t.Error("a producer with the default inbox got its publish acknowledged: the README says it cannot")
	} else {
		t.Logf("producer creds without --inbox-prefix: %v (as the README says)", err)
	}

	// A task cut short after its id: a rejected result, of its type, read
	// with the producer's credentials and inbox.
	js := dial(creds, prefix)
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: "mlsched.tasks.classify", Data: []byte(`{"id":"c-bad-1","type":"classify","payload":`),
		Header: nats.Header{"Nats-Msg-Id": {"c-bad-1"}}}); err != nil {
		t.Fatal(err)
	}
	var res protocol.Result
	if err := eventually(60*time.Second, func() error {
		s, err := js.Stream(ctx, topology.StreamResults)
		if err != nil {
			return err
		}
		m, err := s.GetLastMsgForSubject(ctx, topology.ResultSubject("c-bad-1"))
		if err != nil {
			return err
		}
		return json.Unmarshal(m.Data, &res)
	}); err != nil {
		t.Errorf("the truncated task's result, read as the producer: %v", err)
	} else if res.Status != protocol.StatusRejected || res.ErrorCode != protocol.CodeMalformedJSON || res.Type != "classify" {
		t.Errorf("the truncated task's result: %+v, want rejected, malformed_json, type classify", res)
	}
}

// composeDashboardStays checks the dashboard service's address answers
// with every dispatcher replica, and keeps answering, at the same address,
// after the dispatchers are re-created (`up -d --force-recreate --no-deps
// dispatcher`, the upgrade step) and scaled.
func composeDashboardStays(ctx context.Context, t *testing.T, p *composeProject, addr string, scales ...int) {
	t.Helper()
	check := func(when string) {
		t.Helper()
		if got := p.hostPort(ctx, "dashboard", 9090, 1); got != addr {
			t.Errorf("%s: the dashboard moved from %s to %s", when, addr, got)
		}
		var want, replicas []string
		if err := eventually(60*time.Second, func() error {
			want = want[:0]
			for _, id := range p.containers(ctx, "dispatcher") {
				want = append(want, containerHostname(ctx, id))
			}
			slices.Sort(want)
			var err error
			replicas, _, err = dashboardView(ctx, addr)
			if err == nil && !slices.Equal(replicas, want) {
				err = fmt.Errorf("replicas %v, want %v", replicas, want)
			}
			return err
		}); err != nil {
			t.Errorf("%s: the dashboard at %s: %v", when, addr, err)
			return
		}
		t.Logf("%s: the dashboard at %s shows replicas %v", when, addr, replicas)
	}
	check("before")
	for _, n := range scales {
		p.mu.Lock()
		p.scale["dispatcher"] = n
		p.mu.Unlock()
		if _, err := p.run(ctx, "up", "-d", "--no-build", "--force-recreate", "--no-deps", "--scale", fmt.Sprintf("dispatcher=%d", n),
			"--wait", "--wait-timeout", "120", "dispatcher"); err != nil {
			t.Fatal(err)
		}
		p.refollow()
		check(fmt.Sprintf("dispatchers re-created at scale %d", n))
	}
}

// composeModelsChange adds a model to the mounted models file and restarts
// the workers (`docker compose restart worker`, the README's step): every
// replica announces it, without a rebuild.
func composeModelsChange(ctx context.Context, t *testing.T, p *composeProject, modelsDir string, adminJS jetstream.JetStream) {
	t.Helper()
	file := filepath.Join(modelsDir, "compose.yaml")
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	added := "\n  - name: added-by-operator\n    types: [classify]\n    executor: sim\n    sim:\n      latency: {dist: fixed, value: 5ms}\n"
	if err := os.WriteFile(file, append(data, added...), 0o644); err != nil {
		t.Fatal(err)
	}
	p.must(ctx, "restart", "worker")
	p.refollow()
	workers := len(p.containers(ctx, "worker"))
	if err := eventually(90*time.Second, func() error {
		kv, err := adminJS.KeyValue(ctx, topology.BucketNodes)
		if err != nil {
			return err
		}
		keys, err := kv.Keys(ctx)
		if err != nil {
			return err
		}
		with := 0
		for _, k := range keys {
			e, err := kv.Get(ctx, k)
			if err != nil {
				continue
			}
			var hb protocol.Heartbeat
			if json.Unmarshal(e.Value(), &hb) == nil && slices.ContainsFunc(hb.Models, func(m protocol.ModelInfo) bool { return m.Name == "added-by-operator" }) {
				with++
			}
		}
		if with != workers {
			return fmt.Errorf("%d of %d worker replicas announce the added model", with, workers)
		}
		return nil
	}); err != nil {
		t.Errorf("models file changed, docker compose restart worker: %v", err)
	} else {
		t.Logf("models file changed, docker compose restart worker: all %d replicas announce added-by-operator, no rebuild", workers)
	}
}

// copyModels copies deployments/models into a directory the workers'
// user (uid 10001) can read, for the project to mount.
func copyModels(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "models")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	src := repoPath(t, "deployments/models")
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		mode := os.FileMode(0o644)
		if fi, _ := e.Info(); fi != nil && fi.Mode()&0o111 != 0 {
			mode = 0o755
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), b, mode); err != nil {
			t.Fatal(err)
		}
	}
	// t.TempDir's directories are 0700: open the path to the workers' user.
	for d := dir; d != os.TempDir() && d != "/" && strings.HasPrefix(d, os.TempDir()); d = filepath.Dir(d) {
		_ = os.Chmod(d, 0o755)
	}
	return dir
}

package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/shared/natstest"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

func TestNodes(t *testing.T) {
	t.Parallel()
	srv := natstest.New(t)
	code, out, _ := cli(t, srv.URL, "", "nodes")
	if code != exitOK || !strings.Contains(out, "no live nodes") {
		t.Fatalf("no bucket: code %d, out %q", code, out)
	}
	kv, err := topology.EnsureNodesBucket(tctx(t), srv.JS, topology.Config{Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}
	if code, out, _ := cli(t, srv.URL, "", "nodes"); code != exitOK || !strings.Contains(out, "no live nodes") {
		t.Fatalf("empty bucket: code %d, out %q", code, out)
	}
	now := time.Now()
	put := func(key string, v any) {
		data, _ := json.Marshal(v)
		if _, err := kv.Put(tctx(t), key, data); err != nil {
			t.Fatal(err)
		}
	}
	put("gpu-1", protocol.Heartbeat{Node: "gpu-1", Host: "3f2a9c1b7d4e", Capacity: 8, InFlight: 3, SentAt: now,
		Models: []protocol.ModelInfo{{Name: "tesseract", Types: []string{"ocr"}}, {Name: "bert", Types: []string{"classify", "ner"}}}})
	put("cpu-2", protocol.Heartbeat{Node: "cpu-2", Host: "bad\x1b[2Jname", Capacity: 2, Draining: true, SentAt: now,
		Models:  []protocol.ModelInfo{{Name: "tiny", Types: []string{"echo"}}},
		Unready: []protocol.UnreadyModel{{Name: "resnet", Reason: "GET http://triton:8000/v2/health/ready: 503"}}})
	if _, err := kv.Put(tctx(t), "broken", []byte("not json")); err != nil {
		t.Fatal(err)
	}
	code, out, errs := cli(t, srv.URL, "", "nodes")
	if code != exitOK {
		t.Fatalf("code %d, stderr %q", code, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 5 || !strings.HasPrefix(lines[0], "NODE") {
		t.Fatalf("table:\n%s", out)
	}
	if lines[4] != "cpu-2: model resnet not ready: GET http://triton:8000/v2/health/ready: 503" {
		t.Errorf("unready line %q", lines[4])
	}
	// Sorted by key: broken, cpu-2, gpu-1.
	if !strings.HasPrefix(lines[1], "broken") || !strings.Contains(lines[1], "invalid heartbeat") {
		t.Errorf("broken row %q", lines[1])
	}
	if !strings.HasPrefix(lines[2], "cpu-2") || !strings.Contains(lines[2], "draining") || !strings.Contains(lines[2], "tiny(echo)") {
		t.Errorf("cpu-2 row %q", lines[2])
	}
	// The host each node announces next to its id (issue 40); one that
	// cannot be shown (a terminal escape) is not.
	if f := strings.Fields(lines[2]); f[1] != "-" || strings.Contains(out, "\x1b") {
		t.Errorf("cpu-2 row %q: its undisplayable host must show as -", lines[2])
	}
	if f := strings.Fields(lines[0]); len(f) < 2 || f[0] != "NODE" || f[1] != "HOST" {
		t.Errorf("header %q: want HOST next to NODE", lines[0])
	}
	if f := strings.Fields(lines[3]); f[0] != "gpu-1" || f[1] != "3f2a9c1b7d4e" || f[2] != "tesseract(ocr)" || f[3] != "bert(classify,ner)" || f[4] != "8" || f[5] != "3" || f[len(f)-1] != "ready" {
		t.Errorf("gpu-1 row %q", lines[3])
	}
	code, out, _ = cli(t, srv.URL, "", "nodes", "-json")
	if code != exitOK || strings.Count(out, "\n") != 3 || !strings.Contains(out, `"capacity":8`) || !strings.Contains(out, `"error"`) {
		t.Errorf("-json: code %d, out %q", code, out)
	}
}

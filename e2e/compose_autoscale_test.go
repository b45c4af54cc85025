package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/dispatcher/autoscale"
	"github.com/mlsched/mlsched/dispatcher/autoscaler"
	"github.com/mlsched/mlsched/shared/client"
	"github.com/mlsched/mlsched/shared/topology"
)

// autoscaleModels replaces the compose workers' models with one slow
// model: 400 ms a task, 8 slots a replica, 20 tasks/s a replica at most.
const autoscaleModels = `models:
  - name: slow
    types: [classify]
    executor: sim
    sim:
      latency: {dist: fixed, value: 400ms}
      failure_rate: 0
`

// TestComposeAutoscale runs the autoscaler's compose backend (the compose
// CLI on the host, the admin's creds) against a real project: one worker,
// then 40 tasks/s of 400 ms (about 23 slots at ρ 0.7: 3 replicas or more)
// must scale the worker service up, and once the load is gone and the
// cooldown passed, back in to one; every task has exactly one result
// through the scale-in (the removed workers drain on SIGTERM).
func TestComposeAutoscale(t *testing.T) {
	requireCompose(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	p := newComposeProject(t, "mlsched-autoscale")
	modelsDir := copyModels(t)
	if err := os.WriteFile(filepath.Join(modelsDir, "compose.yaml"), []byte(autoscaleModels), 0o644); err != nil {
		t.Fatal(err)
	}
	p.env = append(p.env, "MLSCHED_MODELS_DIR="+modelsDir)
	p.makeSecrets(ctx)
	p.scale["worker"] = 1
	p.must(ctx, "up", "-d", "--build", "--wait", "--wait-timeout", "180", "--scale", "worker=1")
	p.followLogs()
	natsURL := "nats://" + p.hostPort(ctx, "nats", 4222, 1)
	admin := p.conn(natsURL, "admin.creds", nil)
	adminJS, _ := jetstream.New(admin)
	prod := p.conn(natsURL, "producer.creds", nil)
	js, _ := jetstream.New(prod)

	cooldown := 20 * time.Second
	be := &autoscaler.Compose{Project: p.name, Files: p.files, Dir: p.root, Env: p.env, Services: []string{"worker"}}
	as, err := autoscaler.New(autoscaler.Params{NC: admin, JS: adminJS, Backend: be, Log: zerolog.Nop(),
		Policy: autoscale.NewScaler(autoscale.ScalerParams{RateHalfLife: 4 * time.Second, Limits: func(string) autoscale.Limits {
			return autoscale.Limits{Min: 1, Max: 4, Cooldown: cooldown, DrainWithin: 10 * time.Second}
		}})})
	if err != nil {
		t.Fatal(err)
	}
	actx, stopScaler := context.WithCancel(ctx)
	scalerDone := make(chan error, 1)
	go func() { scalerDone <- as.Run(actx, 2*time.Second) }()
	defer func() { stopScaler(); <-scalerDone }()

	audit := newResultAudit()
	auditCons, err := js.OrderedConsumer(ctx, topology.StreamResults, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy})
	if err != nil {
		t.Fatal(err)
	}
	auditCC, err := auditCons.Consume(func(m jetstream.Msg) { audit.observe(m.Subject(), m.Data()) })
	if err != nil {
		t.Fatal(err)
	}
	defer auditCC.Stop()
	n := 1200 // 30 s at 40/s
	tasks := make([]chaosTask, n)
	ids := make([]string, n)
	for i := range tasks {
		ids[i] = fmt.Sprintf("as-%05d", i)
		tasks[i] = chaosTask{ID: ids[i], Type: "classify", Kind: kindGood, MsgID: ids[i]}
	}
	start := time.Now()
	prodErr := make(chan error, 1)
	go func() { prodErr <- (&chaosProducer{cl: client.New(js)}).run(ctx, tasks, 40, start) }()

	replicas := func() int { return len(p.containers(ctx, "worker")) }
	if err := eventually(45*time.Second, func() error {
		if n := replicas(); n < 3 {
			return fmt.Errorf("%d worker replicas; decisions:\n%s", n, autoscaler.Summary(as.Last()))
		}
		return nil
	}); err != nil {
		t.Fatalf("no scale-up under 40 tasks/s of 400 ms: %v", err)
	}
	upAt := time.Since(start)
	t.Logf("scaled up to %d replicas %.1fs after the load began: %s", replicas(), upAt.Seconds(), autoscaler.Summary(as.Last()))
	if err := <-prodErr; err != nil {
		t.Fatal(err)
	}
	if err := eventually(2*time.Minute, func() error {
		if got := audit.distinct(); got < n {
			return fmt.Errorf("%d of %d results", got, n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	loadEnd := time.Now()
	if err := eventually(cooldown+90*time.Second, func() error {
		if n := replicas(); n != 1 {
			return fmt.Errorf("%d worker replicas; decisions:\n%s", n, autoscaler.Summary(as.Last()))
		}
		return nil
	}); err != nil {
		t.Fatalf("no scale-in to the minimum after the load: %v", err)
	}
	t.Logf("back to 1 replica %.1fs after the last result (cooldown %s)", time.Since(loadEnd).Seconds(), cooldown)
	if dups := audit.duplicates(); len(dups) > 0 {
		t.Fatalf("duplicated results through the scale-in: %v", dups)
	}
	for _, id := range ids {
		if c := audit.countOf(id); c != 1 {
			t.Fatalf("task %s: %d results, want 1", id, c)
		}
	}
	ds, err := autoscaler.ReadDecisions(ctx, adminJS)
	if err != nil || len(ds) != 1 || ds[0].Pool != "worker" {
		t.Fatalf("published decisions: %+v (%v)", ds, err)
	}
}

// distinct is how many task ids have a result.
func (a *resultAudit) distinct() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.count)
}

// countOf is how many results task id has.
func (a *resultAudit) countOf(id string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.count[id]
}

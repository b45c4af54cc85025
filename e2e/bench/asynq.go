package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"

	"github.com/mlsched/mlsched/e2e/harness"
)

// ScenarioAsynq is the other job queue issue 46 compares mlsched's fast
// mode with: asynq (github.com/hibiken/asynq) on a redis-server of its own
// without persistence (no RDB snapshots, no AOF: as little durable as
// mlsched's fast mode). The same phases as the other scenarios: each task is
// one Enqueue (from asynqEnqueuers goroutines, as River's inserters), worked
// by one asynq server (Concurrency asynqConcurrency, TaskCheckInterval
// asynqCheckInterval so that an empty queue is polled as often as River's
// FetchCooldown) with a no-op handler. A task counts as complete when its
// handler returns: asynq then marks it done in Redis, one more round trip
// that this count does not wait for, so the figure slightly favours asynq.
const ScenarioAsynq = "asynq"

const (
	asynqEnqueuers     = 8
	asynqConcurrency   = 100
	asynqCheckInterval = 10 * time.Millisecond
	asynqTaskType      = "bench"
)

// runAsynq is the asynq scenario: redis-server, one asynq server working
// the tasks, and the same phases as the other scenarios.
func runAsynq(ctx context.Context, o Options, dir string) (Scenario, error) {
	res := Scenario{Name: ScenarioAsynq}
	g, err := harness.NewGroup(dir)
	if err != nil {
		return res, err
	}
	defer g.Stop()
	redis, err := g.StartRedis("redis")
	if err != nil {
		return res, err
	}
	opt := asynq.RedisClientOpt{Addr: redis.Addr, PoolSize: 4 * asynqEnqueuers}
	var tr atomic.Pointer[tracker]
	mux := asynq.NewServeMux()
	mux.HandleFunc(asynqTaskType, func(_ context.Context, t *asynq.Task) error {
		var a struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(t.Payload(), &a); err != nil {
			return fmt.Errorf("bench task: %w", err)
		}
		if tk := tr.Load(); tk != nil {
			tk.complete(a.ID, true, time.Now())
		}
		return nil
	})
	srv := asynq.NewServer(opt, asynq.Config{Concurrency: asynqConcurrency, TaskCheckInterval: asynqCheckInterval,
		LogLevel: asynq.WarnLevel})
	if err := srv.Start(mux); err != nil {
		return res, fmt.Errorf("asynq server: %w", err)
	}
	defer srv.Shutdown()
	client := asynq.NewClient(opt)
	defer client.Close()
	cpu := []procGroup{{Name: "redis-server", Pids: []int{redis.Pid()}}, {Name: "bench driver (asynq client and server)", Pids: []int{os.Getpid()}}}
	mem := []procGroup{{Name: "redis-server", Pids: []int{redis.Pid()}}}
	fmt.Fprintf(o.Progress, "   redis-server (no persistence) and an asynq server (Concurrency %d, TaskCheckInterval %v) ready\n",
		asynqConcurrency, asynqCheckInterval)
	payload := newPublisher(nil, o.Payload).payload
	phase := func(label, prefix string, n, rate int) (Phase, error) {
		t := newTracker(prefix, n, 0)
		tr.Store(t)
		cpu0 := sampleCPU(cpu)
		if err := asynqEnqueue(ctx, client, t, payload, rate); err != nil {
			return Phase{}, fmt.Errorf("%s: %w", label, err)
		}
		timeout := time.Minute + time.Duration(n)*time.Second/200
		select {
		case <-t.all:
		case <-time.After(timeout):
			return Phase{}, fmt.Errorf("%s: %d of %d tasks did not complete in %v", label, t.remaining.Load(), n, timeout)
		case <-ctx.Done():
			return Phase{}, ctx.Err()
		}
		p := t.phase(cpuDelta(cpu0, sampleCPU(cpu)))
		fmt.Fprintf(o.Progress, "   %-18s %7d tasks in %6.2fs: %8.0f tasks/s, p50 %7.2fms p99 %7.2fms, failed %d\n",
			label, n, p.Seconds, p.Throughput, p.Latency.P50, p.Latency.P99, p.Failed)
		return p, nil
	}
	if res.Warmup, err = phase("warmup", "w-", o.Warmup, 0); err != nil {
		return res, err
	}
	ms := newMemSampler(mem)
	ms.start()
	if res.Throughput, err = phase("throughput", "t-", o.Tasks, 0); err != nil {
		return res, err
	}
	if res.Latency, err = phase(fmt.Sprintf("latency at %d/s", o.Rate), "l-", o.LatencyTasks, o.Rate); err != nil {
		return res, err
	}
	res.Memory = ms.stop()
	res.PublishesPerTask = 1 // one enqueue
	return res, nil
}

// asynqEnqueue enqueues every task of t, one Enqueue each, from
// asynqEnqueuers goroutines taking the next index in turn; at rate tasks/s
// when rate > 0.
func asynqEnqueue(ctx context.Context, client *asynq.Client, t *tracker, payload string, rate int) error {
	var (
		next atomic.Int64
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs error
	)
	start := time.Now()
	for range asynqEnqueuers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= len(t.sent) || ctx.Err() != nil {
					return
				}
				if rate > 0 {
					if d := time.Until(start.Add(time.Duration(int64(i) * int64(time.Second) / int64(rate)))); d >= time.Millisecond {
						time.Sleep(d)
					}
				}
				id := t.id(i)
				body, _ := json.Marshal(struct {
					ID      string `json:"id"`
					Payload string `json:"payload"`
				}{id, payload})
				t.sent[i].Store(time.Now().UnixNano())
				if _, err := client.EnqueueContext(ctx, asynq.NewTask(asynqTaskType, body), asynq.MaxRetry(0)); err != nil {
					mu.Lock()
					errs = errors.Join(errs, fmt.Errorf("enqueue %s: %w", id, err))
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	return errs
}

package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/mlsched/mlsched/e2e/harness"
)

// ScenarioRiver is the job queue users would pick instead of mlsched: River
// (github.com/riverqueue/river) on PostgreSQL from the distribution, with
// fsync and synchronous_commit on, as durable as mlsched's durable mode.
// The same phases as the other scenarios: each job is one Insert (from
// riverInserters goroutines), worked by one client (MaxWorkers 1000,
// FetchCooldown 10ms) with a no-op worker, and is complete when River has
// stored its completion (the job-completed event). Issue 24 compares
// mlsched's durable throughput with it in the same run.
const ScenarioRiver = "river"

// riverInserters is how many goroutines insert, one job per Insert.
const riverInserters = 8

// PostgresBinDir is where Debian's PostgreSQL 15 lives; MLSCHED_PG_BIN
// overrides it.
const PostgresBinDir = "/usr/lib/postgresql/15/bin"

type riverArgs struct {
	ID      string `json:"id"`
	Payload string `json:"payload"`
}

func (riverArgs) Kind() string { return "bench" }

type riverWorker struct {
	river.WorkerDefaults[riverArgs]
}

func (riverWorker) Work(context.Context, *river.Job[riverArgs]) error { return nil }

// postgres is a PostgreSQL server of its own on a free loopback port.
type postgres struct {
	proc *harness.Process
	dir  string // data directory's parent, removed at stop
	url  string
}

// startPostgres initdb's a cluster in a fresh directory and starts it with
// fsync and synchronous_commit on. As root it runs as the postgres user
// (PostgreSQL refuses to run as root).
func startPostgres(ctx context.Context, g *harness.Group) (*postgres, error) {
	bin := PostgresBinDir
	if v := os.Getenv("MLSCHED_PG_BIN"); v != "" {
		bin = v
	}
	if _, err := os.Stat(filepath.Join(bin, "postgres")); err != nil {
		return nil, fmt.Errorf("postgres not found in %s (apt-get install postgresql, or set MLSCHED_PG_BIN): %w", bin, err)
	}
	// Its own directory under the system's temporary one: the postgres user
	// must reach it, which the group's directory may not allow.
	dir, err := os.MkdirTemp("", "mlsched-bench-pg-*")
	if err != nil {
		return nil, err
	}
	pg := &postgres{dir: dir}
	var wrap []string // as root: setpriv to the postgres user
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("running as root, and no postgres user to run PostgreSQL as: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		wrap = []string{"setpriv", "--reuid=" + u.Uid, "--regid=" + u.Gid, "--init-groups", "--"}
	}
	data := filepath.Join(dir, "data")
	initdb := append(append([]string{}, wrap...), filepath.Join(bin, "initdb"), "-D", data, "-U", "bench", "-A", "trust", "-E", "UTF8", "--no-sync")
	if out, err := exec.CommandContext(ctx, initdb[0], initdb[1:]...).CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("initdb: %w: %s", err, out)
	}
	port, err := harness.FreePort()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	args := []string{"-D", data, "-p", strconv.Itoa(port), "-k", dir, "-c", "listen_addresses=127.0.0.1",
		"-c", "fsync=on", "-c", "synchronous_commit=on", "-c", "max_connections=100"}
	path := filepath.Join(bin, "postgres")
	if len(wrap) > 0 {
		args = append(append(wrap[1:], path), args...)
		path, err = exec.LookPath(wrap[0])
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	p, err := g.Process("postgres", path, args, nil)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	pg.proc = p
	pg.url = fmt.Sprintf("postgres://bench@127.0.0.1:%d/postgres?sslmode=disable&pool_max_conns=%d", port, 4*riverInserters)
	err = p.StartReady(func(ctx context.Context) error {
		pool, err := pgxpool.New(ctx, pg.url)
		if err != nil {
			return err
		}
		defer pool.Close()
		return pool.Ping(ctx)
	})
	if err != nil {
		pg.stop()
		return nil, fmt.Errorf("postgres: %w", err)
	}
	return pg, nil
}

func (pg *postgres) stop() {
	if pg.proc != nil {
		_ = pg.proc.Signal(syscall.SIGINT) // fast shutdown
		select {
		case <-pg.proc.Exited():
		case <-time.After(15 * time.Second):
			pg.proc.Kill()
		}
	}
	os.RemoveAll(pg.dir)
}

// runRiver is the river scenario: Postgres, River's migrations, one client
// working the jobs, and the same phases as the other scenarios.
func runRiver(ctx context.Context, o Options, dir string) (Scenario, error) {
	res := Scenario{Name: ScenarioRiver}
	g, err := harness.NewGroup(dir)
	if err != nil {
		return res, err
	}
	defer g.Stop()
	pg, err := startPostgres(ctx, g)
	if err != nil {
		return res, err
	}
	defer pg.stop()
	pool, err := pgxpool.New(ctx, pg.url)
	if err != nil {
		return res, err
	}
	defer pool.Close()
	driver := riverpgxv5.New(pool)
	migrator, err := rivermigrate.New(driver, nil)
	if err != nil {
		return res, err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return res, fmt.Errorf("river migrations: %w", err)
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, &riverWorker{})
	client, err := river.NewClient(driver, &river.Config{
		Queues:        map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 1000}},
		FetchCooldown: 10 * time.Millisecond,
		Workers:       workers,
		Logger:        slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return res, err
	}
	n := max(o.Warmup, o.Tasks, o.LatencyTasks)
	events, cancel := client.SubscribeConfig(&river.SubscribeConfig{Kinds: []river.EventKind{river.EventKindJobCompleted,
		river.EventKindJobFailed, river.EventKindJobCancelled}, ChanSize: n + 1000})
	defer cancel()
	var tr atomic.Pointer[tracker]
	evDone := make(chan struct{})
	go func() {
		defer close(evDone)
		for ev := range events {
			if t := tr.Load(); t != nil && ev.Job != nil {
				// The args are JSON; the id is the tracker's prefix and index.
				var a struct {
					ID string `json:"id"`
				}
				if err := json.Unmarshal(ev.Job.EncodedArgs, &a); err == nil {
					t.complete(a.ID, ev.Kind == river.EventKindJobCompleted, time.Now())
				}
			}
		}
	}()
	if err := client.Start(ctx); err != nil {
		return res, err
	}
	defer func() {
		sctx, c := context.WithTimeout(context.Background(), 15*time.Second)
		defer c()
		_ = client.Stop(sctx)
	}()
	cpu := []procGroup{{Name: "postgres (postmaster only, not its backends)", Pids: []int{pg.proc.Pid()}}, {Name: "bench driver (river)", Pids: []int{os.Getpid()}}}
	mem := []procGroup{{Name: "postgres", Pids: []int{pg.proc.Pid()}}}
	fmt.Fprintf(o.Progress, "   postgres (fsync on, synchronous_commit on) and a River client (MaxWorkers 1000, FetchCooldown 10ms) ready\n")
	payload := newPublisher(nil, o.Payload).payload
	phase := func(label, prefix string, n, rate int) (Phase, error) {
		t := newTracker(prefix, n, 0)
		tr.Store(t)
		cpu0 := sampleCPU(cpu)
		if err := riverInsert(ctx, client, t, payload, rate); err != nil {
			return Phase{}, fmt.Errorf("%s: %w", label, err)
		}
		timeout := time.Minute + time.Duration(n)*time.Second/200
		select {
		case <-t.all:
		case <-time.After(timeout):
			return Phase{}, fmt.Errorf("%s: %d of %d jobs did not complete in %v", label, t.remaining.Load(), n, timeout)
		case <-ctx.Done():
			return Phase{}, ctx.Err()
		}
		p := t.phase(cpuDelta(cpu0, sampleCPU(cpu)))
		fmt.Fprintf(o.Progress, "   %-18s %7d jobs in %6.2fs: %8.0f jobs/s, p50 %7.2fms p99 %7.2fms, failed %d\n",
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
	res.PublishesPerTask = 1 // one insert; the completion is batched by River
	return res, nil
}

// riverInsert inserts every job of t, one Insert each, from riverInserters
// goroutines taking the next index in turn; at rate jobs/s when rate > 0.
func riverInsert(ctx context.Context, client *river.Client[pgx.Tx], t *tracker, payload string, rate int) error {
	var (
		next atomic.Int64
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs error
	)
	start := time.Now()
	for range riverInserters {
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
				t.sent[i].Store(time.Now().UnixNano())
				if _, err := client.Insert(ctx, riverArgs{ID: id, Payload: payload}, nil); err != nil {
					mu.Lock()
					errs = errors.Join(errs, fmt.Errorf("insert %s: %w", id, err))
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	return errs
}

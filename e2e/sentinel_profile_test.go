package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.yaml.in/yaml/v3"

	"github.com/mlsched/mlsched/e2e/harness"
	"github.com/mlsched/mlsched/shared/redisconn"
	"github.com/mlsched/mlsched/shared/redistest"
)

// The compose profile "sentinel" (redis-1, redis-2, sentinel-1..3,
// dispatcher-sentinel) as written, then run for real: the configuration
// files of deployments/redis, with host names and ports rewritten to free
// loopback ones, start redis-server and three sentinels; a client built by
// redisconn from dispatcher-sentinel's MLSCHED_REDIS_URL (its hosts
// rewritten the same way) writes to redis-1; after a failover the same
// client writes to redis-2, and the sentinels have recorded the new roles in
// the nodes' configuration files, which is why compose runs them from
// writable copies. Docker is not needed.
func TestRedisSentinelProfile(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(repoPath(t, "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Services map[string]composeService `yaml:"services"`
		Volumes  map[string]any            `yaml:"volumes"`
	}
	if err := yaml.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	service := func(name string) composeService {
		t.Helper()
		s, ok := f.Services[name]
		if !ok {
			t.Fatalf("docker-compose.yml has no %s service", name)
		}
		if !slices.Contains(s.Profiles, "sentinel") {
			t.Errorf("%s is not in the sentinel profile: %v", name, s.Profiles)
		}
		return s
	}
	// Each instance runs from a copy of its template in its own volume.
	checkInstance := func(name, template, copyPath, run string) {
		t.Helper()
		s := service(name)
		if s.Hostname != name {
			t.Errorf("%s: hostname %q; the instances announce their host name, which must be the service name", name, s.Hostname)
		}
		if !slices.Contains(s.Volumes, "./deployments/redis:/etc/redis:ro") {
			t.Errorf("%s does not mount deployments/redis: %v", name, s.Volumes)
		}
		vol := name + "-data"
		if !slices.Contains(s.Volumes, vol+":/data") {
			t.Errorf("%s has no volume %s on /data: %v", name, vol, s.Volumes)
		}
		if _, ok := f.Volumes[vol]; !ok {
			t.Errorf("volume %s is not declared", vol)
		}
		cmd := strings.Join(s.Command, " ")
		if !strings.Contains(cmd, "[ -f "+copyPath+" ] || ") || !strings.Contains(cmd, "cp /etc/redis/"+template+" "+copyPath) ||
			!strings.Contains(cmd, "exec docker-entrypoint.sh "+run) {
			t.Errorf("%s command %q: want it to copy /etc/redis/%s to %s once and run %q", name, cmd, template, copyPath, run)
		}
	}
	checkInstance("redis-1", "redis-1.conf", "/data/redis.conf", "redis-server /data/redis.conf")
	checkInstance("redis-2", "redis-2.conf", "/data/redis.conf", "redis-server /data/redis.conf")
	var sentinelHosts []string
	for i := 1; i <= 3; i++ {
		name := fmt.Sprintf("sentinel-%d", i)
		checkInstance(name, "sentinel.conf", "/data/sentinel.conf", "redis-server /data/sentinel.conf --sentinel")
		if cmd := strings.Join(service(name).Command, " "); !strings.Contains(cmd, `echo "sentinel announce-ip $$(hostname)" >> /data/sentinel.conf`) {
			t.Errorf("%s does not announce its host name: %q", name, cmd)
		}
		sentinelHosts = append(sentinelHosts, name+":26379")
	}

	sentinelConf := readRepoFile(t, "deployments/redis/sentinel.conf")
	monitor := regexp.MustCompile(`(?m)^sentinel monitor (\S+) (\S+) (\d+) (\d+)$`).FindStringSubmatch(sentinelConf)
	if monitor == nil {
		t.Fatal("deployments/redis/sentinel.conf has no `sentinel monitor NAME HOST PORT QUORUM` line")
	}
	if monitor[2] != "redis-1" || monitor[3] != "6379" || monitor[4] != "2" {
		t.Errorf("sentinel monitor %s %s %s: want redis-1 6379 2", monitor[2], monitor[3], monitor[4])
	}
	d := service("dispatcher-sentinel")
	rawURL := d.Environment["MLSCHED_REDIS_URL"]
	o, err := redisconn.Parse(redisconn.Config{URL: rawURL})
	if err != nil {
		t.Fatalf("dispatcher-sentinel MLSCHED_REDIS_URL: %v", err)
	}
	if o.Kind != redisconn.Sentinel || o.Failover.MasterName != monitor[1] || o.Failover.DB != 0 ||
		!slices.Equal(o.Failover.SentinelAddrs, sentinelHosts) {
		t.Errorf("dispatcher-sentinel MLSCHED_REDIS_URL %q: kind %s, master %q, db %d, sentinels %v; want sentinel, %q, 0, %v",
			rawURL, o.Kind, o.Failover.MasterName, o.Failover.DB, o.Failover.SentinelAddrs, monitor[1], sentinelHosts)
	}
	if t.Failed() {
		return
	}

	if _, err := exec.LookPath(redistest.Binary); err != nil {
		t.Skip("redis-server is not installed (`make test` installs it when run as root): the profile was parsed but not run")
	}
	// Loopback stands in for the compose network: every host name becomes
	// localhost (so the sentinels really resolve names) and every port a
	// free one.
	dir := t.TempDir()
	var procs []*redistest.Process
	t.Cleanup(func() {
		for _, p := range procs {
			p.Stop()
		}
	})
	var redis1Port int
	start := func(name, template string, args []string, rewrite func(conf string, port int) string) (*redistest.Process, string) {
		t.Helper()
		text := readRepoFile(t, filepath.Join("deployments/redis", template))
		idir := filepath.Join(dir, name)
		if err := os.MkdirAll(idir, 0o755); err != nil {
			t.Fatal(err)
		}
		conf := filepath.Join(idir, template)
		var lastErr error
		for try := 0; try < 5; try++ { // a free port may be taken before it is bound
			port, err := redistest.FreePort()
			if err != nil {
				t.Fatal(err)
			}
			out := rewrite(localConf(text, idir, port, redis1Port), port)
			if err := os.WriteFile(conf, []byte(out), 0o644); err != nil {
				t.Fatal(err)
			}
			p, err := redistest.StartConfig(redistest.Binary, conf, idir, port, args...)
			if err == nil {
				procs = append(procs, p)
				return p, conf
			}
			lastErr = err
		}
		t.Fatalf("%s: %v", name, lastErr)
		return nil, ""
	}
	same := func(conf string, _ int) string { return conf }
	r1, r1conf := start("redis-1", "redis-1.conf", nil, same)
	redis1Port = r1.Port
	r2, r2conf := start("redis-2", "redis-2.conf", nil, same)
	var sentinels []string
	replace := []string{}
	for i := 1; i <= 3; i++ {
		s, _ := start(fmt.Sprintf("sentinel-%d", i), "sentinel.conf", []string{"--sentinel"}, func(conf string, _ int) string {
			return conf + "sentinel announce-ip localhost\n" // what compose appends, with the host name
		})
		sentinels = append(sentinels, s.Addr)
		replace = append(replace, fmt.Sprintf("sentinel-%d:26379", i), net.JoinHostPort("localhost", strconv.Itoa(s.Port)))
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	master := monitor[1]
	waitSentinels := func(wantMaster int) {
		t.Helper()
		err := harness.WaitFor(ctx, func() error {
			for _, a := range sentinels {
				sc := redis.NewSentinelClient(&redis.Options{Addr: a, MaxRetries: -1})
				addr, err1 := sc.GetMasterAddrByName(ctx, master).Result()
				reps, err2 := sc.Replicas(ctx, master).Result()
				sens, err3 := sc.Sentinels(ctx, master).Result()
				sc.Close()
				if err := errors.Join(err1, err2, err3); err != nil {
					return fmt.Errorf("sentinel %s: %w", a, err)
				}
				if len(addr) != 2 || addr[1] != strconv.Itoa(wantMaster) {
					return fmt.Errorf("sentinel %s names master %v, want port %d", a, addr, wantMaster)
				}
				if len(reps) < 1 || len(sens) < 2 {
					return fmt.Errorf("sentinel %s sees %d replicas and %d other sentinels", a, len(reps), len(sens))
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("sentinels: %v", err)
		}
	}
	waitSentinels(r1.Port)

	// The compose URL, its hosts rewritten: reaches the master, redis-1.
	localURL := strings.NewReplacer(replace...).Replace(rawURL)
	client, err := redisconn.Open(redisconn.Config{URL: localURL, ClientName: "profile-test"})
	if err != nil {
		t.Fatalf("open %s: %v", localURL, err)
	}
	defer client.Close()
	writesTo := func(want int, value string) error {
		if err := client.Set(ctx, "mlsched:profile-test", value, 0).Err(); err != nil {
			return err
		}
		info, err := client.Info(ctx, "server", "replication").Result()
		if err != nil {
			return err
		}
		if !strings.Contains(info, fmt.Sprintf("tcp_port:%d\r\n", want)) || !strings.Contains(info, "role:master") {
			return fmt.Errorf("the client writes to a server other than the master on port %d: %s", want, firstLines(info, "tcp_port:", "role:"))
		}
		return nil
	}
	if err := harness.WaitFor(ctx, func() error { return writesTo(r1.Port, "before") }); err != nil {
		t.Fatalf("through %s: %v", localURL, err)
	}
	replica := redis.NewClient(&redis.Options{Addr: r2.Addr})
	defer replica.Close()
	if err := harness.WaitFor(ctx, func() error {
		v, err := replica.Get(ctx, "mlsched:profile-test").Result()
		if err != nil || v != "before" {
			return fmt.Errorf("redis-2 has %q, %v", v, err)
		}
		return nil
	}); err != nil {
		t.Fatalf("redis-2 does not replicate redis-1: %v", err)
	}

	// A failover: the client follows, the value survives, and the roles
	// are written to the nodes' configuration files.
	sc := redis.NewSentinelClient(&redis.Options{Addr: sentinels[0]})
	defer sc.Close()
	if err := sc.Failover(ctx, master).Err(); err != nil {
		t.Fatalf("SENTINEL FAILOVER: %v", err)
	}
	waitSentinels(r2.Port)
	if err := harness.WaitFor(ctx, func() error { return writesTo(r2.Port, "after") }); err != nil {
		t.Fatalf("after the failover: %v", err)
	}
	if err := harness.WaitFor(ctx, func() error {
		c1, err1 := os.ReadFile(r1conf)
		c2, err2 := os.ReadFile(r2conf)
		if err := errors.Join(err1, err2); err != nil {
			return err
		}
		if !regexp.MustCompile(fmt.Sprintf(`(?m)^replicaof \S+ %d$`, r2.Port)).Match(c1) {
			return fmt.Errorf("redis-1's configuration does not make it a replica of redis-2")
		}
		if regexp.MustCompile(`(?m)^replicaof `).Match(c2) {
			return fmt.Errorf("redis-2's configuration still makes it a replica")
		}
		return nil
	}); err != nil {
		t.Fatalf("roles not recorded: %v", err)
	}
}

// localConf rewrites a deployments/redis configuration for loopback: its
// own port, its directory, listening on loopback only, every host name
// localhost and redis-1's port 6379 replaced by redis1Port.
func localConf(conf, dir string, port, redis1Port int) string {
	var out []string
	for _, line := range strings.Split(conf, "\n") {
		fields := strings.Fields(line)
		switch {
		case len(fields) == 2 && fields[0] == "port":
			line = fmt.Sprintf("port %d\nbind 127.0.0.1 -::1", port)
		case len(fields) == 2 && fields[0] == "dir":
			line = "dir " + dir
		default:
			line = strings.ReplaceAll(line, "redis-1 6379", fmt.Sprintf("redis-1 %d", redis1Port))
			line = regexp.MustCompile(`\b(redis|sentinel)-\d\b`).ReplaceAllString(line, "localhost")
		}
		out = append(out, line)
	}
	return strings.Join(out, "\n")
}

func readRepoFile(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(repoPath(t, rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// firstLines picks the INFO lines with the given prefixes, for messages.
func firstLines(info string, prefixes ...string) string {
	var out []string
	for _, l := range strings.Split(info, "\r\n") {
		for _, p := range prefixes {
			if strings.HasPrefix(l, p) {
				out = append(out, l)
			}
		}
	}
	return strings.Join(out, " ")
}

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
	"github.com/mlsched/mlsched/shared/authconf"
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

	// Authentication: every instance is given the files `make secrets`
	// writes, and adds its password lines from the mounted file.
	for name, want := range map[string][]string{
		"redis-1": {authconf.RedisACLFile, authconf.RedisPasswordFile}, "redis-2": {authconf.RedisACLFile, authconf.RedisPasswordFile},
		"sentinel-1": {authconf.SentinelACLFile, authconf.RedisPasswordFile}, "sentinel-2": {authconf.SentinelACLFile, authconf.RedisPasswordFile},
		"sentinel-3": {authconf.SentinelACLFile, authconf.RedisPasswordFile}, "dispatcher-sentinel": {"dispatcher.nk", authconf.RedisPasswordFile},
	} {
		s := service(name)
		got := slices.Sorted(slices.Values(s.Secrets))
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("%s has secrets %v, want %v", name, got, want)
		}
		cmd := strings.Join(s.Command, " ")
		acl := authconf.RedisACLFile
		if strings.HasPrefix(name, "sentinel-") {
			acl = authconf.SentinelACLFile
		}
		if name != "dispatcher-sentinel" && (!strings.Contains(cmd, "--aclfile /run/secrets/"+acl) || !strings.Contains(cmd, "/run/secrets/"+authconf.RedisPasswordFile)) {
			t.Errorf("%s command %q: want --aclfile /run/secrets/%s and its password lines from /run/secrets/%s", name, cmd, acl, authconf.RedisPasswordFile)
		}
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
		!slices.Equal(o.Failover.SentinelAddrs, sentinelHosts) || o.Failover.Username != authconf.RedisUser ||
		d.Environment["MLSCHED_REDIS_PASSWORD_FILE"] != "/run/secrets/"+authconf.RedisPasswordFile {
		t.Errorf("dispatcher-sentinel MLSCHED_REDIS_URL %q (password file %q): kind %s, master %q, db %d, sentinels %v, user %q; want sentinel, %q, 0, %v, %q with /run/secrets/%s",
			rawURL, d.Environment["MLSCHED_REDIS_PASSWORD_FILE"], o.Kind, o.Failover.MasterName, o.Failover.DB, o.Failover.SentinelAddrs, o.Failover.Username,
			monitor[1], sentinelHosts, authconf.RedisUser, authconf.RedisPasswordFile)
	}
	if t.Failed() {
		return
	}

	if _, err := exec.LookPath(redistest.Binary); err != nil {
		t.Skip("redis-server is not installed (`make test` installs it when run as root): the profile was parsed but not run")
	}
	// Loopback stands in for the compose network: every host name becomes
	// localhost (so the sentinels really resolve names) and every port a
	// free one. Secrets as `make secrets` writes them.
	dir := t.TempDir()
	secrets := filepath.Join(dir, "secrets")
	makeSecrets(t, secrets)
	pwb, err := os.ReadFile(filepath.Join(secrets, authconf.RedisPasswordFile))
	if err != nil {
		t.Fatal(err)
	}
	pw := strings.TrimSpace(string(pwb))
	var procs []*redistest.Process
	t.Cleanup(func() {
		for _, p := range procs {
			p.Stop()
		}
	})
	var redis1Port int
	// start runs the service's compose command: its shell part (copy the
	// template, add the password lines) with sh, /data, /etc/redis and
	// /run/secrets pointing at local directories, then redis-server with
	// the command's arguments.
	start := func(name, template string) *redistest.Process {
		t.Helper()
		script := strings.ReplaceAll(service(name).Command[2], "$$", "$") // compose's escape
		script = strings.ReplaceAll(script, "$(hostname)", "localhost")
		shell, run, ok := strings.Cut(script, "exec docker-entrypoint.sh redis-server ")
		if !ok {
			t.Fatalf("%s: no `exec docker-entrypoint.sh redis-server` in %q", name, script)
		}
		text := readRepoFile(t, filepath.Join("deployments/redis", template))
		etc, data := filepath.Join(dir, name, "etc"), filepath.Join(dir, name, "data")
		for _, d := range []string{etc, data} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		paths := strings.NewReplacer("/data/", data+"/", "/etc/redis/", etc+"/", "/run/secrets/", secrets+"/")
		shell = paths.Replace(shell)
		args := strings.Fields(paths.Replace(run))
		var lastErr error
		for try := 0; try < 5; try++ { // a free port may be taken before it is bound
			port, err := redistest.FreePort()
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(etc, template), []byte(localConf(text, data, port, redis1Port)), 0o644); err != nil {
				t.Fatal(err)
			}
			_ = os.Remove(args[0]) // a first start: the command copies the template
			if out, err := exec.Command("sh", "-c", shell).CombinedOutput(); err != nil {
				t.Fatalf("%s: the shell part of its compose command: %v: %s", name, err, out)
			}
			conf, err := os.ReadFile(args[0])
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(conf), pw) {
				t.Fatalf("%s: its compose command did not add the password lines to %s", name, args[0])
			}
			p, err := redistest.StartConfig(redistest.Binary, args[0], data, port, args[1:]...)
			if err == nil {
				procs = append(procs, p)
				return p
			}
			lastErr = err
		}
		t.Fatalf("%s: %v", name, lastErr)
		return nil
	}
	r1 := start("redis-1", "redis-1.conf")
	redis1Port = r1.Port
	r1conf := filepath.Join(dir, "redis-1", "data", "redis.conf")
	r2 := start("redis-2", "redis-2.conf")
	r2conf := filepath.Join(dir, "redis-2", "data", "redis.conf")
	var sentinels []string
	replace := []string{}
	for i := 1; i <= 3; i++ {
		s := start(fmt.Sprintf("sentinel-%d", i), "sentinel.conf")
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
				// as the dispatcher's user: what go-redis's failover client asks
				sc := redis.NewSentinelClient(&redis.Options{Addr: a, MaxRetries: -1, Username: authconf.RedisUser, Password: pw})
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
	client, err := redisconn.Open(redisconn.Config{URL: localURL, ClientName: "profile-test",
		PasswordFile: filepath.Join(secrets, authconf.RedisPasswordFile)})
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
	// redis-2 replicates (logged in as mlsched-replica: anonymous
	// clients may not PSYNC).
	replicates := func(p *redistest.Process, want string) error {
		c := redis.NewClient(&redis.Options{Addr: p.Addr, MaxRetries: -1, Username: authconf.RedisUser, Password: pw})
		defer c.Close()
		return harness.WaitFor(ctx, func() error {
			v, err := c.Get(ctx, "mlsched:profile-test").Result()
			if err != nil || v != want {
				return fmt.Errorf("port %d has %q, %v", p.Port, v, err)
			}
			return nil
		})
	}
	if err := replicates(r2, "before"); err != nil {
		t.Fatalf("redis-2 does not replicate redis-1: %v", err)
	}

	// Anonymous clients may PING (health checks) and nothing else: on the
	// data nodes, and on the sentinels; the dispatcher's user may not
	// reconfigure the sentinels.
	refused := func(err error, what string) {
		t.Helper()
		if err == nil || !(strings.Contains(err.Error(), "NOPERM") || strings.Contains(err.Error(), "NOAUTH")) {
			t.Errorf("%s: %v, want NOPERM or NOAUTH", what, err)
		}
	}
	for _, p := range []*redistest.Process{r1, r2} {
		anon := redis.NewClient(&redis.Options{Addr: p.Addr, MaxRetries: -1})
		if err := anon.Ping(ctx).Err(); err != nil {
			t.Errorf("anonymous PING on port %d (the health check): %v", p.Port, err)
		}
		refused(anon.Get(ctx, "mlsched:profile-test").Err(), fmt.Sprintf("anonymous GET on port %d", p.Port))
		refused(anon.Set(ctx, "mlsched:profile-test", "anon", 0).Err(), fmt.Sprintf("anonymous SET on port %d", p.Port))
		anon.Close()
		wrong := redis.NewClient(&redis.Options{Addr: p.Addr, MaxRetries: -1, Username: authconf.RedisUser, Password: "wrong"})
		if err := wrong.Ping(ctx).Err(); err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
			t.Errorf("wrong password on port %d: %v, want WRONGPASS", p.Port, err)
		}
		wrong.Close()
	}
	anonSentinel := redis.NewSentinelClient(&redis.Options{Addr: sentinels[1], MaxRetries: -1})
	if err := anonSentinel.Ping(ctx).Err(); err != nil {
		t.Errorf("anonymous PING on a sentinel (the health check): %v", err)
	}
	refused(anonSentinel.GetMasterAddrByName(ctx, master).Err(), "anonymous SENTINEL GET-MASTER-ADDR-BY-NAME")
	anonSentinel.Close()
	userSentinel := redis.NewSentinelClient(&redis.Options{Addr: sentinels[1], MaxRetries: -1, Username: authconf.RedisUser, Password: pw})
	refused(userSentinel.Failover(ctx, master).Err(), authconf.RedisUser+" SENTINEL FAILOVER")
	refused(userSentinel.Set(ctx, master, "down-after-milliseconds", "1").Err(), authconf.RedisUser+" SENTINEL SET")
	userSentinel.Close()

	// A failover: the client follows, the value survives, and the roles
	// are written to the nodes' configuration files.
	// (an operator's command, as the sentinels' own user)
	sc := redis.NewSentinelClient(&redis.Options{Addr: sentinels[0], Username: authconf.RedisSentinelUser, Password: pw})
	defer sc.Close()
	if err := sc.Failover(ctx, master).Err(); err != nil {
		t.Fatalf("SENTINEL FAILOVER: %v", err)
	}
	waitSentinels(r2.Port)
	if err := harness.WaitFor(ctx, func() error { return writesTo(r2.Port, "after") }); err != nil {
		t.Fatalf("after the failover: %v", err)
	}
	if err := replicates(r1, "after"); err != nil { // redis-1 logs in to its new master
		t.Fatalf("redis-1 does not replicate redis-2 after the failover: %v", err)
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

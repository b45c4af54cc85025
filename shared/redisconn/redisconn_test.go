package redisconn_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/mlsched/mlsched/shared/redisconn"
	"github.com/mlsched/mlsched/shared/redistest"
)

func TestParseSingle(t *testing.T) {
	o, err := redisconn.Parse(redisconn.Config{URL: "redis://u:secret@10.0.0.1:7000/3?dial_timeout=2s", ClientName: "d1"})
	if err != nil {
		t.Fatal(err)
	}
	s := o.Single
	if o.Kind != redisconn.Single || s.Addr != "10.0.0.1:7000" || s.DB != 3 || s.Username != "u" ||
		s.Password != "secret" || s.DialTimeout.Seconds() != 2 || s.ClientName != "d1" || s.TLSConfig != nil {
		t.Fatalf("options = %+v", s)
	}
	o, err = redisconn.Parse(redisconn.Config{URL: "rediss://h:6380"})
	if err != nil || o.Single.TLSConfig == nil || o.Single.TLSConfig.ServerName != "h" {
		t.Fatalf("rediss: %+v, %v", o, err)
	}
}

func TestParseSentinel(t *testing.T) {
	o, err := redisconn.Parse(redisconn.Config{URL: "redis+sentinel://:pw@s1:26379,s2:26380,[::1]:26381/mymaster/2?read_timeout=3s", ClientName: "d1"})
	if err != nil {
		t.Fatal(err)
	}
	f := o.Failover
	if o.Kind != redisconn.Sentinel || f.MasterName != "mymaster" || f.DB != 2 || f.ReadTimeout.Seconds() != 3 ||
		f.Password != "pw" || f.SentinelPassword != "pw" || f.ClientName != "d1" {
		t.Fatalf("options = %+v", f)
	}
	if want := []string{"s1:26379", "s2:26380", "[::1]:26381"}; !slices.Equal(f.SentinelAddrs, want) || !slices.Equal(o.Addrs(), want) {
		t.Fatalf("sentinels = %v, want %v", f.SentinelAddrs, want)
	}
	o, err = redisconn.Parse(redisconn.Config{URL: "rediss+sentinel://:pw@s1:26379/m?sentinel_password=other"})
	if err != nil {
		t.Fatal(err)
	}
	if f := o.Failover; f.DB != 0 || f.Password != "pw" || f.SentinelPassword != "other" || f.TLSConfig == nil {
		t.Fatalf("options = %+v", f)
	}
}

func TestParseCluster(t *testing.T) {
	o, err := redisconn.Parse(redisconn.Config{URL: "redis+cluster://n1:7000,n2:7001,n3:7002?max_redirects=5"})
	if err != nil {
		t.Fatal(err)
	}
	c := o.Cluster
	if o.Kind != redisconn.Cluster || !slices.Equal(c.Addrs, []string{"n1:7000", "n2:7001", "n3:7002"}) || c.MaxRedirects != 5 {
		t.Fatalf("options = %+v", c)
	}
	if _, ok := o.NewClient().(*redis.ClusterClient); !ok {
		t.Fatal("a cluster URL does not build a cluster client")
	}
}

func TestParseErrors(t *testing.T) {
	for _, u := range []string{
		"",
		"http://h:1",
		"redis+mesh://h:1",
		"redis+sentinel://s1:26379",     // no master
		"redis+sentinel://s1/m",         // no port
		"redis+sentinel://s1:1,,s2:2/m", // empty address
		"redis+cluster://n1:7000/1",
		"redis://a:1,b:2/0",               // a list needs a topology       // a db on a cluster
		"redis://h:1?no_such_option=1",    // unknown option
		"redis://h:1?sentinel_password=x", // unknown to a single server
		"redis+cluster://n:1?sentinel_password=x",
		"redis://u:topsecret@h:1/notanumber", // must not echo the password
	} {
		_, err := redisconn.Parse(redisconn.Config{URL: u})
		if !errors.Is(err, redisconn.ErrInvalidURL) {
			t.Errorf("Parse(%q) = %v, want ErrInvalidURL", u, err)
			continue
		}
		if strings.Contains(err.Error(), "topsecret") {
			t.Errorf("error echoes the password: %v", err)
		}
	}
}

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"redis://u:pw@h:1/0": "redis://u:xxxxx@h:1/0",
		"redis://h:1":        "redis://h:1",
		"redis+sentinel://:pw@a:1,b:2/m?sentinel_password=s": "redis+sentinel://:xxxxx@a:1,b:2/m?sentinel_password=xxxxx",
	} {
		if got := redisconn.Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestOpenSingle(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c, err := redisconn.Open(redisconn.Config{URL: "redis://" + srv.Addr + "/0", ClientName: "redisconn-test"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Set(t.Context(), "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if name, err := c.ClientGetName(t.Context()).Result(); err != nil || name != "redisconn-test" {
		t.Fatalf("client name = %q, %v", name, err)
	}
}

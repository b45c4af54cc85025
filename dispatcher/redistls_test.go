package dispatcher_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/mlsched/mlsched/dispatcher"
	"github.com/mlsched/mlsched/shared/natstest"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/redisconn"
	"github.com/mlsched/mlsched/shared/redistest"
	"github.com/mlsched/mlsched/shared/tlstest"
)

// The dispatcher keeps its statistics in a redis-server that speaks only TLS
// and requires a client certificate, given rediss:// and
// MLSCHED_REDIS_CA/_CERT/_KEY: the store is healthy and the statistics of
// a task it ran are in that server.
func TestRedissStatisticsStore(t *testing.T) {
	t.Parallel()
	f := tlstest.New(t)
	r := redistest.StartTLS(t, f, true)
	url := "rediss://" + r.Addr + "/0"
	e := newEnv(t, func(c *dispatcher.Config) {
		c.RedisURL, c.RedisCA, c.RedisCert, c.RedisKey = url, f.CA, f.ClientCert, f.ClientKey
	})
	e.startNode("n1", []string{"echo"}, map[string]behavior{"m1": succeed})
	e.submit(protocol.Task{ID: "tls1", Type: "echo"})
	if res := e.result("tls1"); res.Status != protocol.StatusSucceeded {
		t.Fatalf("result %+v", res)
	}
	e.waitFor("a healthy Redis store that counts the task", func() bool {
		rep := e.d.Report()
		if rep.Store != "redis" || rep.Degraded {
			return false
		}
		for _, m := range rep.Models {
			if m.Name == "m1" && m.Successes == 1 {
				return true
			}
		}
		return false
	})
	c, err := redisconn.Open(redisconn.Config{URL: url, CA: f.CA, Cert: f.ClientCert, Key: f.ClientKey})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if n, err := c.HLen(ctx, "mlsched:{stats}:g").Result(); err != nil || n == 0 {
		t.Fatalf("gauges in the TLS server: %d fields, %v", n, err)
	}
}

// Without the client certificate the TLS server requires, the dispatcher
// stops at start with an error naming the variables to check, instead of
// running degraded for ever.
func TestRedissWithoutClientCertificateExits(t *testing.T) {
	t.Parallel()
	f := tlstest.New(t)
	r := redistest.StartTLS(t, f, true)
	ns := natstest.New(t)
	cfg := testConfig(ns.URL)
	cfg.RedisURL, cfg.RedisCA = "rediss://"+r.Addr+"/0", f.CA
	d, err := dispatcher.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- d.Run(t.Context()) }()
	select {
	case err := <-done:
		if !errors.Is(err, redisconn.ErrTLS) || !strings.Contains(err.Error(), "MLSCHED_REDIS_CERT") {
			t.Fatalf("Run = %v, want the TLS refusal naming MLSCHED_REDIS_CERT", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the dispatcher did not stop")
	}
}

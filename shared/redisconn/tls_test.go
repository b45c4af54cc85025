package redisconn_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/mlsched/mlsched/shared/redisconn"
	"github.com/mlsched/mlsched/shared/redistest"
	"github.com/mlsched/mlsched/shared/tlstest"
)

// rediss:// against a real redis-server that speaks only TLS, with a CA the
// test made: the client certificate and CA of MLSCHED_REDIS_CERT/_KEY/_CA
// get in; without the client certificate (the server requires one), or
// without the CA (the server is not trusted), the connection is refused.
// With client authentication off, the CA alone is enough.
func TestRedissAgainstTLSServer(t *testing.T) {
	t.Parallel()
	f := tlstest.New(t)
	mtls := redistest.StartTLS(t, f, true)
	plain := redistest.StartTLS(t, f, false)
	ping := func(cfg redisconn.Config) error {
		t.Helper()
		c, err := redisconn.Open(cfg)
		if err != nil {
			t.Fatalf("open %+v: %v", cfg, err)
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := redisconn.Ping(ctx, c); err != nil {
			return err
		}
		if err := c.Set(ctx, "mlsched:k", "v", 0).Err(); err != nil {
			return err
		}
		if v, err := c.Get(ctx, "mlsched:k").Result(); err != nil || v != "v" {
			t.Fatalf("get = %q, %v", v, err)
		}
		return nil
	}
	url := "rediss://" + mtls.Addr + "/0"
	if err := ping(redisconn.Config{URL: url, CA: f.CA, Cert: f.ClientCert, Key: f.ClientKey}); err != nil {
		t.Fatalf("with the CA and a client certificate: %v", err)
	}
	if err := ping(redisconn.Config{URL: url, CA: f.CA}); !errors.Is(err, redisconn.ErrTLS) {
		t.Fatalf("without a client certificate: %v, want the server's refusal (ErrTLS)", err)
	}
	if err := ping(redisconn.Config{URL: url, Cert: f.ClientCert, Key: f.ClientKey}); !errors.Is(err, redisconn.ErrTLS) {
		t.Fatalf("without the CA: %v, want an untrusted server (ErrTLS)", err)
	}
	if err := ping(redisconn.Config{URL: "redis://" + mtls.Addr + "/0"}); err == nil {
		t.Fatal("a plain connection got in")
	}
	if err := ping(redisconn.Config{URL: "rediss://" + plain.Addr + "/0", CA: f.CA}); err != nil {
		t.Fatalf("client authentication off, with the CA: %v", err)
	}
}

package redisconn_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/mlsched/mlsched/shared/redisconn"
	"github.com/mlsched/mlsched/shared/tlstest"
)

func TestTLSAndPasswordFileOptions(t *testing.T) {
	f := tlstest.New(t)
	c, err := redisconn.Open(redisconn.Config{URL: "rediss://u@127.0.0.1:6380/0", CA: f.CA, Cert: f.ClientCert, Key: f.ClientKey})
	if err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
	for _, bad := range []redisconn.Config{
		{URL: "redis://127.0.0.1:1/0", CA: f.CA},                     // TLS files on a plain URL
		{URL: "rediss://127.0.0.1:1/0", Cert: f.ClientCert},          // cert without key
		{URL: "rediss://127.0.0.1:1/0", CA: f.ClientKey},             // not a certificate
		{URL: "redis://127.0.0.1:1/0", PasswordFile: "/nonexistent"}, // missing password file
	} {
		if _, err := redisconn.Open(bad); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
	if !redisconn.IsAuthError(errors.New("WRONGPASS invalid username-password pair or user is disabled.")) ||
		redisconn.IsAuthError(errors.New("dial tcp: connection refused")) {
		t.Fatal("IsAuthError misclassifies")
	}
	if s := redisconn.Redact("redis://u:hunter2@h:1/0"); strings.Contains(s, "hunter2") {
		t.Fatal(s)
	}
}
